package daemon

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"golang.org/x/sync/errgroup"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// ErrAdmissionClosed is returned for a launch asked while a checkpoint is
// open: the agent launches again after the resume.
var ErrAdmissionClosed = errors.New("daemon: admission closed by an open checkpoint")

// Config configures a daemon.
type Config struct {
	// Run is the run id; SandboxID the sandbox's id (the member is
	// sandbox.<SandboxID>). Required.
	Run       string
	SandboxID string
	// JS and Bus are the daemon's JetStream (from jetstream.New) and bus.
	// JS is required; Bus too, but with NoPull: a user of its own cannot
	// open the bus (jetstream.Open reads every stream's info).
	JS  natsjs.JetStream
	Bus *jetstream.Bus
	// Supervisor runs the launches; the daemon runs it. Required.
	Supervisor *sandboxd.Supervisor
	// StateFile keeps the daemon's position in the phase stream (default
	// <supervisor state dir>/position.json).
	StateFile string
	// NoPull is for a daemon with a user of its own (member.Config.NoPull),
	// which makes no consumer, reads no stream info and direct-gets only by
	// its run's subjects: its core feed catches up by the newest phase of
	// each kind.
	NoPull bool
	// Grace is the member's lease grace (default member.DefaultGrace).
	Grace time.Duration
	// AdoptEpoch, when not 0, is the epoch of the restore that adopted
	// this daemon with its launches (a fork re-identified in place): the
	// member serves it from the start (member.Config.AdoptEpoch, PROTOCOL
	// §5).
	AdoptEpoch uint64
	// Relay, when set, is the sandbox's model relay: a checkpoint's
	// prepare holds it and its resume releases it, and the service answers
	// relay_status and relay_repoint from it. Whoever made it runs it (it
	// outlives the daemon in a Resident).
	Relay Relay
	// Failpoints inject faults for the end-to-end tests (zero: none).
	Failpoints Failpoints
	// Logger receives structured logs.
	Logger zerolog.Logger
}

// Failpoints are the faults a daemon can be told to show, so that an
// end-to-end test can reach the restore outcomes a healthy fork never
// shows.
type Failpoints struct {
	// IdentityPrefix makes held, resume and collect of every launch whose
	// id starts with it see another supervisor identity than the daemon's
	// (its start time plus one): the launch reads as owned by a restarted
	// supervisor.
	IdentityPrefix string
}

// Relay is the model relay as the daemon uses it (package sandboxd/relay).
// Its methods but Flush must not block: the daemon calls them under its
// lock, so that what it decides from Holding and what it does stay
// together.
type Relay interface {
	Hold()
	Release()
	Drop(why string)
	Holding() bool
	Status() sandboxapi.RelayStatus
	// RepointBranch re-points the relay and, with branch set, makes it
	// the label the calls go upstream with, those it cuts included.
	RepointBranch(url string, generation uint64, branch *sandboxapi.BranchLabel) (sandboxapi.RelayStatus, error)
	// LabelBranch names the launch the calls taken from now on belong to
	// (the capture's call ids), the relay edits applied to its requests
	// (names the relay registers) and its branch label (nil: none);
	// Durable tells whether every call captured is durable, and Flush
	// waits until it is; CapturePath is the capture file ("": no
	// capture).
	LabelBranch(episode, launchID string, edits []string, branch *sandboxapi.BranchLabel) error
	Durable() bool
	Flush() error
	CapturePath() string
}

// Daemon is sandboxd on the bus: the driver of a Machine. It feeds the
// machine what the member, the service and its jobs report, under one
// lock, and carries out the machine's effects: the relay's, the episodes
// file and notifying the member under the lock; the pauses, watches and
// flushes as jobs in goroutines of its own; continues outside it.
type Daemon struct {
	cfg      Config
	log      zerolog.Logger
	name     events.Member
	sup      *sandboxd.Supervisor // run by Run; its launches only through launches
	launches launches             // sup, as the daemon controls its launches
	member   *member.Member

	mu       sync.Mutex
	core     *Machine
	jobs     map[uint64]*job // the machine's jobs that run
	tookOver chan struct{}   // closed, and replaced, at the end of each take-over
	wg       sync.WaitGroup  // the jobs' goroutines
}

// job is one job of the machine's that runs: cutting it cancels its
// context; done is closed when it has ended.
type job struct {
	cancel context.CancelFunc
	done   chan struct{}
}

