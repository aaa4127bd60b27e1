package sandboxd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// errFinished is returned by launch.call once the launch's driver has
// finished (the launch ended and was cleaned up).
var errFinished = errors.New("sandboxd: launch finished")

type cmdKind uint8

const (
	cmdBegin cmdKind = iota
	cmdPause
	cmdContinue
	cmdStop
)

// command is a request to a launch's driver.
type command struct {
	kind   cmdKind
	mode   sandboxapi.Mode
	reason sandboxapi.StopReason
	grace  time.Duration
	ctx    context.Context
	reply  chan result
}

type result struct {
	pause sandboxapi.PauseResult
	err   error
}

// launch is the driver of one launch: a goroutine that owns the launch's
// Machine, feeds it requests, exits and timers, and carries out its
// effects. Every operation on a launch runs on it, one at a time.
type launch struct {
	s    *Supervisor
	id   string
	dir  string
	spec Spec
	mode sandboxapi.Mode
	log  zerolog.Logger
	m    *Machine

	cmds  chan command
	done  chan struct{} // closed when the driver has finished
	abort atomic.Pointer[context.CancelCauseFunc]

	// Owned by the driver goroutine.
	hl          hostLaunch
	exitC       <-chan exitInfo
	timer       *time.Timer
	holdTick    *time.Ticker
	killRetry   *time.Timer
	killTries   int
	finished    bool
	stopping    bool // the supervisor is shutting down
	lastOut     pauseOutcome
	lastErr     error
	lastResumed int
	lastPause   sandboxapi.PauseResult

	mu  sync.Mutex // guards rec, read by other goroutines
	rec sandboxapi.Record
}

func newLaunch(s *Supervisor, spec Spec, mode sandboxapi.Mode, dir string) *launch {
	argv := spec.Argv
	if spec.Command != "" {
		argv = []string{"/bin/sh", "-c", spec.Command}
	}
	now := s.cfg.Now()
	l := &launch{
		s: s, id: spec.ID, dir: dir, spec: spec, mode: mode,
		log:  s.log.With().Str("launch", spec.ID).Logger(),
		m:    NewMachine(spec.Timeout, s.cfg.Grace),
		cmds: make(chan command), done: make(chan struct{}),
	}
	l.spec.Argv = argv
	l.rec = sandboxapi.Record{
		V: recordVersion, ID: spec.ID, Command: spec.Command, Argv: argv, Dir: spec.Dir,
		Created: now, Supervisor: s.self, State: sandboxapi.StatePending, Mode: mode,
		Output: filepath.Join(dir, OutputFile), Timeout: spec.Timeout, Updated: now,
	}
	return l
}

// record returns a copy of the launch's current record.
func (l *launch) record() sandboxapi.Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rec
	if r.Receipt != nil {
		rc := *r.Receipt
		r.Receipt = &rc
	}
	return r
}

// abortPause cuts short the pause in progress, if any, for why: a stop
// (ErrStopping) or the supervisor closing (ErrClosed).
func (l *launch) abortPause(why error) {
	if f := l.abort.Load(); f != nil {
		(*f)(why)
	}
}

// call hands c to the driver and waits for its reply. A launch whose
// driver has finished answers a pause or continue with its final state.
func (l *launch) call(ctx context.Context, c command) (result, error) {
	c.ctx, c.reply = ctx, make(chan result, 1)
	select {
	case l.cmds <- c:
	case <-l.done:
		if c.kind == cmdPause || c.kind == cmdContinue {
			return result{pause: l.endedPause(c.kind)}, nil
		}
		return result{}, errFinished
	case <-ctx.Done():
		return result{}, ctx.Err()
	}
	select {
	case r := <-c.reply:
		return r, r.err
	case <-ctx.Done():
		return result{}, ctx.Err()
	}
}

func (l *launch) endedPause(k cmdKind) sandboxapi.PauseResult {
	op := "pause"
	if k == cmdContinue {
		op = "continue"
	}
	rec := l.record()
	rep := l.s.newPauseResult(l.id, op, rec.Pauses.Mode)
	rep.State, rep.PauseSeq = rec.State, rec.Pauses.Seq
	return rep
}

func timerC(t *time.Timer) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

func tickerC(t *time.Ticker) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

