package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxclient"
)

var (
	// ErrParked is returned for a rollout that a checkpoint with stop
	// parked: its bookmark is in the checkpoint, and a restore continues
	// it.
	ErrParked = errors.New("agent: parked by a checkpoint with stop")
	// ErrBusy is returned for a request of a rollout whose other attempt
	// runs here.
	ErrBusy = errors.New("agent: another attempt of the rollout runs here")
	// ErrAttemptLost is returned for an attempt asked again (Request.SentTo)
	// that another process of the agent ran and this one holds nothing of.
	ErrAttemptLost = errors.New("agent: the attempt ran in another process of the agent")
	// ErrClosed is returned once the agent is stopping.
	ErrClosed = errors.New("agent: stopping")
	// ErrInvalidConfig is returned (wrapped, naming the field) by New.
	ErrInvalidConfig = errors.New("agent: invalid config")
	// errShutdown cancels runs when the agent stops or is superseded: like
	// a crash, it touches no shared state.
	errShutdown = errors.New("agent: shutting down")
)

// Defaults of Config.
const (
	DefaultConcurrency = 16
	DefaultMaxLaunches = 16
	DefaultReceiptWait = 10 * time.Second
	DefaultAskAgain    = 30 * time.Second
)

// Config configures an Agent.
type Config struct {
	// Run is the run id; Name the agent's name (member agent.<Name>).
	// Required.
	Run  string
	Name string
	// JS and Bus are the agent's JetStream (from jetstream.New) and bus.
	// Required.
	JS  natsjs.JetStream
	Bus *jetstream.Bus
	// Owner is the name of the sandbox owner that lends the sandboxes.
	// Required.
	Owner string
	// OwnerService is how the agent calls that owner (default: the owner's
	// service client on JS's connection).
	OwnerService Owner
	// SandboxService returns how the agent calls the daemon of a sandbox,
	// once per sandbox (default: a sandboxclient.Client on JS's connection).
	SandboxService func(sandboxID string) (Sandbox, error)
	// Adapter drives the harness. Required.
	Adapter Adapter
	// Concurrency is how many rollouts run at once (default
	// DefaultConcurrency); queued ones wait registered at their seed
	// bookmark, and parked ones keep their slots.
	Concurrency int
	// NoCheckpointing makes every rollout a restart: never parked, its
	// sandbox stopped at its end.
	NoCheckpointing bool
	// MaxLaunches bounds the launches of one attempt (default
	// DefaultMaxLaunches).
	MaxLaunches int
	// ReceiptWait is how long one wait for a launch's end may hold the
	// daemon's receipt endpoint (default DefaultReceiptWait).
	ReceiptWait time.Duration
	// AskAgain is how often a long request to the owner (a grade) still
	// unanswered is asked again (default DefaultAskAgain): core NATS
	// delivers at most once, and a request or its answer lost with the
	// owner's connection is a loss the agent's own connection never sees.
	AskAgain time.Duration
	// ModelURL is the model server's base URL as a sandbox reaches it:
	// on a provider whose snapshots keep processes the agent points each
	// sandbox's model relay at it (generation 1 before the first launch,
	// one higher after a restore) and gives the harness the relay's URL.
	// Empty: harnesses call the adapter's model URL directly, and every
	// restored launch relaunches.
	ModelURL string
	// ClockPolicy is what a restore does with a sandbox's wall clock
	// (ClockContinuous, the default: keep it continuous with the pause
	// when the pause froze the launch, else leave it; ClockHost: set it to
	// the host's time). Only a sandbox's own clock is ever set.
	ClockPolicy ClockPolicy
	// NoFreeze turns restore_sandbox_clock off: a hold pause does not
	// also freeze the launch, and a restore leaves the clock alone.
	NoFreeze bool
	// FreezeWait is how long a freezing hold waits for every process to
	// stop (checkpoint_freeze_wait_seconds; default
	// sandboxapi.DefaultFreezeWait).
	FreezeWait time.Duration
	// Grace and PollEvery are the member's (see member.Config).
	Grace     time.Duration
	PollEvery time.Duration
	// Logger receives structured logs.
	Logger zerolog.Logger
	// Metrics, when set, receives the agent's metrics: pauses by mode and
	// their durations, fallbacks to stop and relaunch, rebinds. nil: off.
	Metrics *metrics.Set
}