// launches is the supervisor as the daemon controls its launches: the
// member side and the service alike go through it, so that a test can
// stand between the daemon and its supervisor (the conformance suite
// holds pauses there).
type launches interface {
	Launch(ctx context.Context, spec sandboxd.Spec) (sandboxapi.Record, error)
	List() []sandboxapi.Record
	Status(id string) (sandboxapi.Record, error)
	Receipt(id string) (sandboxapi.Receipt, error)
	Wait(ctx context.Context, id string) (sandboxapi.Receipt, error)
	Pause(ctx context.Context, id string, mode sandboxapi.Mode) (sandboxapi.PauseResult, error)
	Continue(ctx context.Context, id string) (sandboxapi.PauseResult, error)
	Stop(ctx context.Context, id string) (sandboxapi.Receipt, error)
	Cancel(ctx context.Context, id string) (sandboxapi.Receipt, error)
}

// New checks cfg and returns a daemon ready to Run.
func New(cfg Config) (*Daemon, error) {
	d, err := newDaemon(cfg)
	if err != nil {
		return nil, err
	}
	caps := []string{}
	for _, m := range cfg.Supervisor.Modes() {
		caps = append(caps, "pause:"+m.String())
	}
	d.member, err = member.New(member.Config{Run: cfg.Run, Member: d.name, JS: cfg.JS, Bus: cfg.Bus, Participant: d,
		Logger: cfg.Logger, Grace: cfg.Grace, StateFile: d.cfg.StateFile, NoPull: cfg.NoPull,
		Capabilities: caps, AdoptEpoch: cfg.AdoptEpoch})
	if err != nil {
		return nil, err
	}
	return d, nil
}

// newDaemon is New without the member.
func newDaemon(cfg Config) (*Daemon, error) {
	var errs []error
	if err := events.ValidateRun(cfg.Run); err != nil {
		errs = append(errs, fmt.Errorf("daemon: Config.Run: %w", err))
	}
	name, err := events.NewMember(events.KindSandbox, cfg.SandboxID)
	if err != nil {
		errs = append(errs, fmt.Errorf("daemon: Config.SandboxID: %w", err))
	}
	if cfg.JS == nil || cfg.Bus == nil && !cfg.NoPull || cfg.Supervisor == nil {
		errs = append(errs, errors.New("daemon: Config.JS, Bus (but with NoPull) and Supervisor are required"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.StateFile == "" {
		cfg.StateFile = filepath.Join(cfg.Supervisor.StateDir(), "position.json")
	}
	d := &Daemon{cfg: cfg, name: name, sup: cfg.Supervisor, launches: cfg.Supervisor, jobs: map[uint64]*job{},
		tookOver: make(chan struct{}), log: cfg.Logger.With().Str("run", cfg.Run).Str("member", string(name)).Logger()}
	eps, err := d.loadEpisodes()
	if err != nil {
		return nil, err
	}
	d.core = NewMachine(cfg.Relay != nil, eps)
	return d, nil
}

// Name returns the daemon's member name.
func (d *Daemon) Name() events.Member { return d.name }

// Run runs the supervisor, the bus member and the service until ctx ends
// or the member is superseded or replaced. Pauses a prepare started and
// that are still in flight when the member stops are cut short, and Run
// waits for them.
func (d *Daemon) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return d.sup.Run(gctx) })
	g.Go(func() error { return d.Serve(gctx) })
	return g.Wait()
}

// Serve runs the bus member and the service on a supervisor that the
// caller runs (a Resident: the supervisor outlives the daemon), until ctx
// ends or the member is superseded or replaced; the pauses in flight are
// cut short and waited for, as in Run. A Daemon is served once.
func (d *Daemon) Serve(ctx context.Context) error {
	svc, err := d.serve(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = svc.Stop() }()
	defer d.stopJobs() // no Prepare comes once the member has stopped
	err = d.member.Run(ctx)
	if errors.Is(err, member.ErrSuperseded) || errors.Is(err, member.ErrReplaced) {
		d.log.Warn().Err(err).Msg("stopping: another sandboxd serves this sandbox now")
	}
	return err
}

// Joined is closed once the daemon's member has registered (see
// member.Member.Joined).
func (d *Daemon) Joined() <-chan struct{} { return d.member.Joined() }

