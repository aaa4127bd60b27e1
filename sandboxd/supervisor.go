package sandboxd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// Spec is what to launch.
type Spec struct {
	// ID names the launch; see ValidateID. Used once per state directory.
	ID string
	// Command is run as /bin/sh -c Command. Exactly one of Command and
	// Argv is set.
	Command string
	// Argv is run directly (Argv[0] is looked up in PATH if it has no
	// slash).
	Argv []string
	// Dir is the working directory (default: the supervisor's).
	Dir string
	// Env is the environment (default: the supervisor's). EnvTag=<ID> and
	// EnvMark are always added (replacing any there).
	Env []string
	// Timeout stops the launch (as interrupted, with TimedOut) once it has
	// run this long, paused time not counted (0: no deadline).
	Timeout time.Duration
	// Mode is the launch's default pause mode (default: the supervisor's).
	Mode sandboxapi.Mode
	// Freeze makes a hold pause also freeze the launch where it has its
	// own cgroup, waiting at most FreezeWait (default
	// sandboxapi.DefaultFreezeWait; Launch refuses one over the
	// supervisor's Config.PendingTimeout) for every process to stop; a freeze
	// that does not take hold in time is undone and the pause stays a
	// plain hold (restore_sandbox_clock, PROTOCOL §6).
	Freeze     bool
	FreezeWait time.Duration
}

// Validate reports every problem of s, each naming the field.
func (s Spec) Validate() error {
	var errs []error
	if err := ValidateID(s.ID); err != nil {
		errs = append(errs, fmt.Errorf("Spec.ID: %w", err))
	}
	if (s.Command == "") == (len(s.Argv) == 0) {
		errs = append(errs, fmt.Errorf("%w: exactly one of Spec.Command and Spec.Argv", ErrInvalidSpec))
	}
	if len(s.Argv) > 0 && s.Argv[0] == "" {
		errs = append(errs, fmt.Errorf("%w: Spec.Argv[0] is empty", ErrInvalidSpec))
	}
	if s.FreezeWait < 0 {
		errs = append(errs, fmt.Errorf("%w: Spec.FreezeWait must not be negative", ErrInvalidSpec))
	}
	if s.Timeout < 0 {
		errs = append(errs, fmt.Errorf("%w: Spec.Timeout must not be negative", ErrInvalidSpec))
	}
	if s.Mode > sandboxapi.ModeHold {
		errs = append(errs, fmt.Errorf("%w: Spec.Mode %v", ErrInvalidSpec, s.Mode))
	}
	return errors.Join(errs...)
}

// exitInfo is a launch process's exit: its code, or the signal that killed it.
type exitInfo struct {
	code   int
	signal string
}

// startSpec is a launch as the host starts it.
type startSpec struct {
	id     string
	argv   []string
	dir    string
	env    []string
	output string
	cgroup bool // start it in its own cgroup (freeze mode)
}

// pauseOpts bound a pause's confirmation.
type pauseOpts struct {
	confirmBy time.Time // every process stopped by then,
	pendingBy time.Time // or, while the only holdouts are in D, by then
}

// pauseOutcome is what the host did for a pause.
type pauseOutcome struct {
	confirmed bool
	ended     bool // the process had exited: nothing was paused
	count     int
	pids      []int
	pending   []string
	fallback  string
	frozen    bool  // a hold that also froze the launch's cgroup
	thawErr   error // an unconfirmed freeze whose undo failed: the cgroup may stay frozen
	undo      any   // host state that continue needs
}

// host is what the supervisor needs from the operating system; newHost
// returns the Linux one (host_linux.go) or errors.ErrUnsupported.
type host interface {
	identity() sandboxapi.Identity
	modes() []sandboxapi.Mode
	uptime() float64
	lock(stateDir string) (unlock func(), err error)
	acquireReaper() error
	releaseReaper()
	start(s startSpec) (hostLaunch, error)
	recoverLaunch(ctx context.Context, rec sandboxapi.Record, timeout time.Duration) bool
	reap()
	close()
}

// hostLaunch is one started launch, as the host sees it.
type hostLaunch interface {
	pid() int
	pidStart() uint64
	cgroupDir() string
	exits() <-chan exitInfo
	exitedNow() bool
	reaped()
	pause(ctx context.Context, mode sandboxapi.Mode, o pauseOpts) (pauseOutcome, error)
	resume(ctx context.Context, mode sandboxapi.Mode, p *pauseOutcome, timeout time.Duration) (int, error)
	interrupt()
	kill(ctx context.Context, timeout time.Duration) bool
	release() error
}