func (c *Config) validate() error {
	var errs []error
	if err := events.ValidateRun(c.Run); err != nil {
		errs = append(errs, fmt.Errorf("%w: Run: %w", ErrInvalidConfig, err))
	}
	if err := events.ValidateToken("Name", c.Name); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidConfig, err))
	}
	if err := events.ValidateToken("Owner", c.Owner); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrInvalidConfig, err))
	}
	if c.JS == nil || c.Bus == nil {
		errs = append(errs, fmt.Errorf("%w: JS and Bus are required", ErrInvalidConfig))
	}
	if c.Adapter == nil {
		errs = append(errs, fmt.Errorf("%w: Adapter is required", ErrInvalidConfig))
	}
	if c.Concurrency < 0 || c.MaxLaunches < 0 || c.ReceiptWait < 0 || c.AskAgain < 0 {
		errs = append(errs, fmt.Errorf("%w: Concurrency, MaxLaunches, ReceiptWait and AskAgain must not be negative", ErrInvalidConfig))
	}
	switch c.ClockPolicy {
	case "":
		c.ClockPolicy = ClockContinuous
	case ClockContinuous, ClockHost:
	default:
		errs = append(errs, fmt.Errorf("%w: ClockPolicy %q: want %s or %s", ErrInvalidConfig, c.ClockPolicy, ClockContinuous, ClockHost))
	}
	if c.FreezeWait < 0 {
		errs = append(errs, fmt.Errorf("%w: FreezeWait must not be negative", ErrInvalidConfig))
	}
	if c.FreezeWait == 0 {
		c.FreezeWait = sandboxapi.DefaultFreezeWait
	}
	if c.Concurrency == 0 {
		c.Concurrency = DefaultConcurrency
	}
	if c.MaxLaunches == 0 {
		c.MaxLaunches = DefaultMaxLaunches
	}
	if c.ReceiptWait == 0 {
		c.ReceiptWait = DefaultReceiptWait
	}
	if c.AskAgain == 0 {
		c.AskAgain = DefaultAskAgain
	}
	return errors.Join(errs...)
}

// Agent is the harness driver: a bus member whose work is rollouts.
type Agent struct {
	cfg     Config
	name    events.Member
	nc      *nats.Conn
	member  *member.Member
	owner   Owner
	acks    *ackBook
	daemons *daemonBook
	log     zerolog.Logger
	slots   chan struct{}

	mu        sync.Mutex
	running   bool          // Run has started: runs may start
	closed    bool          // admission closed by a checkpoint
	open      string        // that checkpoint
	reopen    chan struct{} // closed when admission reopens
	stopping  bool
	runs      map[string]*run              // by rollout id
	installed map[string]agentapi.Bookmark // by rollout id, restored and not yet asked for
	finished  map[string]*run              // by rollout id: the last ended runs, for a request asked again
	order     []*run                       // finished, oldest first
	sandboxes map[string]Sandbox           // by sandbox id
	wg        sync.WaitGroup

	trajMu       sync.Mutex         // guards trajectories
	trajectories natsjs.ObjectStore // its own trajectories store, once opened (trajectoryStore)
}

// New checks cfg and returns an agent ready to Run.
func New(cfg Config) (*Agent, error) {
	a, err := newAgent(cfg)
	if err != nil {
		return nil, err
	}
	a.member, err = member.New(member.Config{Run: cfg.Run, Member: a.name, JS: cfg.JS, Bus: cfg.Bus, Participant: a,
		Logger: cfg.Logger, Grace: cfg.Grace, PollEvery: cfg.PollEvery, Capabilities: capabilities(cfg)})
	if err != nil {
		return nil, err
	}
	cfg.Metrics.InitAgent(agentapi.RebindResumed, agentapi.RebindCollected, agentapi.RebindRelayGone,
		agentapi.RebindIdentityChanged, agentapi.RebindNotHolding, agentapi.RebindTakeoverFailed)
	return a, nil
}

