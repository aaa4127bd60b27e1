package bridge

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/jetstream"
)

// Defaults of Config.
const (
	DefaultName          = "main"
	DefaultPhaseTimeout  = 30 * time.Second
	DefaultResumeTimeout = 5 * time.Second
)

// ErrInvalidConfig is returned (wrapped, one error per field, joined) by
// Config.Validate.
var ErrInvalidConfig = errors.New("bridge: invalid config")

// Config configures a bridge.
type Config struct {
	// Run is the run id. Required.
	Run string
	// Name is the bridge's member name half: it publishes as bridge.<Name>
	// (default "main").
	Name string
	// Conn is the NATS connection; JS and Bus are JetStream on it (from
	// jetstream.New, whose async ack timeout frees acks that never come)
	// and the provisioned bus. Required.
	Conn *nats.Conn
	JS   natsjs.JetStream
	Bus  *jetstream.Bus
	// LiveConn, when set, is the connection the live copies of phases go
	// out on (PROTOCOL §3, live phases) and the resume acks come in on:
	// the server delivers a copy to every sandbox daemon before it reads
	// the next message of its connection, and a fleet's resume acks come
	// at once, 10,000 each at 10,000 daemons; on a connection of their
	// own they hold up nothing else the bridge asks. Default: Conn.
	LiveConn *nats.Conn
	// Logger receives structured logs (the zero value discards them).
	Logger zerolog.Logger
	// PhaseTimeout is the default deadline of a prepare, commit, restore,
	// retire, forget or release, from its publish (default 30 s).
	PhaseTimeout time.Duration
	// ResumeTimeout bounds the wait for resume acks, which are reported
	// but never block the result: a member that misses a resume reopens
	// when its lease runs out (default 5 s).
	ResumeTimeout time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Metrics, when set, receives the bridge's metrics (phase durations,
	// outcomes, acks, relay held calls) and is served on the API's
	// /metrics; nil turns them off.
	Metrics *metrics.Set
}

func (c *Config) setDefaults() {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.PhaseTimeout == 0 {
		c.PhaseTimeout = DefaultPhaseTimeout
	}
	if c.ResumeTimeout == 0 {
		c.ResumeTimeout = DefaultResumeTimeout
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports every problem of c, each naming the field.
func (c Config) Validate() error {
	var errs []error
	if err := events.ValidateRun(c.Run); err != nil {
		errs = append(errs, fmt.Errorf("%w: Config.Run: %w", ErrInvalidConfig, err))
	}
	if _, err := events.NewMember(events.KindBridge, c.Name); err != nil {
		errs = append(errs, fmt.Errorf("%w: Config.Name: %w", ErrInvalidConfig, err))
	}
	if c.Conn == nil || c.JS == nil || c.Bus == nil {
		errs = append(errs, fmt.Errorf("%w: Config.Conn, JS and Bus are required", ErrInvalidConfig))
	}
	if c.PhaseTimeout < 0 || c.ResumeTimeout < 0 {
		errs = append(errs, fmt.Errorf("%w: Config.PhaseTimeout and ResumeTimeout must not be negative", ErrInvalidConfig))
	}
	return errors.Join(errs...)
}
