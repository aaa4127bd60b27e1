package owner

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// DefaultSnapshotParallelism is how many snapshots (and forks) run at once
// when Config.SnapshotParallelism is 0.
const DefaultSnapshotParallelism = 16

// Sentinel errors.
var (
	// ErrInvalidConfig is wrapped by every Config.Validate and New error;
	// the message names the field.
	ErrInvalidConfig = errors.New("owner: invalid config")
	// ErrNoSandbox is returned by RequireSandbox and EndSession for a
	// session without a sandbox; an HTTP front answers 409 Conflict.
	ErrNoSandbox = errors.New("owner: session has no sandbox")
	// ErrSessionExists is returned by StartSession for a session id that
	// is already tracked or being started.
	ErrSessionExists = errors.New("owner: session already exists")
	// ErrAdmissionClosed is what the service answers (409
	// admission_closed) to a request that arrives while a checkpoint is
	// open: the caller retries after the resume. The Go API waits instead.
	ErrAdmissionClosed = errors.New("owner: admission closed by an open checkpoint")
	// ErrSetup is returned (wrapped) by StartSession when the setup failed
	// or returned something other than a JSON object; the sandbox was
	// stopped and nothing is tracked.
	ErrSetup = errors.New("owner: session setup failed")
	// ErrRecord is returned (wrapped, naming the record) by Install for a
	// malformed record; nothing was installed or forked.
	ErrRecord = errors.New("owner: malformed record")
	// ErrRestartOnly is returned by Install when an owner that does not
	// export gets records to install.
	ErrRestartOnly = errors.New("owner: restart_only owner cannot install records")
	// ErrNoClock is returned (wrapped) by SetClock when the provider
	// cannot set a sandbox's clock (no ClockSetter, or Caps.SetsClock
	// false); the service answers 409 clock_unavailable.
	ErrNoClock = errors.New("owner: the provider cannot set a sandbox's clock")
	// ErrBadTask is returned (wrapped) by SeedSession when the task kind
	// refused the task payload; the service answers 400 bad_request.
	ErrBadTask = errors.New("owner: task refused by its kind")
	// ErrNoExec is returned (wrapped) by the Execer a task kind gets when
	// the provider cannot run commands (it is not an Execer).
	ErrNoExec = errors.New("owner: provider cannot run commands")
	// ErrSnapshot is returned (wrapped, naming the sandbox and session) by
	// Export when a sandbox's snapshot failed twice: once, and once more
	// after the partial snapshot was deleted. The export then fails and
	// deletes the snapshots it took; the commit fails on this owner.
	ErrSnapshot = errors.New("owner: snapshot failed twice")
)

// Mode is how the owner takes part in checkpoints, decided by New.
type Mode int

// The modes.
const (
	// ModeOff: checkpointing is off; Run joins no bus.
	ModeOff Mode = iota
	// ModeRestartOnly: sessions are not captured; a prepare reports them
	// as restarts.
	ModeRestartOnly
	// ModeExported: a commit snapshots every session's sandbox.
	ModeExported
)

