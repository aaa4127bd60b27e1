package embedded

import (
	"fmt"
	"sync"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"
)

// Logger adapts a zerolog.Logger to server.Logger: notices log at info, warnings at warn, errors
// at error, debug at debug and traces at trace. Start and StartCluster add a server field naming
// the node. A fatal error logs at error with fatal=true and,
// unlike nats-server's own logger, never exits the process: Start and StartCluster report it as
// their error instead.
type Logger struct {
	log zerolog.Logger

	mu    sync.Mutex
	fatal error // the first Fatalf, if any
}

var _ server.Logger = (*Logger)(nil)

// NewLogger returns a Logger writing to log.
func NewLogger(log zerolog.Logger) *Logger {
	return &Logger{log: log}
}

// Noticef logs at info level.
func (l *Logger) Noticef(format string, v ...any) { l.log.Info().Msgf(format, v...) }

// Warnf logs at warn level.
func (l *Logger) Warnf(format string, v ...any) { l.log.Warn().Msgf(format, v...) }

// Errorf logs at error level.
func (l *Logger) Errorf(format string, v ...any) { l.log.Error().Msgf(format, v...) }

// Debugf logs at debug level.
func (l *Logger) Debugf(format string, v ...any) { l.log.Debug().Msgf(format, v...) }

// Tracef logs at trace level.
func (l *Logger) Tracef(format string, v ...any) { l.log.Trace().Msgf(format, v...) }

// Fatalf logs at error level with fatal=true and remembers the first fatal error. It does not
// exit: the server stops what it was doing (for example starting JetStream) and Start reports it.
func (l *Logger) Fatalf(format string, v ...any) {
	msg := fmt.Sprintf(format, v...)
	l.log.Error().Bool("fatal", true).Msg(msg)
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fatal == nil {
		l.fatal = fmt.Errorf("%w: %s", ErrFatal, msg)
	}
}

// err returns the first fatal error logged, or nil.
func (l *Logger) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.fatal
}

// levels reports whether log would write debug and trace messages, so that the server does not
// produce them for nothing.
func levels(log zerolog.Logger) (debug, trace bool) {
	return enabled(log.Debug()), enabled(log.Trace())
}

func enabled(e *zerolog.Event) bool {
	ok := e.Enabled()
	e.Discard()
	return ok
}