// newAgent builds the agent without its member.
func newAgent(cfg Config) (*Agent, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	name, _ := events.NewMember(events.KindAgent, cfg.Name)
	nc := cfg.JS.Conn()
	if cfg.OwnerService == nil {
		oc, err := dialOwner(nc, cfg.Run, cfg.Owner)
		if err != nil {
			return nil, err
		}
		cfg.OwnerService = oc
	}
	if cfg.SandboxService == nil {
		cfg.SandboxService = func(id string) (Sandbox, error) { return sandboxclient.New(nc, cfg.Run, id) }
	}
	a := &Agent{cfg: cfg, name: name, nc: nc, owner: cfg.OwnerService, acks: newAckBook(cfg.Run),
		daemons: newDaemonBook(cfg.Run),
		log:     cfg.Logger.With().Str("run", cfg.Run).Str("member", string(name)).Logger(),
		slots:   make(chan struct{}, cfg.Concurrency), reopen: make(chan struct{}),
		runs: map[string]*run{}, installed: map[string]agentapi.Bookmark{}, finished: map[string]*run{},
		sandboxes: map[string]Sandbox{}}
	return a, nil
}

// ownCreds tells whether the agent connects with credentials of its own
// (decentralized auth), whose user may do only what its own names allow:
// told by the inbox prefix jetstream.Connect set from them
// (jetstream.MemberInboxPrefix of its run and name).
func (a *Agent) ownCreds() bool {
	return a.nc != nil && a.nc.Opts.InboxPrefix == jetstream.MemberInboxPrefix(a.cfg.Run, string(events.KindAgent), a.cfg.Name)
}

// Name returns the agent's member name.
func (a *Agent) Name() events.Member { return a.name }

// Member returns the agent's bus member.
func (a *Agent) Member() *member.Member { return a.member }

// Run runs the member, the ack subscription and the run service until ctx
// ends or the member is superseded or replaced. Rollouts in flight are
// left as a crash leaves them: a restore continues them. Run returns once
// every goroutine it or a rollout started has ended.
func (a *Agent) Run(ctx context.Context) error {
	if err := a.acks.subscribe(a.nc); err != nil {
		return fmt.Errorf("agent: subscribe to sandbox acks: %w", err)
	}
	defer a.acks.close()
	g, gctx := errgroup.WithContext(ctx)
	if err := a.daemons.watch(gctx, a.cfg.Bus, a.ownCreds()); err != nil {
		return fmt.Errorf("agent: watch the sandbox daemons' heartbeats: %w", err)
	}
	defer a.daemons.close()
	a.mu.Lock()
	a.running = true
	a.mu.Unlock()
	svc, err := a.serve(gctx)
	if err != nil {
		a.shutdown()
		return err
	}
	g.Go(func() error {
		err := a.member.Run(gctx)
		if errors.Is(err, member.ErrSuperseded) || errors.Is(err, member.ErrReplaced) {
			a.log.Warn().Err(err).Msg("stopping: another agent serves this name now")
		}
		return err
	})
	err = g.Wait()
	a.shutdown()
	_ = svc.Stop()
	return err
}

// shutdown stops every run as a crash would: nothing is cleaned up.
func (a *Agent) shutdown() {
	a.mu.Lock()
	a.stopping = true
	for _, r := range a.runs {
		r.cancel(errShutdown)
	}
	a.mu.Unlock()
	a.wg.Wait()
}

// Rollout runs one rollout and returns its result once verified. It is
// registered at its seed bookmark (or at the bookmark a restore installed
// for this attempt) before it waits for a slot. A second request of the
// same attempt waits for the same result; ctx ending cancels the rollout
// (its launch is killed and its session closed).
func (a *Agent) Rollout(ctx context.Context, req agentapi.Request) (agentapi.Result, error) {
	r, err := a.start(ctx, req)
	if err != nil {
		return agentapi.Result{}, err
	}
	stop := context.AfterFunc(ctx, func() {
		r.cancel(fmt.Errorf("agent: rollout %s cancelled by its caller: %w", r.key, context.Cause(ctx)))
	})
	defer stop()
	<-r.done
	return r.res, r.err
}