// Supervisor supervises launches: it starts each in its own session (and,
// where the host allows, its own cgroup), reaps it and its orphans, pauses
// and continues it, stops it, enforces its deadline, and keeps its record.
// Create it with New, run it with Run; the other methods may be called from
// any goroutine while Run runs.
type Supervisor struct {
	cfg   Config
	log   zerolog.Logger
	host  host
	self  sandboxapi.Identity
	modes []sandboxapi.Mode

	running  atomic.Bool
	ready    chan struct{} // closed when Run is serving, or failed to
	closing  chan struct{} // closed when Run's context ends
	startErr error

	mu       sync.Mutex
	closed   bool
	launches map[string]*launch
	actors   sync.WaitGroup
}

// New checks cfg, creates the state directory, and finds out what the host
// allows (Modes). It starts nothing; Run does.
func New(cfg Config) (*Supervisor, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: Config.StateDir: %w", ErrInvalidConfig, err)
	}
	log := cfg.Logger.With().Str("component", "sandboxd").Logger()
	h, err := newHost(cfg, log)
	if err != nil {
		return nil, err
	}
	s := &Supervisor{
		cfg: cfg, log: log, host: h, self: h.identity(), modes: h.modes(),
		ready: make(chan struct{}), closing: make(chan struct{}),
		launches: map[string]*launch{},
	}
	if cfg.Mode != sandboxapi.ModeDefault && !slices.Contains(s.modes, cfg.Mode) {
		h.close()
		return nil, fmt.Errorf("%w: Config.Mode %s (this host allows %v)", ErrModeUnavailable, cfg.Mode, s.modes)
	}
	return s, nil
}

// DetectModes returns the pause modes the host allows under cfg (its
// CgroupRoot and NoCgroup; StateDir is not needed), as New finds them,
// and leaves nothing behind.
func DetectModes(cfg Config) ([]sandboxapi.Mode, error) {
	cfg.setDefaults()
	cfg.StateDir = "" // nothing is launched
	h, err := newHost(cfg, cfg.Logger)
	if err != nil {
		return nil, err
	}
	defer h.close()
	return h.modes(), nil
}

// Modes returns the pause modes this host allows, the default first:
// freeze (when a cgroup v2 child can be created and frozen), stop, hold.
func (s *Supervisor) Modes() []sandboxapi.Mode { return slices.Clone(s.modes) }

// Identity returns the supervisor's identity (pid and start time).
func (s *Supervisor) Identity() sandboxapi.Identity { return s.self }

// Clocks returns the wall clock and the seconds since boot
// (CLOCK_BOOTTIME), as pause results carry them.
func (s *Supervisor) Clocks() (wall time.Time, uptime float64) {
	return s.cfg.Now().UTC(), s.host.uptime()
}

// StateDir returns the state directory.
func (s *Supervisor) StateDir() string { return s.cfg.StateDir }

// defaultMode resolves m for a launch.
func (s *Supervisor) defaultMode(m sandboxapi.Mode) sandboxapi.Mode {
	if m != sandboxapi.ModeDefault {
		return m
	}
	if s.cfg.Mode != sandboxapi.ModeDefault {
		return s.cfg.Mode
	}
	return s.modes[0]
}

// Run serves until ctx ends. It locks the state directory, makes the
// process a child subreaper with one reap loop, ends every launch a
// previous supervisor left unfinished (ErrSupervisorRestarted: killed, and
// recorded as failed), and removes the empty cgroups that supervisors
// that are gone left in the shared parent. When ctx ends it stops every
// launch (SIGINT, the grace, SIGKILL; paused ones at once), waits until
// each is confirmed gone, and returns nil.
func (s *Supervisor) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	fail := func(err error) error {
		s.mu.Lock()
		s.closed, s.startErr = true, err
		s.mu.Unlock()
		close(s.ready)
		s.host.close()
		return err
	}
	unlock, err := s.host.lock(s.cfg.StateDir)
	if err != nil {
		return fail(err)
	}
	defer unlock()
	if err := s.host.acquireReaper(); err != nil {
		return fail(err)
	}
	s.recoverAll(ctx)
	s.host.reap()
	s.log.Info().Stringer("identity", s.self).Interface("modes", s.modes).Str("state", s.cfg.StateDir).Msg("supervisor running")
	close(s.ready)

	<-ctx.Done()

	s.mu.Lock()
	s.closed = true
	close(s.closing)
	for _, l := range s.launches {
		l.abortPause(ErrClosed)
	}
	s.mu.Unlock()
	s.actors.Wait()
	s.host.releaseReaper()
	s.host.close()
	s.log.Info().Msg("supervisor stopped")
	return nil
}