// Prepare implements member.Participant: close admission and start pausing
// every launch, and report at once (Machine.Step, PrepareAsked). Until it
// is ready each pause, end of a stop or flush that ends calls
// Member.Notify, so that the runtime asks again.
func (d *Daemon) Prepare(ctx context.Context, cp member.Checkpoint) (member.Report, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	in := PrepareAsked{Checkpoint: cp.ID, Holding: d.holdingLocked(), Durable: d.cfg.Relay == nil || d.cfg.Relay.Durable()}
	for _, rec := range d.launches.List() {
		in.Launches = append(in.Launches, Launch{ID: rec.ID, State: rec.State})
	}
	effs, err := d.core.Step(in)
	var rep member.Report
	for _, e := range d.doLocked(ctx, effs) {
		if r, ok := e.(Report); ok {
			rep = r.Report
		}
	}
	return rep, err
}

// PausedByCheckpoint tells whether a checkpoint holds launch id paused:
// the agent's continue must not undo it.
func (d *Daemon) PausedByCheckpoint(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.core.Mark(id) != ""
}

// Continue implements member.Continuer: continue what this checkpoint
// paused and reopen admission. Its pauses still in flight are cut short
// first, and waited for: one may still complete, and is then continued
// with the rest. The relay's hold this checkpoint took is released once
// the launches are continued, and the report counts the calls it held.
func (d *Daemon) Continue(ctx context.Context, id string) (*events.PauseReport, error) {
	d.cut(d.step(ctx, ReopenAsked{Checkpoint: id}))
	var c ContinueLaunches
	for _, e := range d.step(ctx, PausesCut{Checkpoint: id}) {
		if x, ok := e.(ContinueLaunches); ok {
			c = x
		}
	}
	defer d.step(ctx, Reopened{})
	var reports []sandboxapi.PauseResult
	var errs []error
	for _, l := range c.Launches {
		rep, err := d.launches.Continue(ctx, l)
		d.step(ctx, LaunchContinued{Launch: l})
		if err != nil {
			// A continue that failed stopped the launch: the agent sees it
			// ended and relaunches.
			errs = append(errs, fmt.Errorf("continue %s: %w", l, err))
			continue
		}
		reports = append(reports, rep)
	}
	sum := summarize(reports)
	if sum != nil && c.CountHeld {
		sum.HeldCalls = d.cfg.Relay.Status().Calls.Held // read before Reopened lets them go
	}
	return sum, errors.Join(errs...)
}

// Retire implements member.Retirer: stop the launches of the retired
// attempts (and earlier ones of the same rollouts).
func (d *Daemon) Retire(ctx context.Context, eps []events.Episode) error {
	mark := map[string]int{}
	for _, e := range eps {
		mark[e.Rollout] = max(mark[e.Rollout], e.Attempt)
	}
	var errs []error
	for _, rec := range d.launches.List() {
		if rec.State == sandboxapi.StateEnded {
			continue
		}
		d.mu.Lock()
		key := d.core.Episode(rec.ID)
		d.mu.Unlock()
		ep, err := events.ParseEpisode(key)
		if err != nil {
			continue
		}
		if m, ok := mark[ep.Rollout]; ok && ep.Attempt <= m {
			if _, err := d.launches.Cancel(ctx, rec.ID); err != nil && !errors.Is(err, sandboxd.ErrUnknownLaunch) {
				errs = append(errs, fmt.Errorf("stop %s of retired %s: %w", rec.ID, key, err))
			}
		}
	}
	return errors.Join(errs...)
}

// step feeds in to the machine, carries out the effects done under the
// lock, and returns the rest.
func (d *Daemon) step(ctx context.Context, in Input) []Effect {
	d.mu.Lock()
	defer d.mu.Unlock()
	effs, _ := d.core.Step(in) // only asks are refused, and step feeds none
	return d.doLocked(ctx, effs)
}

// holdingLocked tells whether the relay holds (false without one). d.mu
// is held.
func (d *Daemon) holdingLocked() bool { return d.cfg.Relay != nil && d.cfg.Relay.Holding() }