// run is the driver loop; it returns once the launch has ended and its
// cleanup is done, after releasing the launch's host resources.
func (l *launch) run() {
	defer l.s.actors.Done()
	defer close(l.done)
	closing := l.s.closing
	for !l.finished {
		select {
		case c := <-l.cmds:
			l.handle(c)
		case ex := <-l.exitC:
			l.exited(ex)
		case <-timerC(l.timer):
			l.step(context.Background(), Tick{})
		case <-tickerC(l.holdTick):
			l.checkHeld()
		case <-timerC(l.killRetry):
			l.retryKill()
		case <-closing:
			closing = nil
			l.stopping = true
			l.step(context.Background(), StopAsked{Reason: sandboxapi.StopShutdown, Grace: l.s.cfg.Grace})
		}
	}
	for _, t := range []*time.Timer{l.timer, l.killRetry} {
		if t != nil {
			t.Stop()
		}
	}
	if l.holdTick != nil {
		l.holdTick.Stop()
	}
	if l.hl != nil {
		if err := l.hl.release(); err != nil {
			l.log.Warn().Err(err).Msg("release launch resources")
		}
	}
	// Its final record is on disk: Status, Receipt, Pause, Stop and Wait
	// read it from there from now on.
	l.s.mu.Lock()
	if l.s.launches[l.id] == l {
		delete(l.s.launches, l.id)
	}
	l.s.mu.Unlock()
}

func (l *launch) exited(ex exitInfo) {
	l.exitC = nil
	if l.hl != nil {
		l.hl.reaped()
	}
	l.log.Debug().Int("code", ex.code).Str("signal", ex.signal).Msg("process exited")
	l.step(context.Background(), Exited{Code: ex.code, Signal: ex.signal})
}

// awaitExit waits for the exit of a process known to have exited (a
// zombie the reap loop is about to reap, or has reaped).
func (l *launch) awaitExit() {
	if l.exitC == nil {
		return
	}
	t := time.NewTimer(l.s.cfg.KillTimeout)
	defer t.Stop()
	select {
	case ex := <-l.exitC:
		l.exited(ex)
	case <-t.C:
		l.log.Error().Msg("process exited but was not reaped in time")
	}
}

// step feeds in to the machine and carries out the effects.
func (l *launch) step(ctx context.Context, in Input) error {
	effs, err := l.m.Step(l.s.cfg.Now(), in)
	if err != nil {
		if !errors.Is(err, ErrStopping) {
			l.log.Error().Err(err).Msg("launch machine")
		}
		return err
	}
	for _, e := range effs {
		l.apply(ctx, e)
	}
	return nil
}

func (l *launch) apply(ctx context.Context, e Effect) {
	cfg := &l.s.cfg
	switch e := e.(type) {
	case Spawn:
		l.spawn()
	case DoPause:
		now := time.Now()
		o := pauseOpts{confirmBy: now.Add(cfg.ConfirmTimeout), pendingBy: now.Add(cfg.PendingTimeout)}
		var out pauseOutcome
		var err error
		if e.Mode == sandboxapi.ModeHold {
			out = l.hold(ctx)
		} else {
			out, err = l.hl.pause(ctx, e.Mode, o)
		}
		l.lastOut, l.lastErr = out, err
		l.step(ctx, PauseDone{Mode: e.Mode, Confirmed: err == nil && out.confirmed, Ended: out.ended, Frozen: out.frozen})
	case DoContinue:
		var n int
		var err error
		switch {
		case e.Mode == sandboxapi.ModeHold && l.lastOut.frozen:
			n, err = l.hl.resume(ctx, sandboxapi.ModeFreeze, &l.lastOut, cfg.ConfirmTimeout)
		case e.Mode != sandboxapi.ModeHold:
			n, err = l.hl.resume(ctx, e.Mode, &l.lastOut, cfg.ConfirmTimeout)
		}
		l.lastResumed, l.lastErr = n, err
		if err != nil {
			l.log.Error().Err(err).Stringer("mode", e.Mode).Msg("continue failed; killing the launch")
		}
		l.step(ctx, ContinueDone{OK: err == nil})
	case Interrupt:
		l.log.Info().Msg("stop: SIGINT")
		l.hl.interrupt()
	case Kill:
		l.killTries++
		ok := l.hl.kill(context.Background(), cfg.KillTimeout)
		l.log.Info().Bool("confirmed", ok).Msg("stop: SIGKILL")
		if l.exitC != nil {
			l.killRetry = time.NewTimer(cfg.KillTimeout)
		}
	case Cleanup:
		ok := l.hl.kill(context.Background(), cfg.KillTimeout)
		if !ok {
			l.log.Error().Msg("processes of the launch still found after the kill timeout")
		}
		l.step(ctx, CleanedUp{Confirmed: ok})
	case SetTimer:
		l.setTimer(e.At)
	case Persist:
		l.persist()
	case Hold:
		if l.holdTick == nil {
			l.holdTick = time.NewTicker(cfg.HoldPoll)
		}
	case Done:
		l.finished = true
	}
}