// recoverAll ends the launches of a previous supervisor: a record that has
// not ended and names another identity is a launch nobody supervises any
// more. What is left of it is killed (its cgroup, its tag, its session)
// and it is recorded as failed.
func (s *Supervisor) recoverAll(ctx context.Context) {
	ents, err := os.ReadDir(s.cfg.StateDir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() || ValidateID(e.Name()) != nil {
			continue
		}
		rec, err := ReadRecord(s.cfg.StateDir, e.Name())
		if errors.Is(err, ErrUnknownLaunch) {
			continue // a stop or pause file for a launch never made
		}
		if err != nil {
			// Say so, leave the file for a person, and recover the others:
			// what this launch left running, if anything, is not known.
			s.log.Error().Err(err).Str("launch", e.Name()).Msg("a launch record left by the last supervisor cannot be read; its launch is not recovered")
			continue
		}
		if rec.State == sandboxapi.StateEnded || rec.Supervisor == s.self {
			continue
		}
		confirmed := s.host.recoverLaunch(ctx, rec, s.cfg.KillTimeout)
		now := s.cfg.Now()
		msg := fmt.Sprintf("%v: launch of supervisor %s, now %s", ErrSupervisorRestarted, rec.Supervisor, s.self)
		if Alive(rec.Supervisor) {
			msg += " (that process is alive but no longer holds the state directory)"
		}
		pauses := rec.Pauses
		if !pauses.Since.IsZero() {
			pauses.Total += now.Sub(pauses.Since)
			pauses.Since = time.Time{}
		}
		rec.State, rec.Pauses, rec.Deadline, rec.Updated = sandboxapi.StateEnded, pauses, time.Time{}, now
		rec.Receipt = &sandboxapi.Receipt{
			ID: rec.ID, Started: !rec.Started.IsZero(), ExitCode: -1, Outcome: sandboxapi.OutcomeFailed,
			CleanupConfirmed: confirmed, Error: msg, Ended: now, Pauses: pauses,
		}
		if err := writeRecord(LaunchDir(s.cfg.StateDir, rec.ID), &rec, true); err != nil {
			s.log.Error().Err(err).Str("launch", rec.ID).Msg("record a lost launch")
		}
		s.log.Warn().Str("launch", rec.ID).Stringer("was", rec.Supervisor).Bool("cleanup_confirmed", confirmed).Msg("launch lost to a supervisor restart")
	}
}

// waitReady blocks until Run serves (nil) or has failed or returned
// (ErrClosed), or ctx ends.
func (s *Supervisor) waitReady(ctx context.Context) error {
	select {
	case <-s.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		if s.startErr != nil {
			return fmt.Errorf("%w: %w", ErrClosed, s.startErr)
		}
		return ErrClosed
	}
	return nil
}

// get returns the live launch id, or nil.
func (s *Supervisor) get(id string) *launch {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.launches[id]
}

// Launch accepts spec and starts it: in a new session and process group,
// with EnvTag=<id> and EnvMark added, stdout and stderr to <state>/<id>/output.log and,
// in freeze mode, in its own cgroup. If the stop file exists the launch
// never starts (it ends interrupted); if the pause file exists it is held
// until Continue. It returns the record once the process has started (or
// was held, or ended); a start failure is recorded as failed and returned.
// A launch it refuses (an invalid spec, a taken id, a closed supervisor)
// returns the zero Record with the error. Launch blocks until Run serves.
func (s *Supervisor) Launch(ctx context.Context, spec Spec) (sandboxapi.Record, error) {
	if err := spec.Validate(); err != nil {
		return sandboxapi.Record{}, err
	}
	if spec.FreezeWait > s.cfg.PendingTimeout {
		// A freeze wait longer than any pause's is a hold that holds the
		// prepare (and the daemon's answer) that long.
		return sandboxapi.Record{}, fmt.Errorf("%w: Spec.FreezeWait %v is over the supervisor's pending timeout %v", ErrInvalidSpec, spec.FreezeWait, s.cfg.PendingTimeout)
	}
	if err := s.waitReady(ctx); err != nil {
		return sandboxapi.Record{}, err
	}
	mode := s.defaultMode(spec.Mode)
	if !slices.Contains(s.modes, mode) {
		return sandboxapi.Record{}, fmt.Errorf("%w: %s for launch %s (this host allows %v)", ErrModeUnavailable, mode, spec.ID, s.modes)
	}
	dir := LaunchDir(s.cfg.StateDir, spec.ID)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return sandboxapi.Record{}, ErrClosed
	}
	if s.launches[spec.ID] != nil || fileExists(filepath.Join(dir, RecordFile)) {
		s.mu.Unlock()
		return sandboxapi.Record{}, fmt.Errorf("%w: %s", ErrLaunchExists, spec.ID)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		s.mu.Unlock()
		return sandboxapi.Record{}, fmt.Errorf("sandboxd: launch %s: %w", spec.ID, err)
	}
	l := newLaunch(s, spec, mode, dir)
	s.launches[spec.ID] = l
	s.actors.Add(1)
	s.mu.Unlock()
	go l.run()

	if _, err := l.call(ctx, command{kind: cmdBegin}); err != nil && !errors.Is(err, errFinished) {
		return l.record(), err
	}
	rec := l.record()
	if rec.State == sandboxapi.StateEnded && rec.Receipt != nil && rec.Receipt.Outcome == sandboxapi.OutcomeFailed {
		return rec, fmt.Errorf("sandboxd: launch %s: %s", spec.ID, rec.Receipt.Error)
	}
	return rec, nil
}