// start registers the run of req, or returns the one that runs it. The
// run does not end with ctx, whose cancel would read as the caller's (and
// have the cleanup rule kill its launch): shutdown ends it, as a crash
// would, or its caller, a retire or a park does, through run.cancel.
func (a *Agent) start(ctx context.Context, req agentapi.Request) (*run, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if v, ok := a.cfg.Adapter.(TaskValidator); ok {
		if err := v.ValidateTask(req.Task); err != nil {
			return nil, fmt.Errorf("%w: task: %w", events.ErrInvalid, err)
		}
	}
	ep := events.Episode{Rollout: req.RolloutID, Attempt: req.Attempt}
	if err := a.member.Admit(ep); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.stopping || !a.running {
		return nil, ErrClosed
	}
	if r, ok := a.runs[req.RolloutID]; ok {
		if r.ep == ep {
			return r, nil
		}
		return nil, fmt.Errorf("%w: %s asked, %s runs", ErrBusy, ep, r.ep)
	}
	if r, ok := a.finished[req.RolloutID]; ok {
		switch {
		case r.ep == ep:
			// Asked again (a controller that restarted): the same answer,
			// never a second run of the attempt.
			return r, nil
		case r.ep.Attempt > ep.Attempt:
			return nil, fmt.Errorf("%w: %s asked, %s already ran", member.ErrStaleAttempt, ep, r.ep)
		}
	}
	if req.SentTo != "" && req.SentTo != a.member.Instance() {
		if ib, ok := a.installed[req.RolloutID]; !ok || ib.Attempt != req.Attempt {
			return nil, fmt.Errorf("%w: %s was sent to instance %s, this is %s", ErrAttemptLost, ep, req.SentTo, a.member.Instance())
		}
	}
	bm := agentapi.Bookmark{V: agentapi.BookmarkVersion, Next: agentapi.StageSeed, Rollout: req.RolloutID, Attempt: req.Attempt, Task: req.Task}
	restored := false
	if ib, ok := a.installed[req.RolloutID]; ok {
		switch {
		case ib.Attempt == req.Attempt:
			bm, restored = ib, true
			delete(a.installed, req.RolloutID)
		case ib.Attempt > req.Attempt:
			return nil, fmt.Errorf("%w: %s: a restore continues it as attempt %d", member.ErrStaleAttempt, ep, ib.Attempt)
		default:
			delete(a.installed, req.RolloutID) // the controller restarts it
		}
	}
	rctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	r := &run{key: ep.String(), ep: ep, req: req, ctx: rctx, cancel: cancel, done: make(chan struct{}),
		parkCh: make(chan struct{}, 1), bm: bm, at: atBoundary, restored: restored, seeded: bm.Session != "",
		log: a.log.With().Str("episode", ep.String()).Logger()}
	if a.closed {
		// A checkpoint is open: the run waits at its boundary; the open
		// checkpoint's prepare asks it too, so it is ready by its report.
		r.parkReq = &parkRequest{cp: a.open, reopen: a.reopen}
	}
	a.runs[req.RolloutID] = r
	a.wg.Add(1)
	go a.drive(r)
	a.member.Notify()
	return r, nil
}

// where a run stands, for readiness.
type where uint8

const (
	// atBoundary: waiting at a bookmark (queued for a slot, or held by a
	// checkpoint); exportable.
	atBoundary where = iota
	// atBusy: running a stage.
	atBusy
	// atParked: its launch paused in place by checkpoint parkedFor;
	// exportable for that checkpoint.
	atParked
	// atVerifying: its grade asked for and not answered yet. A grade is a
	// boundary (PROTOCOL §6): exportable at its verify bookmark, which a
	// restore grades again; the owner answers only after the checkpoint.
	atVerifying
)

type parkRequest struct {
	cp     string
	seq    uint64
	dl     time.Time
	reopen <-chan struct{}
}

// run is one attempt in flight.
type run struct {
	key string
	ep  events.Episode
	req agentapi.Request
	// ctx is the run's lifetime, kept here because it is the lifetime of
	// the goroutines the run owns (drive, and the receipt watcher it
	// starts), which every stage and the cleanup rule share: cancel ends
	// it from outside (a shutdown, a park, a retire, the caller), and its
	// cause says which.
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{}
	res    agentapi.Result
	err    error
	parkCh chan struct{}
	log    zerolog.Logger

	// Guarded by Agent.mu.
	bm        agentapi.Bookmark
	at        where
	parkedFor string
	parkReq   *parkRequest
	restored  bool
	seeded    bool
	launch    string        // the launch in flight
	sandbox   string        // its sandbox
	waiter    chan struct{} // the service request waiting for its end (waitFor)
}

func (a *Agent) bookmark(r *run) agentapi.Bookmark {
	a.mu.Lock()
	defer a.mu.Unlock()
	return r.bm.Clone()
}