// hold makes a hold pause: acknowledged at once with no signal; with
// Spec.Freeze, and a cgroup of its own, it also freezes the launch, waiting
// at most Spec.FreezeWait, and stays a plain hold when the freeze does not
// take hold in time (the freeze undoes itself then). A freeze whose undo
// failed is counted frozen: the continue thaws it again.
func (l *launch) hold(ctx context.Context) pauseOutcome {
	if !l.spec.Freeze || l.hl.cgroupDir() == "" {
		return pauseOutcome{confirmed: true}
	}
	wait := l.spec.FreezeWait
	if wait <= 0 {
		wait = sandboxapi.DefaultFreezeWait
	}
	by := time.Now().Add(wait)
	out, err := l.hl.pause(ctx, sandboxapi.ModeFreeze, pauseOpts{confirmBy: by, pendingBy: by})
	switch {
	case err == nil && out.ended:
		return out
	case err == nil && out.confirmed:
		out.frozen = true
		return out
	}
	why := out.fallback
	if err != nil {
		why = err.Error()
	}
	if out.thawErr != nil {
		// The freeze did not take hold, and its undo failed: the cgroup may
		// still be (or become) frozen. Counted frozen, so that the continue
		// thaws it again (and a thaw that fails then stops the launch),
		// never a launch left frozen by a pause that said it was not.
		l.log.Error().Err(out.thawErr).Str("why", why).Dur("wait", wait).Msg("hold: the freeze did not take hold in time and its undo failed; counted frozen, the continue thaws it")
		return pauseOutcome{confirmed: true, frozen: true, pending: out.pending}
	}
	l.log.Warn().Str("why", why).Dur("wait", wait).Msg("hold: the launch did not freeze in time; a plain hold")
	return pauseOutcome{confirmed: true, pending: out.pending}
}

func (l *launch) setTimer(at time.Time) {
	if at.IsZero() {
		if l.timer != nil {
			l.timer.Stop()
		}
		return
	}
	d := at.Sub(l.s.cfg.Now())
	if l.timer == nil {
		l.timer = time.NewTimer(d)
		return
	}
	l.timer.Reset(d)
}

// retryKill kills again a launch whose process has not been reaped since
// the last kill; when the supervisor is shutting down it gives up after
// three tries, recording the launch as ended with its cleanup unconfirmed.
func (l *launch) retryKill() {
	l.killRetry = nil
	if l.exitC == nil {
		return
	}
	if l.stopping && l.killTries >= 3 {
		l.log.Error().Int("tries", l.killTries).Msg("process not reaped after repeated kills; giving up")
		l.exitC = nil
		l.step(context.Background(), Exited{Code: -1, Signal: "unreaped"})
		return
	}
	l.apply(context.Background(), Kill{})
}

// checkHeld looks at the pause and stop files of a held launch.
func (l *launch) checkHeld() {
	if l.m.State() != sandboxapi.StateHeld {
		l.holdTick.Stop()
		l.holdTick = nil
		return
	}
	switch {
	case fileExists(filepath.Join(l.dir, StopFileName)):
		l.step(context.Background(), StopAsked{Reason: sandboxapi.StopFile})
	case !fileExists(filepath.Join(l.dir, PauseFileName)):
		l.step(context.Background(), ContinueAsked{})
	}
}

