package member

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/member/feed"
)

// Defaults of Config.
const (
	// DefaultGrace is the lease grace: a member resumes by itself this long
	// after the deadline of the last phase it accepted.
	DefaultGrace = 10 * time.Minute
	// DefaultPollEvery is how often a waiting prepare asks the participant
	// again without a Notify.
	DefaultPollEvery = time.Second
)

// Consumer settings (PROTOCOL §3).
const (
	// AckWait is how long the server waits for a phase message to be
	// acknowledged before it delivers it again; handlers that take longer
	// send InProgress every third of it.
	AckWait = 30 * time.Second
	// MaxAckPending is how many phase messages may be unacknowledged at
	// once, so that a resume arrives while a prepare still waits.
	MaxAckPending = 256
	// ConsumerInactiveThreshold is how long the server keeps a member's
	// durable consumer after the last process using it went away; a member
	// restarted within it resumes where it was.
	ConsumerInactiveThreshold = time.Hour
	// callTimeout bounds one call to the bus.
	callTimeout = 10 * time.Second
)

// Config configures a Member.
type Config struct {
	// Run is the run id. Required.
	Run string
	// Member is this member's name, <kind>.<name>; kind agent, owner or
	// sandbox. Required.
	Member events.Member
	// Conn is the connection; optional, JS.Conn() when nil.
	Conn *nats.Conn
	// JS is the JetStream context the member uses. Required; make it with
	// jetstream.New, whose async ack timeout frees acks that never come.
	JS natsjs.JetStream
	// Bus is the provisioned bus (jetstream.Open on JS). Required, but
	// with NoPull: a sandbox's own user cannot open it (jetstream.Open
	// reads every stream's info), and such a member reads what it reads by
	// direct gets whose subjects name it.
	Bus *jetstream.Bus
	// Participant is what the member drives. Required. Its optional
	// abilities (Exporter, Resumer or Continuer, Installer, Retirer,
	// Forgetter, Releaser, Parker) are found by type assertion.
	Participant Participant
	// Logger receives the member's logs; the zero value discards them.
	Logger zerolog.Logger
	// Grace is the lease grace (default DefaultGrace).
	Grace time.Duration
	// PollEvery is how often a waiting prepare polls (default
	// DefaultPollEvery).
	PollEvery time.Duration
	// Capabilities say what the member can do, as in events.MemberJoined.
	Capabilities []string
	// StateFile, when set, makes the member read the run's phases on the
	// core feed (feed.Core) and keep its position in this file: a
	// core-NATS subscription instead of a consumer, catching up from the
	// stream by direct get (next by subject, from after the position the
	// file holds) when it starts, after every reconnect, and when a phase's
	// sequence is past the next one (PROTOCOL §3): the stream then has no
	// consumer per member, whatever the number of sandbox daemons. A
	// restarted process resumes after the last event it handled. Events are
	// never redelivered by the server; one given back is delivered again
	// locally. Its user must subscribe to the run's phases (and the
	// committed outcomes, for a participant that parks) and direct-get from
	// the stream (docs/PERMISSIONS.md); it creates no consumer.
	StateFile string
	// NoPull is for a member whose user makes no consumer and reads no
	// stream's info, and whose direct gets must name their subject: a
	// sandbox with a user of its own (docs/PERMISSIONS.md). It needs
	// StateFile: the core feed's catch-up then reads the newest of the
	// run's phases instead, and only when more than that was missed the
	// newest of each phase kind, acting on those a member must not miss
	// (PROTOCOL §3, Consumers); and, for a participant that parks, the
	// newest committed outcome. Its heartbeat's TTL is its kind's default
	// (jetstream.DefaultHeartbeatTTL: such a user cannot read its bucket's,
	// which the bucket's info holds), and Bus may be nil when the
	// participant neither exports nor installs records (a sandbox daemon).
	NoPull bool
	// Source, when set, feeds the member the run's events instead of a
	// consumer of its own: a process that hosts many members keeps one
	// consumer for all of them (PROTOCOL §3). StateFile is then unused.
	Source feed.Source
	// AdoptEpoch, when not 0, starts the member as having served that
	// epoch: a sandbox daemon that a restore adopts with its running
	// launches (a process-keeping fork re-identified in place, PROTOCOL §5's
	// one exception) moves to the restore's epoch before any phase. Phases
	// of older epochs are then ignored, a newer epoch supersedes it, and it
	// is never restored into, as any member that served. Only sandbox
	// members may be adopted; every other member takes its epoch from the
	// phases.
	AdoptEpoch uint64
	// Now tells the time (default time.Now). The driver's timers (lease,
	// prepare reply time, polling) wait on the real clock for the durations
	// it computes with Now; the phase machine itself takes time as input.
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if c.Conn == nil && c.JS != nil {
		c.Conn = c.JS.Conn()
	}
	if c.Grace == 0 {
		c.Grace = DefaultGrace
	}
	if c.PollEvery == 0 {
		c.PollEvery = DefaultPollEvery
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports every unusable field, joined, each wrapping
// ErrInvalidConfig and naming the field. Call it after defaults (New does).
func (c Config) Validate() error {
	var errs []error
	field := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: Config."+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if err := events.ValidateRun(c.Run); err != nil {
		field("Run: %v", err)
	}
	if err := c.Member.Validate(); err != nil {
		field("Member: %v", err)
	} else if c.Member.Kind() == events.KindBridge {
		field("Member %s: a bridge does not run the member runtime", c.Member)
	}
	if c.JS == nil {
		field("JS: required")
	} else if c.Conn != nil && c.JS.Conn() != c.Conn {
		field("Conn: not the connection of JS")
	}
	switch {
	case c.Bus == nil && c.NoPull:
	case c.Bus == nil:
		field("Bus: required")
	case c.Bus.Stream == nil || c.Bus.Members == nil || c.Bus.Daemons == nil || c.Bus.Manifests == nil || c.Bus.Records == nil:
		field("Bus: needs Stream, Members, Daemons, Manifests and Records (use jetstream.Open)")
	}
	if c.Participant == nil {
		field("Participant: required")
	}
	if c.Grace < 0 {
		field("Grace %s: must not be negative", c.Grace)
	}
	if c.PollEvery < 0 {
		field("PollEvery %s: must not be negative", c.PollEvery)
	}
	if len(c.Capabilities) > 0 && events.ValidateRun(c.Run) == nil && c.Member.Validate() == nil {
		if err := (events.MemberJoined{Run: c.Run, Member: c.Member, Capabilities: c.Capabilities}).Validate(); err != nil {
			field("Capabilities: %v", err)
		}
	}
	if c.Source != nil && c.StateFile != "" {
		field("StateFile: a member fed by a Source keeps no position of its own")
	}
	if c.NoPull && c.StateFile == "" {
		field("NoPull: needs a StateFile: a user that makes no consumer reads its phases on the core feed")
	}
	if c.NoPull && c.Bus == nil && c.Participant != nil {
		_, exports := c.Participant.(Exporter)
		if _, installs := c.Participant.(Installer); exports || installs {
			field("Bus: required for %T, which exports or installs records", c.Participant)
		}
	}

	if c.Now == nil {
		field("Now: required")
	}
	if c.AdoptEpoch != 0 && c.Member.Validate() == nil && c.Member.Kind() != events.KindSandbox {
		field("AdoptEpoch: only a sandbox daemon is adopted into an epoch, not %s", c.Member)
	}
	return errors.Join(errs...)
}

// ConsumerName returns the name of a member's durable consumer: sp_, the
// run, _, the member's kind, _, its name, with every _ inside the run and
// the name doubled, so that no two (run, member) pairs share a name.
// Consumer names cannot contain dots.
func ConsumerName(run string, m events.Member) string {
	esc := func(s string) string { return strings.ReplaceAll(s, "_", "__") }
	return "sp_" + esc(run) + "_" + string(m.Kind()) + "_" + esc(m.Name())
}

// DurableConfig returns the configuration of the one durable consumer of a
// member process (PROTOCOL §3), named name: the run's phases, its one
// filter, explicit acks, state in memory (a file-state durable costs a
// disk write per ack), delivering what is published from its creation on.
// With one filter its create subject names it, and a member's own user may
// create its consumer with that filter only (docs/PERMISSIONS.md): the
// committed outcomes a stop commit parks on come on a core subscription
// (feed.Durable). A Source that feeds many members starts from it too.
func DurableConfig(run, name, description string) natsjs.ConsumerConfig {
	return natsjs.ConsumerConfig{
		Durable:           name,
		Description:       description,
		FilterSubject:     events.PhaseFilter(run),
		DeliverPolicy:     natsjs.DeliverNewPolicy,
		AckPolicy:         natsjs.AckExplicitPolicy,
		AckWait:           AckWait,
		MaxAckPending:     MaxAckPending,
		InactiveThreshold: ConsumerInactiveThreshold,
		MemoryStorage:     true,
	}
}
