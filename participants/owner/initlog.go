package owner

import (
	"bytes"
	"encoding/json"
	"io"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// initLogLine bounds one line of a sandbox's init output in the owner's
// log; the rest of a longer line is dropped.
const initLogLine = 4 << 10

// initLogBudget is how many bytes of a sandbox's init output the owner
// logs a minute: the workload in the sandbox may be able to write to its
// daemon's output, and must not be able to flood the owner's log. What is
// over is dropped and counted.
const initLogBudget = 256 << 10

// initOutput returns the writer a sandbox's init (its sandboxd) writes its
// stdout and stderr to: each line goes to the owner's log, naming the
// sandbox. A daemon's own JSON log line is kept whole under "daemon", at
// debug unless it warns or worse; anything else (a daemon that could not
// start says why in plain text, a panic) is logged as a warning. Without
// it a sandbox whose daemon died at start left no word of why.
func (o *Owner) initOutput(sandbox string) io.Writer {
	return &initLog{log: o.log.With().Str("sandbox", sandbox).Logger(), now: time.Now}
}

// initLog splits what a sandbox's init writes into lines for the log.
type initLog struct {
	log     zerolog.Logger
	mu      sync.Mutex
	partial []byte
	long    bool // the line in partial went past initLogLine
	now     func() time.Time
	window  time.Time // the start of the minute budget counts in
	spent   int       // bytes logged in the window
	dropped int       // lines over budget in the window
}

func (l *initLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		if room := initLogLine - len(l.partial); len(chunk) > room {
			chunk, l.long = chunk[:max(room, 0)], true
		}
		l.partial = append(l.partial, chunk...)
		if i < 0 {
			break
		}
		l.emit(l.partial, l.long)
		l.partial, l.long = l.partial[:0], false
		p = p[i+1:]
	}
	return n, nil
}

// emit logs one line of output, within the budget.
func (l *initLog) emit(line []byte, cut bool) {
	line = bytes.TrimRight(line, "\r")
	if len(bytes.TrimSpace(line)) == 0 {
		return
	}
	if now := l.now(); now.Sub(l.window) >= time.Minute {
		if l.dropped > 0 {
			l.log.Warn().Int("lines", l.dropped).Int("budget_bytes", initLogBudget).Msg("sandbox init wrote more than the owner logs a minute; lines dropped")
		}
		l.window, l.spent, l.dropped = now, 0, 0
	}
	if l.spent += len(line); l.spent > initLogBudget {
		l.dropped++
		return
	}
	var head struct {
		Level string `json:"level"`
	}
	if !cut && json.Unmarshal(line, &head) == nil {
		lvl, err := zerolog.ParseLevel(head.Level)
		if err != nil || lvl < zerolog.WarnLevel {
			lvl = zerolog.DebugLevel
		}
		l.log.WithLevel(lvl).RawJSON("daemon", line).Msg("sandbox daemon")
		return
	}
	l.log.Warn().Bytes("output", line).Bool("cut", cut).Msg("sandbox init wrote")
}