func (l *launch) spawn() {
	hasCgroup := slices.Contains(l.s.modes, sandboxapi.ModeFreeze)
	hl, err := l.s.host.start(startSpec{
		id: l.id, argv: l.spec.Argv, dir: l.spec.Dir, env: l.spec.Env,
		output: filepath.Join(l.dir, OutputFile), cgroup: hasCgroup,
	})
	if err != nil {
		l.log.Error().Err(err).Msg("launch failed to start")
		l.step(context.Background(), SpawnFailed{Err: err.Error()})
		return
	}
	l.hl, l.exitC = hl, hl.exits()
	if l.mode == sandboxapi.ModeFreeze && hl.cgroupDir() == "" {
		l.log.Warn().Msg("launch runs without a cgroup: pausing in stop mode")
		l.mode = sandboxapi.ModeStop
	}
	l.log.Info().Int("pid", hl.pid()).Str("cgroup", hl.cgroupDir()).Stringer("mode", l.mode).Msg("launch started")
	l.step(context.Background(), Spawned{})
}

// persist writes the record from the machine.
func (l *launch) persist() {
	now := l.s.cfg.Now()
	l.mu.Lock()
	rec := l.rec
	l.mu.Unlock()
	rec.State, rec.Mode, rec.Updated = l.m.State(), l.mode, now
	rec.Pauses = l.m.Pauses(now)
	rec.Started, _ = l.m.Started()
	rec.Deadline, _ = l.m.Deadline()
	if l.hl != nil {
		rec.PID, rec.PIDStart, rec.Cgroup = l.hl.pid(), l.hl.pidStart(), l.hl.cgroupDir()
	}
	if rec.State == sandboxapi.StateEnded {
		out, code, sig, errText, timedOut := l.m.Result()
		ended, _, confirmed := l.m.Ended()
		rec.Receipt = &sandboxapi.Receipt{
			ID: l.id, Started: !rec.Started.IsZero(), ExitCode: code, Signal: sig, Outcome: out,
			StopReason: l.m.StopReason(), TimedOut: timedOut, CleanupConfirmed: confirmed,
			Error: errText, Ended: ended, Pauses: rec.Pauses, OutputTail: readTail(rec.Output, OutputTailBytes),
		}
	}
	// Durable: the launch accepted, started (its pid, for a restarted
	// supervisor), and its receipt. A pause's states are only replaced.
	durable := rec.State == sandboxapi.StateEnded || rec.Pauses.Count == 0 && rec.State != sandboxapi.StatePaused
	if err := writeRecord(l.dir, &rec, durable); err != nil {
		l.log.Error().Err(err).Msg("persist launch record")
	}
	l.mu.Lock()
	l.rec = rec
	l.mu.Unlock()
}