// drive runs a rollout to its end and applies the cleanup rule.
func (a *Agent) drive(r *run) {
	defer a.wg.Done()
	res, err := a.queue(r)
	if err != nil && r.ctx.Err() != nil {
		// Cancelled: why (a shutdown, a park, a retire, the caller) decides
		// the cleanup rule and the answer, not how the stage in flight
		// reported its cut-off call.
		err = context.Cause(r.ctx)
	}
	if err != nil {
		a.cleanup(r, err)
	}
	a.mu.Lock()
	r.res, r.err = res, err
	if a.runs[r.ep.Rollout] == r {
		delete(a.runs, r.ep.Rollout)
	}
	if !errors.Is(err, errShutdown) {
		a.remember(r)
	}
	a.mu.Unlock()
	close(r.done)
	a.member.Notify()
	ev := r.log.Info()
	if err != nil {
		ev = r.log.Warn().Err(err)
	}
	ev.Int("launches", len(res.Launches)).Msg("rollout ended")
}

func (a *Agent) queue(r *run) (agentapi.Result, error) {
	select {
	case a.slots <- struct{}{}:
	case <-r.ctx.Done():
		return agentapi.Result{}, context.Cause(r.ctx)
	}
	defer func() { <-a.slots }()
	return a.stages(r)
}