// Pause pauses launch id in mode (ModeDefault: the launch's) and returns
// once the pause is confirmed: every process frozen (freeze), stopped
// (stop), or at once (hold). A pause that cannot be confirmed is undone
// and returns the result with its Fallback and ErrUnconfirmed; one that a
// Stop cut short returns ErrStopping, as for a launch being stopped. Pausing a
// paused launch repeats its result. A launch that has ended keeps its
// receipt and is not paused (result State ended). For a launch that has
// not started (or is not known yet), the pause file is created, so that it
// is held until Continue (result State held).
func (s *Supervisor) Pause(ctx context.Context, id string, mode sandboxapi.Mode) (sandboxapi.PauseResult, error) {
	if err := ValidateID(id); err != nil {
		return sandboxapi.PauseResult{}, err
	}
	if err := s.waitReady(ctx); err != nil {
		return sandboxapi.PauseResult{}, err
	}
	if l := s.get(id); l != nil {
		r, err := l.call(ctx, command{kind: cmdPause, mode: mode})
		return r.pause, err
	}
	rep := s.newPauseResult(id, "pause", mode)
	if rec, err := ReadRecord(s.cfg.StateDir, id); err == nil {
		rep.State, rep.PauseSeq = rec.State, rec.Pauses.Seq
		return rep, nil
	}
	if err := touch(LaunchDir(s.cfg.StateDir, id), PauseFileName); err != nil {
		return rep, err
	}
	rep.State = sandboxapi.StateHeld
	return rep, nil
}

// Continue ends the current pause of launch id: thaws (freeze), continues
// exactly the processes the pause stopped, children first (stop), or just
// resumes the deadline (hold). A held launch starts (its pause file is
// removed). Continuing a launch that is not paused does nothing. If a
// paused launch cannot be continued it is killed and ErrContinueFailed is
// returned.
func (s *Supervisor) Continue(ctx context.Context, id string) (sandboxapi.PauseResult, error) {
	if err := ValidateID(id); err != nil {
		return sandboxapi.PauseResult{}, err
	}
	if err := s.waitReady(ctx); err != nil {
		return sandboxapi.PauseResult{}, err
	}
	if l := s.get(id); l != nil {
		r, err := l.call(ctx, command{kind: cmdContinue})
		return r.pause, err
	}
	rep := s.newPauseResult(id, "continue", sandboxapi.ModeDefault)
	err := os.Remove(filepath.Join(LaunchDir(s.cfg.StateDir, id), PauseFileName))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return rep, err
	}
	if rec, err := ReadRecord(s.cfg.StateDir, id); err == nil {
		rep.State, rep.PauseSeq = rec.State, rec.Pauses.Seq
	} else {
		rep.State = sandboxapi.StatePending
	}
	return rep, nil
}

// Stop stops launch id: SIGINT to its process group and tree, SIGKILL to
// everything of it after the grace (a paused launch is killed at once: it
// cannot act on SIGINT), SIGKILL again to anything still found, and waits
// until it is confirmed gone. It returns the receipt (outcome interrupted
// unless the process had finished), or ErrKillUnconfirmed with it. For a
// launch that has not started (or is not known yet) the stop file is
// created, so that it never starts.
func (s *Supervisor) Stop(ctx context.Context, id string) (sandboxapi.Receipt, error) {
	return s.stop(ctx, id, sandboxapi.StopRequested, s.cfg.Grace)
}

// Cancel is Stop without the grace: SIGKILL to everything of the launch at
// once, paused or not.
func (s *Supervisor) Cancel(ctx context.Context, id string) (sandboxapi.Receipt, error) {
	return s.stop(ctx, id, sandboxapi.StopCancelled, 0)
}