func (l *launch) handle(c command) {
	switch c.kind {
	case cmdBegin:
		err := l.step(c.ctx, Begin{
			StopFile:  fileExists(filepath.Join(l.dir, StopFileName)),
			PauseFile: fileExists(filepath.Join(l.dir, PauseFileName)),
		})
		c.reply <- result{err: err}
	case cmdPause:
		rep, err := l.pause(c)
		c.reply <- result{pause: rep, err: err}
	case cmdContinue:
		rep, err := l.resume(c)
		c.reply <- result{pause: rep, err: err}
	case cmdStop:
		if c.reason == sandboxapi.StopCancelled && l.m.State() == sandboxapi.StateRunning {
			l.log.Info().Msg("cancel: SIGKILL")
		}
		c.reply <- result{err: l.step(context.Background(), StopAsked{Reason: c.reason, Grace: c.grace})}
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// pause carries out a Pause request.
func (l *launch) pause(c command) (sandboxapi.PauseResult, error) {
	mode := c.mode
	if mode == sandboxapi.ModeDefault {
		mode = l.mode
	}
	rep := l.s.newPauseResult(l.id, "pause", mode)
	if mode != modeScan && !slices.Contains(l.s.modes, mode) || mode == sandboxapi.ModeFreeze && l.hl != nil && l.hl.cgroupDir() == "" {
		return rep, fmt.Errorf("%w: launch %s cannot pause in %s", ErrModeUnavailable, l.id, mode)
	}
	switch l.m.State() {
	case sandboxapi.StatePaused:
		return l.lastPause, nil
	case sandboxapi.StateRunning:
		if l.hl.exitedNow() {
			// It ended just before the pause: it keeps its result.
			l.awaitExit()
		}
	}
	if st := l.m.State(); st == sandboxapi.StateEnded {
		rep.State, rep.PauseSeq = st, l.m.Seq()
		return rep, nil
	}
	start := time.Now()
	ctx, cancel := context.WithCancelCause(c.ctx)
	l.abort.Store(&cancel)
	defer func() {
		l.abort.Store(nil)
		cancel(nil)
	}()
	l.lastOut, l.lastErr = pauseOutcome{}, nil
	err := l.step(ctx, PauseAsked{Mode: mode})
	rep.Wall, rep.Uptime = l.s.cfg.Now().UTC(), l.s.host.uptime()
	rep.TookMS = ms(time.Since(start))
	if err != nil {
		return rep, err
	}
	if l.lastOut.ended {
		l.awaitExit()
	}
	rep.State, rep.PauseSeq = l.m.State(), l.m.Seq()
	switch rep.State {
	case sandboxapi.StatePaused:
		rep.PIDCount, rep.PIDs, rep.Pending = l.lastOut.count, l.lastOut.pids, l.lastOut.pending
		rep.Frozen = l.lastOut.frozen
		l.lastPause = rep
		l.log.Info().Stringer("mode", mode).Int("seq", rep.PauseSeq).Int("pids", rep.PIDCount).Bool("frozen", rep.Frozen).
			Strs("pending", rep.Pending).Float64("took_ms", rep.TookMS).Msg("paused")
		return rep, nil
	case sandboxapi.StateRunning:
		rep.Fallback = l.lastOut.fallback
		if l.lastErr != nil {
			rep.Fallback = l.lastErr.Error()
		}
		rep.Pending = l.lastOut.pending
		if why := context.Cause(ctx); errors.Is(why, ErrStopping) {
			// A stop cut the pause short and undid it: the launch ends,
			// it did not fail to pause (a prepare waits for its end).
			l.log.Info().Stringer("mode", mode).Float64("took_ms", rep.TookMS).Msg("pause cut short by a stop")
			return rep, fmt.Errorf("%w: the pause was cut short by a stop", ErrStopping)
		}
		l.log.Warn().Stringer("mode", mode).Str("fallback", rep.Fallback).Float64("took_ms", rep.TookMS).Msg("pause not confirmed")
		return rep, fmt.Errorf("%w: %s", ErrUnconfirmed, rep.Fallback)
	}
	return rep, nil
}

// resume carries out a Continue request.
func (l *launch) resume(c command) (sandboxapi.PauseResult, error) {
	start := time.Now()
	rep := l.s.newPauseResult(l.id, "continue", l.m.PauseMode())
	var err error
	switch l.m.State() {
	case sandboxapi.StateHeld:
		if rerr := os.Remove(filepath.Join(l.dir, PauseFileName)); rerr != nil && !os.IsNotExist(rerr) {
			return rep, rerr
		}
		if fileExists(filepath.Join(l.dir, StopFileName)) {
			err = l.step(c.ctx, StopAsked{Reason: sandboxapi.StopFile})
		} else {
			err = l.step(c.ctx, ContinueAsked{})
		}
	case sandboxapi.StatePaused:
		rep.Frozen = l.lastOut.frozen
		l.lastResumed, l.lastErr = 0, nil
		err = l.step(c.ctx, ContinueAsked{})
		if err == nil && l.lastErr != nil {
			err = fmt.Errorf("%w: %w", ErrContinueFailed, l.lastErr)
		}
		rep.PIDCount = l.lastResumed
		if rep.PIDCount == 0 {
			rep.PIDCount = l.lastOut.count
		}
	}
	rep.State, rep.PauseSeq = l.m.State(), l.m.Seq()
	rep.Wall, rep.Uptime = l.s.cfg.Now().UTC(), l.s.host.uptime()
	rep.TookMS = ms(time.Since(start))
	if err == nil {
		l.log.Info().Int("seq", rep.PauseSeq).Stringer("state", rep.State).Float64("took_ms", rep.TookMS).Msg("continued")
	}
	return rep, err
}