// stages runs seed → launch → verify → return, recording the bookmark
// before each.
func (a *Agent) stages(r *run) (agentapi.Result, error) {
	bm := a.bookmark(r)
	unanswered := 0 // stages run again because the owner did not answer
	unready := 0    // launch stages in a row that found the relay unready
	infra := 0      // stages run again for an infrastructure fault
	for {
		if err := a.boundary(r, bm); err != nil {
			return agentapi.Result{}, err
		}
		var err error
		switch bm.Next {
		case agentapi.StageSeed:
			bm, err = a.seed(r, bm)
		case agentapi.StageLaunch:
			bm, err = a.launchStage(r, bm)
		case agentapi.StageVerify:
			bm, err = a.verify(r, bm)
		case agentapi.StageReturn:
			res := *bm.Result
			res.Launches = bm.Launches
			a.mu.Lock()
			res.Restored = res.Restored || r.restored
			a.mu.Unlock()
			return res, nil
		default:
			err = bm.Validate()
		}
		if errors.Is(err, errAdmissionClosed) {
			// Back to the boundary, to wait for the resume; the owner or the
			// daemon may hear the checkpoint before (or reopen after) this
			// agent, so do not ask again at once.
			select {
			case <-r.ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
			bm = a.bookmark(r)
			continue
		}
		if errors.Is(err, errOwnerUnanswered) {
			// Nothing of the stage happened; ask again from the bookmark,
			// at the boundary, where a checkpoint that came meanwhile parks
			// the run.
			unanswered++
			r.log.Warn().Err(err).Int("times", unanswered).Msg("the owner did not answer; the stage runs again from its bookmark")
			backOff(r, unanswered)
			bm = a.bookmark(r)
			continue
		}
		if errors.Is(err, errRelayUnready) {
			unready++
			if unready >= relayTries {
				return agentapi.Result{}, a.lostOr(r, bm, fmt.Errorf("%w: %d tries: %w", errSandboxLost, unready, err))
			}
			r.log.Warn().Err(err).Int("times", unready).Msg("the sandbox's relay is not ready; the launch stage runs again from its bookmark")
			backOff(r, unready)
			bm = a.bookmark(r)
			continue
		}
		unready = 0
		if err != nil && isInfra(err) && r.ctx.Err() == nil {
			infra++
			if infra >= InfraTries {
				return agentapi.Result{}, a.lostOr(r, bm, fmt.Errorf("%w: %s stage, %d tries: %w", ErrInfra, bm.Next, infra, err))
			}
			r.log.Warn().Err(err).Int("times", infra).Str("stage", string(bm.Next)).Msg("an infrastructure fault; the stage runs again from its bookmark")
			backOff(r, 2*infra)
			bm = a.bookmark(r)
			continue
		}
		if err != nil {
			return agentapi.Result{}, a.lostOr(r, bm, err)
		}
		infra = 0
	}
}

// InfraTries is how many times in a row a stage runs that the owner or a
// sandbox daemon fails on its side (isInfra) before the attempt ends as
// ErrInfra, a second more between each.
const InfraTries = 3

// ErrInfra ends an attempt that the infrastructure failed (its owner or a
// sandbox daemon answered a step with a failure of its own, InfraTries
// times in a row): agentapi.CodeInfra, which the controller takes for no
// result of the rollout.
var ErrInfra = errors.New("agent: infrastructure fault")

// backOff waits before a stage runs again for the nth time in a row:
// half a second more each time, at most 5 s, or until the run ends.
func backOff(r *run, n int) {
	select {
	case <-r.ctx.Done():
	case <-time.After(min(time.Duration(n)*500*time.Millisecond, 5*time.Second)):
	}
}

// boundary records bm and, while a checkpoint holds admission closed,
// waits there: the checkpoint exports the run at bm.
func (a *Agent) boundary(r *run, bm agentapi.Bookmark) error {
	if err := bm.Validate(); err != nil {
		return fmt.Errorf("agent: %s: %w", r.key, err)
	}
	if err := a.member.Admit(r.ep); err != nil {
		return err
	}
	a.mu.Lock()
	r.bm, r.at, r.parkedFor = bm, atBoundary, ""
	for a.closed {
		ch := a.reopen
		a.mu.Unlock()
		a.member.Notify()
		select {
		case <-ch:
		case <-r.ctx.Done():
			return context.Cause(r.ctx)
		}
		a.mu.Lock()
	}
	r.at = atBusy
	a.mu.Unlock()
	return a.member.Admit(r.ep)
}

// seed asks the owner for the session's sandbox.
func (a *Agent) seed(r *run, bm agentapi.Bookmark) (agentapi.Bookmark, error) {
	a.mu.Lock()
	r.seeded = true // from now on the owner may hold a session to close
	a.mu.Unlock()
	info, err := a.askSeed(r.ctx, bm.Rollout, r.key, bm.Task)
	if isAdmissionClosed(err) {
		return bm, errAdmissionClosed
	}
	var se *jetstream.ServiceError
	if errors.As(err, &se) && se.Status >= 400 && se.Status < 500 {
		// Refused outright: no session of this run was made, and the one
		// the owner holds under this id (another attempt's) is not ours
		// to close.
		a.mu.Lock()
		r.seeded = false
		a.mu.Unlock()
	}
	if err != nil {
		return bm, fmt.Errorf("agent: seed %s: %w", r.key, err)
	}
	state, err := a.cfg.Adapter.NewState(r.req)
	if err != nil {
		return bm, fmt.Errorf("agent: %s: %w", r.key, err)
	}
	bm.Next, bm.Session, bm.Owner, bm.VerifyMode = agentapi.StageLaunch, bm.Rollout, a.cfg.Owner, "owner"
	bm.Sandbox, bm.Workdir, bm.State = info.SandboxID, info.Workdir, state
	bm.Restart = a.cfg.NoCheckpointing || info.RestartOnly || info.SandboxID == ""
	if bm.Restart {
		r.log.Info().Bool("owner_restart_only", info.RestartOnly).Msg("restart-only rollout: never parked, restarts from its input")
	}
	return bm, nil
}

// cleanup applies the cleanup rule to a run that ends without a result.
func (a *Agent) cleanup(r *run, cause error) {
	if errors.Is(cause, errShutdown) || errors.Is(cause, member.ErrSuperseded) {
		return // as a crash: nothing shared is touched
	}
	a.mu.Lock()
	launch, sandbox, seeded := r.launch, r.sandbox, r.seeded
	session := cmp.Or(r.bm.Session, r.ep.Rollout) // the bookmark may not name it yet
	a.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.ctx), 30*time.Second)
	defer cancel()
	if launch != "" && !a.daemons.isGone(sandbox) {
		if dc, err := a.sandbox(sandbox); err == nil {
			// The daemon may go while it holds the stop (an owner that
			// retires the same attempt stops its sandbox): then the launch
			// went with it, and the session is still to close.
			_, err := whileDaemonLives(ctx, a, sandbox, func(ctx context.Context) (sandboxapi.Receipt, error) {
				return dc.Stop(ctx, launch, true)
			})
			if err != nil && !isCode(err, sandboxapi.CodeUnknownLaunch) && !errors.Is(err, errSandboxLost) {
				r.log.Warn().Err(err).Str("launch", launch).Msg("kill the launch")
			}
		}
	}
	if errors.Is(cause, ErrParked) {
		return // the checkpoint holds the rest
	}
	if seeded {
		if err := a.owner.CloseSession(ctx, session); err != nil {
			r.log.Warn().Err(err).Msg("close the session")
		}
	}
}