// doLocked carries out the effects done under d.mu: the relay's (none
// blocks), starting jobs (from ctx, without its
// cancel) and notifying the member; it returns the others, in order, for
// the caller.
func (d *Daemon) doLocked(ctx context.Context, effs []Effect) []Effect {
	var rest []Effect
	for _, e := range effs {
		switch e := e.(type) {
		case RelayHold:
			d.cfg.Relay.Hold()
		case RelayRelease:
			if e.Launch != "" {
				d.log.Info().Str("launch", e.Launch).Str("why", e.Why).Msg("releasing the model relay")
			}
			d.cfg.Relay.Release()
		case RelayDrop:
			d.log.Warn().Str("launch", e.Launch).Str("why", e.Why).Msg("dropping the calls a restore left held")
			d.cfg.Relay.Drop(e.Why)
		case RelayLabel:
			if err := d.cfg.Relay.LabelBranch(e.Episode, e.Launch, e.Edits, e.Branch); err != nil {
				d.log.Warn().Err(err).Str("launch", e.Launch).Msg("the launch's model calls are not captured")
			}
		case StartPause:
			d.startPause(ctx, e)
		case WatchEnd:
			d.watchEnd(ctx, e)
		case Flush:
			d.flush(ctx, e)
		case Notify:
			d.notify()
		default:
			rest = append(rest, e)
		}
	}
	return rest
}

func (d *Daemon) notify() {
	if d.member != nil {
		d.member.Notify()
	}
}

// runLocked runs job id in a goroutine of the daemon's, with a context
// that cutting the job cancels. d.mu is held.
func (d *Daemon) runLocked(ctx context.Context, id uint64, f func(ctx context.Context)) {
	jctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	j := &job{cancel: cancel, done: make(chan struct{})}
	d.jobs[id] = j
	d.wg.Go(func() {
		defer close(j.done)
		defer cancel()
		f(jctx)
		d.mu.Lock()
		delete(d.jobs, id)
		d.mu.Unlock()
	})
}

// startPause pauses a launch for a checkpoint; a resume of it (Continue)
// or the end of Run cuts it short. A pause that did not confirm was
// undone: the launch is stopped, for its agent to relaunch it. d.mu is
// held.
func (d *Daemon) startPause(ctx context.Context, e StartPause) {
	d.runLocked(ctx, e.Job, func(ctx context.Context) {
		rep, err := d.launches.Pause(ctx, e.Launch, sandboxapi.ModeDefault)
		for _, x := range d.step(ctx, PauseEnded{Job: e.Job, Checkpoint: e.Checkpoint, Launch: e.Launch, Cut: ctx.Err() != nil, Result: rep, Err: err}) {
			if s, ok := x.(StopLaunch); ok {
				d.log.Warn().Str("launch", s.Launch).Str("fallback", s.Result.Fallback).Msg("pause not confirmed; stopping the launch for a relaunch")
				_, err := d.launches.Stop(ctx, s.Launch)
				d.step(ctx, FallbackStopped{Job: s.Job, Checkpoint: s.Checkpoint, Launch: s.Launch, Result: s.Result, Err: err})
			}
		}
	})
}

// watchEnd waits for a launch being stopped to end; the end of Run cuts
// it short. A wait that fails for another reason does not notify (the
// member's poll asks again): one that fails at once must not spin. d.mu
// is held.
func (d *Daemon) watchEnd(ctx context.Context, e WatchEnd) {
	d.runLocked(ctx, e.Job, func(ctx context.Context) {
		_, err := d.launches.Wait(ctx, e.Launch)
		ended := err == nil || errors.Is(err, sandboxd.ErrKillUnconfirmed)
		if !ended && ctx.Err() == nil {
			d.log.Debug().Err(err).Str("launch", e.Launch).Msg("waiting for the end of a stopping launch")
		}
		d.step(ctx, EndWatched{Job: e.Job, Launch: e.Launch, Ended: ended})
	})
}

// flush waits for the relay's capture to be durable. d.mu is held.
func (d *Daemon) flush(ctx context.Context, e Flush) {
	d.runLocked(ctx, e.Job, func(ctx context.Context) {
		if err := d.cfg.Relay.Flush(); err != nil {
			d.log.Error().Err(err).Msg("the model calls captured are not durable")
		}
		d.step(ctx, Flushed{})
	})
}

// cut cuts short the jobs of the CutJobs among effs and waits until each
// has ended.
func (d *Daemon) cut(effs []Effect) {
	var done []chan struct{}
	d.mu.Lock()
	for _, e := range effs {
		if c, ok := e.(CutJobs); ok {
			for _, id := range c.Jobs {
				if j := d.jobs[id]; j != nil {
					j.cancel()
					done = append(done, j.done)
				}
			}
		}
	}
	d.mu.Unlock()
	for _, ch := range done {
		<-ch
	}
}

// stopJobs cuts every pause and watch short, lets no new job start, and
// waits for every job.
func (d *Daemon) stopJobs() {
	d.cut(d.step(context.Background(), Closing{}))
	d.wg.Wait()
}
