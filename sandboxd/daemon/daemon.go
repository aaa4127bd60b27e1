package daemon

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"
	"strings"
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
	Repoint(url string, generation uint64) (sandboxapi.RelayStatus, error)
	// Label names the launch the calls taken from now on belong to (the
	// capture's call ids); Durable tells whether every call captured is
	// durable, and Flush waits until it is; CapturePath is the capture
	// file ("": no capture).
	Label(episode, launchID string) error
	Durable() bool
	Flush() error
	CapturePath() string
}

// Daemon is sandboxd on the bus.
type Daemon struct {
	cfg      Config
	log      zerolog.Logger
	name     events.Member
	sup      *sandboxd.Supervisor // run by Run; its launches only through launches
	launches launches             // sup, as the daemon controls its launches
	member   *member.Member

	mu          sync.Mutex
	open        string                              // checkpoint id while admission is closed
	paused      map[string]string                   // launch id -> checkpoint that paused it
	episodes    map[string]string                   // launch id -> episode key, persisted
	nopause     map[string]bool                     // launches checkpoints leave alone
	registering map[string]bool                     // launches admitted and not yet registered
	resuming    map[string]chan struct{}            // launches a take-over (Resume) is continuing; closed when it is done
	taken       map[string]takenOver                // launch id -> the take-over that continued it
	heldBy      string                              // the checkpoint whose prepare took the relay's hold ("": none of this daemon's)
	flushing    bool                                // a wait for the capture to be durable runs
	pausing     map[string]*pausing                 // launch id -> its pause in flight
	ending      map[string]context.CancelFunc       // launch id -> the watch for the end of its stop
	confirmed   map[string][]sandboxapi.PauseResult // checkpoint id -> its pauses that confirmed
	failed      map[string]error                    // checkpoint id -> why one of its pauses failed
	closing     bool                                // Run is returning: no new pause or watch
	pauses      sync.WaitGroup                      // the pausing goroutines and the watches
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

// pausing is one launch's pause in flight for a checkpoint.
type pausing struct {
	checkpoint string
	cancel     context.CancelFunc
	done       chan struct{}
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
	d := &Daemon{cfg: cfg, name: name, sup: cfg.Supervisor, launches: cfg.Supervisor,
		paused: map[string]string{}, episodes: map[string]string{}, nopause: map[string]bool{}, registering: map[string]bool{}, resuming: map[string]chan struct{}{}, taken: map[string]takenOver{},
		pausing: map[string]*pausing{}, ending: map[string]context.CancelFunc{}, confirmed: map[string][]sandboxapi.PauseResult{}, failed: map[string]error{},
		log: cfg.Logger.With().Str("run", cfg.Run).Str("member", string(name)).Logger()}
	if err := d.loadEpisodes(); err != nil {
		return nil, err
	}
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
	defer d.stopPauses() // no Prepare comes once the member has stopped
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
// every launch, and report at once. It is ready once each launch is
// paused, ended, or stopped after a pause that did not confirm; until
// then the launches still pausing are its blockers (their episode, or
// their id), and each pause that ends calls Member.Notify, so that the
// runtime asks again. A launch being stopped is not paused (the pause
// would fail at once): it is a blocker until it has ended, which calls
// Notify too. A pause that failed fails the next Prepare.
func (d *Daemon) Prepare(ctx context.Context, cp member.Checkpoint) (member.Report, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.open != cp.ID && d.cfg.Relay != nil {
		// Before any launch is paused: no model call starts or is answered
		// from now on until the resume. A relay already holding is either
		// this daemon's hold of the checkpoint before (the resume of this
		// one releases it now) or the hold a restore left, which only a
		// take-over, a collect or a drop resolves: this checkpoint's
		// resume must not release it.
		switch {
		case !d.cfg.Relay.Holding():
			d.cfg.Relay.Hold()
			d.heldBy = cp.ID
		case d.heldBy != "":
			d.heldBy = cp.ID
		}
	}
	d.open = cp.ID
	if err := d.failed[cp.ID]; err != nil {
		return member.Report{}, err
	}
	if len(d.registering) > 0 {
		// A launch admitted before the checkpoint closed admission is still
		// registering: wait for it, or it would escape the pause.
		return member.Report{Blockers: []string{"launch-registering"}}, nil
	}
	var blockers []string
	for _, rec := range d.launches.List() {
		if rec.State == sandboxapi.StateEnded || d.nopause[rec.ID] {
			// Ended, or its agent stops it or lets it run (a restart-only
			// rollout).
			continue
		}
		if rec.State == sandboxapi.StateStopping {
			// It ends by itself, within the stop's grace.
			d.watchEnd(ctx, rec.ID)
			blockers = append(blockers, d.blockerLocked(rec.ID))
			continue
		}
		if d.resuming[rec.ID] != nil {
			// A take-over is continuing it: paused now, running in a
			// moment. Pause it once that is done (Resume notifies).
			blockers = append(blockers, d.blockerLocked(rec.ID))
			continue
		}
		mark := d.paused[rec.ID]
		if mark == "" && rec.State == sandboxapi.StatePaused {
			// Paused by the agent, not by a checkpoint: it is still, and its
			// continue is the agent's to send.
			continue
		}
		if mark != cp.ID {
			if d.closing {
				return member.Report{}, errors.New("daemon: stopping")
			}
			// Marked before the pause: a pause cut short by a resume may
			// still complete, and the resume must then continue it.
			d.paused[rec.ID] = cp.ID
			d.startPause(ctx, cp.ID, rec.ID)
		}
		if d.pausing[rec.ID] != nil {
			blockers = append(blockers, d.blockerLocked(rec.ID))
		}
	}
	if len(blockers) > 0 {
		sort.Strings(blockers)
		return member.Report{Blockers: blockers, Counts: map[string]int{"pausing": len(blockers)}}, nil
	}
	if d.cfg.Relay != nil && !d.cfg.Relay.Durable() {
		// Every launch is still; the calls they made are captured, and the
		// snapshot must not come before the disk has them.
		d.flushLocked()
		return member.Report{Blockers: []string{"capture-sync"}}, nil
	}
	reports := d.confirmed[cp.ID]
	return member.Report{Ready: true, Pause: summarize(reports), Counts: map[string]int{"launches": len(reports)}}, nil
}

// flushLocked starts one wait for the relay's capture to be durable,
// which notifies the member when it is done (d.mu held).
func (d *Daemon) flushLocked() {
	if d.flushing || d.closing {
		return
	}
	d.flushing = true
	d.pauses.Add(1)
	go func() {
		defer d.pauses.Done()
		if err := d.cfg.Relay.Flush(); err != nil {
			d.log.Error().Err(err).Msg("the model calls captured are not durable")
		}
		d.mu.Lock()
		d.flushing = false
		d.mu.Unlock()
		d.member.Notify()
	}()
}

// blockerLocked names launch id as a blocker: its episode, or its id.
// d.mu is held.
func (d *Daemon) blockerLocked(id string) string {
	if ep := d.episodes[id]; ep != "" {
		return ep
	}
	return id
}

// watchEnd calls Member.Notify once launch id, being stopped, has ended,
// from one goroutine of the daemon's per launch; the end of Run cuts it
// short. A wait that fails for another reason does not notify (the
// member's poll asks again): one that fails at once must not spin. d.mu
// is held.
func (d *Daemon) watchEnd(ctx context.Context, id string) {
	if d.ending[id] != nil || d.closing {
		return
	}
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d.ending[id] = cancel
	d.pauses.Go(func() {
		defer cancel()
		_, err := d.launches.Wait(wctx, id)
		d.mu.Lock()
		delete(d.ending, id)
		d.mu.Unlock()
		switch {
		case err == nil, errors.Is(err, sandboxd.ErrKillUnconfirmed):
			d.member.Notify() // ended
		case wctx.Err() == nil:
			d.log.Debug().Err(err).Str("launch", id).Msg("waiting for the end of a stopping launch")
		}
	})
}

// startPause pauses launch id for checkpoint cp in a goroutine of the
// daemon's; a resume of cp (Continue) or the end of Run cuts it short.
// d.mu is held.
func (d *Daemon) startPause(ctx context.Context, cp, id string) {
	pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p := &pausing{checkpoint: cp, cancel: cancel, done: make(chan struct{})}
	d.pausing[id] = p
	d.pauses.Go(func() {
		defer close(p.done)
		defer cancel()
		d.pause(pctx, cp, id)
		d.mu.Lock()
		if d.pausing[id] == p {
			delete(d.pausing, id)
		}
		d.mu.Unlock()
		d.member.Notify()
	})
}

// pause pauses launch id for checkpoint cp and records how it went.
func (d *Daemon) pause(ctx context.Context, cp, id string) {
	rep, err := d.launches.Pause(ctx, id, sandboxapi.ModeDefault)
	switch {
	case ctx.Err() != nil:
		// Cut short: the mark stays, and whoever cut it continues the
		// launch, in case the pause completed after all.
	case errors.Is(err, sandboxd.ErrUnconfirmed):
		// Unconfirmed, and undone: never leave it running through a
		// snapshot. Stop it; the agent relaunches from its session.
		d.unmark(id)
		d.log.Warn().Str("launch", id).Str("fallback", rep.Fallback).Msg("pause not confirmed; stopping the launch for a relaunch")
		if _, err := d.launches.Stop(ctx, id); err != nil {
			d.fail(cp, fmt.Errorf("stop %s after an unconfirmed pause: %w", id, err))
			return
		}
		d.confirm(cp, rep)
	case errors.Is(err, sandboxd.ErrStopping):
		d.unmark(id) // being stopped: it ends by itself
	case err != nil:
		d.fail(cp, fmt.Errorf("pause %s: %w", id, err))
	case rep.State == sandboxapi.StateEnded:
		d.unmark(id) // ended just before the pause: it keeps its result
	default:
		d.confirm(cp, rep)
	}
}

func (d *Daemon) confirm(cp string, rep sandboxapi.PauseResult) {
	d.mu.Lock()
	d.confirmed[cp] = append(d.confirmed[cp], rep)
	d.mu.Unlock()
}

func (d *Daemon) fail(cp string, err error) {
	d.mu.Lock()
	d.failed[cp] = errors.Join(d.failed[cp], err)
	d.mu.Unlock()
}

// cutPauses cuts short the pauses in flight of checkpoint id (every one
// when id is "") and waits until each has returned.
func (d *Daemon) cutPauses(id string) {
	d.mu.Lock()
	var done []chan struct{}
	for _, p := range d.pausing {
		if p.checkpoint == id || id == "" {
			p.cancel()
			done = append(done, p.done)
		}
	}
	d.mu.Unlock()
	for _, ch := range done {
		<-ch
	}
}

// stopPauses cuts every pause and watch short, lets no new one start, and
// waits.
func (d *Daemon) stopPauses() {
	d.mu.Lock()
	d.closing = true
	for _, cancel := range d.ending {
		cancel()
	}
	d.mu.Unlock()
	d.cutPauses("")
	d.pauses.Wait()
}

func (d *Daemon) unmark(id string) {
	d.mu.Lock()
	delete(d.paused, id)
	d.mu.Unlock()
}

// PausedByCheckpoint tells whether a checkpoint holds launch id paused:
// the agent's continue must not undo it.
func (d *Daemon) PausedByCheckpoint(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.paused[id] != ""
}

// Continue implements member.Continuer: continue what this checkpoint
// paused and reopen admission. Its pauses still in flight are cut short
// first, and waited for: one may still complete, and is then continued
// with the rest.
func (d *Daemon) Continue(ctx context.Context, id string) (*events.PauseReport, error) {
	d.cutPauses(id)
	d.mu.Lock()
	delete(d.confirmed, id)
	delete(d.failed, id)
	var ids []string
	for l, c := range d.paused {
		if c == id || id == "" {
			ids = append(ids, l)
		}
	}
	if d.open == id {
		d.open = ""
	}
	// This continue lets the relay's held calls go (the deferred release
	// below): only then does its report count them.
	releases := d.open == "" && d.heldBy != ""
	d.mu.Unlock()
	defer func() {
		// After the launches are continued: the replies it kept reach
		// harnesses that run again. Only a hold this daemon's prepare took,
		// and only with admission still open (a prepare that came meanwhile
		// took the hold over): a restore's hold waits for its take-over.
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.open == "" && d.heldBy != "" && d.cfg.Relay != nil {
			d.cfg.Relay.Release()
			d.heldBy = ""
		}
	}()
	sort.Strings(ids)
	var reports []sandboxapi.PauseResult
	var errs []error
	for _, l := range ids {
		rep, err := d.launches.Continue(ctx, l)
		d.mu.Lock()
		delete(d.paused, l)
		d.mu.Unlock()
		if err != nil {
			// A continue that failed stopped the launch: the agent sees it
			// ended and relaunches.
			errs = append(errs, fmt.Errorf("continue %s: %w", l, err))
			continue
		}
		reports = append(reports, rep)
	}
	sum := summarize(reports)
	if sum != nil && releases && d.cfg.Relay != nil {
		sum.HeldCalls = d.cfg.Relay.Status().Calls.Held // read before the deferred release lets them go
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
		key := d.episodes[rec.ID]
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

// summarize folds the results of a pause or continue of every launch into
// the one events.PauseReport an ack carries: nil when no launch was
// touched.
func summarize(results []sandboxapi.PauseResult) *events.PauseReport {
	if len(results) == 0 {
		return nil
	}
	results = slices.Clone(results)
	slices.SortFunc(results, func(a, b sandboxapi.PauseResult) int { return strings.Compare(a.Launch, b.Launch) })
	out := &events.PauseReport{Mode: results[0].Mode.String(), PauseSeq: results[0].PauseSeq,
		Identity: results[0].Identity.String(), Wall: results[0].Wall, Uptime: results[0].Uptime}
	var fallbacks []string
	for _, r := range results {
		out.PIDCount += r.PIDCount
		if len(out.PIDs) < 16 {
			out.PIDs = append(out.PIDs, r.PIDs[:min(len(r.PIDs), 16-len(out.PIDs))]...)
		}
		out.Pending = append(out.Pending, r.Pending...)
		if r.Fallback != "" {
			fallbacks = append(fallbacks, r.Launch+": "+r.Fallback)
		}
		out.TookMS += r.TookMS
		out.PauseSeq = max(out.PauseSeq, r.PauseSeq)
	}
	out.Fallback = strings.Join(fallbacks, "; ")
	out.Frozen = true
	for _, r := range results {
		out.Frozen = out.Frozen && r.Frozen
	}
	if len(out.Pending) > 100 {
		out.Pending = out.Pending[:100]
	}
	return out
}