// String returns the mode's protocol name.
func (m Mode) String() string {
	switch m {
	case ModeOff:
		return "off"
	case ModeRestartOnly:
		return "restart_only"
	case ModeExported:
		return "exported"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Config configures an Owner.
type Config struct {
	// Run is the run id. Required.
	Run string
	// Name is the owner's name; the member is owner.<Name>. Required.
	Name string
	// JS is the JetStream context (from jetstream.New). Required with
	// Checkpointing.
	JS natsjs.JetStream
	// Bus is the provisioned bus; its Snapshots bucket is the snapshot
	// index. Required with Checkpointing.
	Bus *jetstream.Bus
	// Provider runs the sandboxes. Required. The exported mode needs it to
	// be a Snapshotter too; a Lister and an Execer are used when it is one.
	Provider Provider
	// Checkpointing turns checkpoints on; false (the default) is ModeOff.
	Checkpointing bool
	// LendsSandboxes tells whether the owner lends sandboxes to agents; an
	// owner that does not runs restart_only.
	LendsSandboxes bool
	// StateDir is the checkpoint state directory (absolute); required in
	// ModeExported.
	StateDir string
	// Workers is the number of worker processes serving the owner's
	// sessions (default 1); ModeExported requires 1, since release and
	// park do not reach other workers.
	Workers int
	// SnapshotParallelism bounds concurrent snapshots and forks (default
	// DefaultSnapshotParallelism).
	SnapshotParallelism int
	// TaskKind is the kind of task the owner serves: the sandbox of a
	// seeded session, its setup, its grade, the spec of a restored fork.
	// Nil serves sandboxes of the zero spec, sets nothing up and grades
	// every session {} (TaskFuncs{}).
	TaskKind TaskKind
	// Logger receives the owner's logs; the zero value discards them.
	Logger zerolog.Logger
	// SandboxCreds, when set, are the users of its sandboxes, which Run
	// renews while they live (the task kind's SandboxdConfig.Creds).
	SandboxCreds *SandboxCreds
	// Grace is the member's lease grace (default member.DefaultGrace).
	Grace time.Duration
	// Metrics, when set, receives the owner's metrics: each snapshot's and
	// fork's duration and bytes. nil: off.
	Metrics *metrics.Set
	// Images resolves the image a spec names (ImageRef) before its sandbox
	// is made (*image.Cache). nil: a spec naming an image is refused
	// (ErrBadTask). On New, the owner releases the seed holds an earlier
	// process of it left (see resolveImage).
	Images ImageResolver
}

func (c *Config) setDefaults() {
	if c.Workers == 0 {
		c.Workers = 1
	}
	if c.SnapshotParallelism == 0 {
		c.SnapshotParallelism = DefaultSnapshotParallelism
	}
}

// Validate reports every unusable field, joined, each wrapping
// ErrInvalidConfig and naming the field. It checks what every mode needs;
// New checks the exported mode's StateDir and Workers once it has decided
// the mode.
func (c Config) Validate() error {
	var errs []error
	field := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: Config."+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if err := events.ValidateRun(c.Run); err != nil {
		field("Run: %v", err)
	}
	if _, err := events.NewMember(events.KindOwner, c.Name); err != nil {
		field("Name: %v", err)
	}
	if c.Checkpointing && c.JS == nil {
		field("JS: required with checkpointing")
	}
	if c.Checkpointing && (c.Bus == nil || c.Bus.Snapshots == nil) {
		field("Bus: required with checkpointing, with its Snapshots bucket (use jetstream.Open)")
	}
	if c.Provider == nil {
		field("Provider: required")
	}
	if c.Workers < 0 {
		field("Workers %d: must not be negative", c.Workers)
	}
	if c.SnapshotParallelism < 0 {
		field("SnapshotParallelism %d: must not be negative", c.SnapshotParallelism)
	}
	if c.StateDir != "" && !filepath.IsAbs(c.StateDir) {
		field("StateDir %q: must be absolute", c.StateDir)
	}
	if c.Grace < 0 {
		field("Grace %s: must not be negative", c.Grace)
	}
	return errors.Join(errs...)
}

// decideMode returns the mode cfg runs in, and whether the provider's lack
// of snapshots decided it.
func decideMode(cfg Config) (m Mode, noSnapshot bool) {
	sn, canSnapshot := cfg.Provider.(Snapshotter)
	switch {
	case !cfg.Checkpointing:
		return ModeOff, false
	case !cfg.LendsSandboxes:
		return ModeRestartOnly, false
	case !canSnapshot || !sn.Caps().Snapshot:
		return ModeRestartOnly, true
	}
	return ModeExported, false
}

// Owner is the sandbox owner. Create it with New; its methods are safe for
// concurrent use.
type Owner struct {
	cfg    Config
	log    zerolog.Logger
	mode   Mode
	member *member.Member // nil in ModeOff
	kind   TaskKind
	snap   Snapshotter // nil when the provider is not one
	exec   Execer      // the provider, or noExec

	mu       sync.Mutex
	sessions map[string]*Session
	pending  map[string]events.Episode // sessions being started
	// startEnd has a channel per session being started, closed when
	// its start ends: a repeated seed waits on it (SeedSession).
	startEnd map[string]chan struct{}
	inFlight map[uint64]string        // request -> session id
	grading  map[string]int           // session id -> grades running
	verifies map[string]*verifyFlight // session id -> its verify running, or just answered
	graded   map[string]*graded       // session id -> the verdict of its verify, which ended it
	// stopping are the sandboxes an end is stopping: their init's exit is
	// the stop's, not a daemon that died (watchInits).
	stopping map[string]bool
	nextReq  uint64
	closed   bool          // admission closed by a prepare
	reopen   chan struct{} // closed by the resume that reopens admission
	// bounds are the provider's (Bounded): starting counts the sandboxes
	// starting, and freed is closed (and made again) when one is done or a
	// session ends, for the starts waiting their turn (admission.go).
	bounds   provider.Bounds
	starting int
	freed    chan struct{}
	// fresh counts the grades' own sandboxes (GradeSandboxes.Fresh);
	// nextFresh numbers them.
	fresh     int
	nextFresh uint64
	seeds     atomic.Uint64 // numbers the seed holds of images (resolveImage)
}

// New checks cfg, decides the mode (see the package doc) and returns an
// owner ready to Run.
func New(cfg Config) (*Owner, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	name, _ := events.NewMember(events.KindOwner, cfg.Name)
	log := cfg.Logger.With().Str("run", cfg.Run).Str("member", string(name)).Logger()
	mode, noSnap := decideMode(cfg)
	if mode == ModeExported {
		var errs []error
		if cfg.StateDir == "" {
			errs = append(errs, fmt.Errorf("%w: Config.StateDir: required by the exported mode", ErrInvalidConfig))
		}
		if cfg.Workers != 1 {
			errs = append(errs, fmt.Errorf("%w: Config.Workers %d: the exported mode needs exactly 1 (release and park do not reach other workers)", ErrInvalidConfig, cfg.Workers))
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
	}
	if noSnap {
		log.Warn().Str("provider", cfg.Provider.Name()).Msgf("sandbox provider %q cannot snapshot; its rollouts restart after a crash instead of continuing", cfg.Provider.Name())
	}
	o := &Owner{
		cfg:      cfg,
		log:      log.With().Str("mode", mode.String()).Logger(),
		mode:     mode,
		kind:     cfg.TaskKind,
		exec:     noExec{provider: cfg.Provider.Name()},
		sessions: map[string]*Session{},
		stopping: map[string]bool{},
		pending:  map[string]events.Episode{},
		startEnd: map[string]chan struct{}{},
		inFlight: map[uint64]string{},
		grading:  map[string]int{},
		verifies: map[string]*verifyFlight{},
		graded:   map[string]*graded{},
		freed:    make(chan struct{}),
	}
	o.releaseSeedHolds()
	if b, ok := cfg.Provider.(Bounded); ok {
		o.bounds = b.Bounds()
		o.log.Info().Int("starting", o.bounds.Starting).Int("live", o.bounds.Live).Msg("the provider's bounds: starts beyond them wait their turn")
	}
	if o.kind == nil {
		o.kind = TaskFuncs{}
	}
	if sn, ok := cfg.Provider.(Snapshotter); ok {
		o.snap = sn
	}
	if x, ok := cfg.Provider.(Execer); ok {
		o.exec = x
	}
	if mode != ModeOff {
		m, err := member.New(member.Config{
			Run: cfg.Run, Member: name, JS: cfg.JS, Bus: cfg.Bus, Participant: o,
			Logger: cfg.Logger, Grace: cfg.Grace, Capabilities: providerCapabilities(cfg.Provider),
		})
		if err != nil {
			return nil, err
		}
		o.member = m
	}
	return o, nil
}

// providerCapabilities are the owner's member capabilities (its heartbeat
// and joined event carry them): the provider's name and what its snapshots
// keep, "provider:<name>", and with a Snapshotter "keeps_processes" when a
// fork resumes the snapshot's processes, "clock:<how>" for how a fork's
// clocks run (provider.ClockContinuous) and "sets_clock" when the provider
// can set a fork's clock to the host's.
func providerCapabilities(p Provider) []string {
	caps := []string{"provider:" + p.Name()}
	if sn, ok := p.(Snapshotter); ok {
		c := sn.Caps()
		if c.KeepsProcesses {
			caps = append(caps, "keeps_processes")
		}
		if c.Clock != "" {
			caps = append(caps, "clock:"+c.Clock)
		}
		if c.SetsClock {
			caps = append(caps, "sets_clock")
		}
	}
	return caps
}

// Mode returns the mode New decided.
func (o *Owner) Mode() Mode { return o.mode }

// Member returns the member runtime, nil in ModeOff.
func (o *Owner) Member() *member.Member { return o.member }

// Run runs the member runtime with the owner as its participant until ctx
// ends (see member.Member.Run for what it returns), and, when the provider
// is an InitWatcher, deletes the heartbeat of each sandbox daemon that
// dies (watchInits). In ModeOff it joins no bus and waits for ctx.
func (o *Owner) Run(ctx context.Context) error {
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	if c := o.cfg.SandboxCreds; c != nil {
		wg.Go(func() { c.Renew(rctx, o.log, o.liveSandboxes) })
	}
	if o.member == nil {
		<-ctx.Done()
		return nil
	}
	if w, ok := o.cfg.Provider.(InitWatcher); ok {
		wg.Go(func() { o.watchInits(rctx, w) })
	}
	return o.member.Run(ctx)
}

// liveSandboxes returns the sandboxes of the owner's sessions.
func (o *Owner) liveSandboxes() []*provider.Sandbox {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]*provider.Sandbox, 0, len(o.sessions))
	for _, s := range o.sessions {
		if s.Sandbox != nil {
			out = append(out, s.Sandbox)
		}
	}
	return out
}

// notify tells the member runtime that readiness may have changed.
func (o *Owner) notify() {
	if o.member != nil {
		o.member.Notify()
	}
}