func (s *Supervisor) stop(ctx context.Context, id string, why sandboxapi.StopReason, grace time.Duration) (sandboxapi.Receipt, error) {
	if err := ValidateID(id); err != nil {
		return sandboxapi.Receipt{}, err
	}
	if err := s.waitReady(ctx); err != nil {
		return sandboxapi.Receipt{}, err
	}
	l := s.get(id)
	if l == nil {
		if rec, err := ReadRecord(s.cfg.StateDir, id); err == nil && rec.Receipt != nil {
			return *rec.Receipt, nil
		}
		if err := touch(LaunchDir(s.cfg.StateDir, id), StopFileName); err != nil {
			return sandboxapi.Receipt{}, err
		}
		return sandboxapi.Receipt{ID: id, ExitCode: -1, Outcome: sandboxapi.OutcomeInterrupted, StopReason: sandboxapi.StopFile, CleanupConfirmed: true, Ended: s.cfg.Now()}, nil
	}
	l.abortPause(ErrStopping)
	if _, err := l.call(ctx, command{kind: cmdStop, reason: why, grace: grace}); err != nil && !errors.Is(err, errFinished) {
		return sandboxapi.Receipt{}, err
	}
	return s.waitLaunch(ctx, l)
}

// Wait blocks until launch id has ended and its cleanup is done, and
// returns its receipt. It first waits for Run to serve, so a launch that a
// previous supervisor left is reported once it has been recovered.
func (s *Supervisor) Wait(ctx context.Context, id string) (sandboxapi.Receipt, error) {
	if err := ValidateID(id); err != nil {
		return sandboxapi.Receipt{}, err
	}
	select {
	case <-s.ready:
	case <-ctx.Done():
		return sandboxapi.Receipt{}, ctx.Err()
	}
	if l := s.get(id); l != nil {
		return s.waitLaunch(ctx, l)
	}
	rc, err := s.Receipt(id)
	if err == nil && !rc.CleanupConfirmed {
		err = fmt.Errorf("%w: launch %s", ErrKillUnconfirmed, id)
	}
	return rc, err
}

func (s *Supervisor) waitLaunch(ctx context.Context, l *launch) (sandboxapi.Receipt, error) {
	select {
	case <-l.done:
	case <-ctx.Done():
		return sandboxapi.Receipt{}, ctx.Err()
	}
	rec := l.record()
	if rec.Receipt == nil {
		return sandboxapi.Receipt{}, fmt.Errorf("%w: %s", ErrNotEnded, l.id)
	}
	if !rec.Receipt.CleanupConfirmed {
		return *rec.Receipt, fmt.Errorf("%w: launch %s", ErrKillUnconfirmed, l.id)
	}
	return *rec.Receipt, nil
}

// Status returns the record of launch id: from memory for a launch of this
// supervisor, else from the state directory (where, until Run serves, a
// launch of a previous supervisor may not be recorded as ended yet).
func (s *Supervisor) Status(id string) (sandboxapi.Record, error) {
	if err := ValidateID(id); err != nil {
		return sandboxapi.Record{}, err
	}
	if l := s.get(id); l != nil {
		return l.record(), nil
	}
	return ReadRecord(s.cfg.StateDir, id)
}

// Receipt returns the receipt of launch id, or ErrNotEnded.
func (s *Supervisor) Receipt(id string) (sandboxapi.Receipt, error) {
	rec, err := s.Status(id)
	if err != nil {
		return sandboxapi.Receipt{}, err
	}
	if rec.Receipt == nil {
		return sandboxapi.Receipt{}, fmt.Errorf("%w: %s is %s", ErrNotEnded, id, rec.State)
	}
	return *rec.Receipt, nil
}

// List returns the records of every launch in the state directory, this
// supervisor's from memory.
func (s *Supervisor) List() []sandboxapi.Record {
	ents, _ := os.ReadDir(s.cfg.StateDir)
	var out []sandboxapi.Record
	for _, e := range ents {
		if !e.IsDir() || ValidateID(e.Name()) != nil {
			continue
		}
		if rec, err := s.Status(e.Name()); err == nil {
			out = append(out, rec)
		}
	}
	return out
}

// newPauseResult starts a pause or continue result with the supervisor's
// identity and clocks.
func (s *Supervisor) newPauseResult(id, op string, m sandboxapi.Mode) sandboxapi.PauseResult {
	return sandboxapi.PauseResult{
		Launch: id, Op: op, Mode: m, Identity: s.self,
		Wall: s.cfg.Now().UTC(), Uptime: s.host.uptime(),
	}
}

func touch(dir, name string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}
