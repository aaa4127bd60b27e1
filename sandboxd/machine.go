package sandboxd

import (
	"fmt"
	"slices"
	"time"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// successors lists the legal transitions: pending -> held | running |
// ended; held -> running | ended; running -> paused | stopping | ended;
// paused -> running | stopping | ended; stopping -> ended.
var successors = map[sandboxapi.State][]sandboxapi.State{
	sandboxapi.StatePending:  {sandboxapi.StateHeld, sandboxapi.StateRunning, sandboxapi.StateEnded},
	sandboxapi.StateHeld:     {sandboxapi.StateRunning, sandboxapi.StateEnded},
	sandboxapi.StateRunning:  {sandboxapi.StatePaused, sandboxapi.StateStopping, sandboxapi.StateEnded},
	sandboxapi.StatePaused:   {sandboxapi.StateRunning, sandboxapi.StateStopping, sandboxapi.StateEnded},
	sandboxapi.StateStopping: {sandboxapi.StateEnded},
}

// CheckTransition returns nil if from -> to is a legal transition, else an
// error wrapping ErrTransition that names both states.
func CheckTransition(from, to sandboxapi.State) error {
	if slices.Contains(successors[from], to) {
		return nil
	}
	return fmt.Errorf("%w from %s to %s", ErrTransition, from, to)
}

// Input is something that happens to a launch: a request, the result of an
// effect, the passing of time. Only this package's types implement it.
type Input interface{ input() }

// Begin starts the machine of a new launch; StopFile and PauseFile say
// which of the launch's files exist.
type Begin struct{ StopFile, PauseFile bool }

// Spawned reports that the launch's process started.
type Spawned struct{}

// SpawnFailed reports that the launch's process could not start.
type SpawnFailed struct{ Err string }

// PauseAsked is a pause request in Mode (resolved: never ModeDefault).
type PauseAsked struct{ Mode sandboxapi.Mode }

// PauseDone reports a DoPause: confirmed, or fallen back (and undone),
// or not attempted because the process had already exited (Ended: its exit
// follows as Exited, and the launch keeps its result).
type PauseDone struct {
	Mode      sandboxapi.Mode
	Confirmed bool
	Ended     bool
	// Frozen: a hold pause also froze the launch (Spec.Freeze).
	Frozen bool
}

// ContinueAsked is a continue request (the pause file is gone).
type ContinueAsked struct{}

// ContinueDone reports a DoContinue; !OK means the launch could not be
// continued and is killed.
type ContinueDone struct{ OK bool }

// StopAsked is a stop request: SIGINT and Grace before SIGKILL for a
// running launch (Grace 0: SIGKILL at once); a paused launch is killed at
// once, since it cannot act on SIGINT.
type StopAsked struct {
	Reason sandboxapi.StopReason
	Grace  time.Duration
}

// Tick is the timer the last SetTimer asked for.
type Tick struct{}

// Exited reports the end of the launch's process: its exit code, or the signal that
// killed it (Code -1).
type Exited struct {
	Code   int
	Signal string
}

// CleanedUp reports the kill of whatever the process left behind.
type CleanedUp struct{ Confirmed bool }

func (Begin) input()         {}
func (Spawned) input()       {}
func (SpawnFailed) input()   {}
func (PauseAsked) input()    {}
func (PauseDone) input()     {}
func (ContinueAsked) input() {}
func (ContinueDone) input()  {}
func (StopAsked) input()     {}
func (Tick) input()          {}
func (Exited) input()        {}
func (CleanedUp) input()     {}

// Effect is something the driver must do for the machine, in order.
type Effect interface{ effect() }

// Spawn: start the launch's process, then feed Spawned or SpawnFailed.
type Spawn struct{}

// DoPause: pause the launch in Mode as pause number Seq, then feed
// PauseDone.
type DoPause struct {
	Mode sandboxapi.Mode
	Seq  int
}

// DoContinue: continue the pause made in Mode, then feed ContinueDone.
type DoContinue struct{ Mode sandboxapi.Mode }

// Interrupt: send SIGINT to the launch's group and tree.
type Interrupt struct{}

// Kill: SIGKILL everything of the launch (cgroup.kill where it has one)
// and confirm; the process's exit then arrives as Exited.
type Kill struct{}

// Cleanup: kill whatever the process left behind, then feed CleanedUp.
type Cleanup struct{}

// SetTimer: feed Tick at At (the zero time cancels the timer).
type SetTimer struct{ At time.Time }

// Persist: write the launch record.
type Persist struct{}

// Hold: watch the pause and stop files of a held launch.
type Hold struct{}

// Done: the launch is over; its record is final.
type Done struct{}

func (Spawn) effect()      {}
func (DoPause) effect()    {}
func (DoContinue) effect() {}
func (Interrupt) effect()  {}
func (Kill) effect()       {}
func (Cleanup) effect()    {}
func (SetTimer) effect()   {}
func (Persist) effect()    {}
func (Hold) effect()       {}
func (Done) effect()       {}

// Machine is the launch lifecycle, a pure core: Step takes an input and
// the time, and returns what the driver must do. It does no I/O and reads
// no clock. It keeps the pause count, the pause sequence, the paused time
// (which never counts against the deadline) and how the launch ended.
type Machine struct {
	state   sandboxapi.State
	timeout time.Duration
	grace   time.Duration

	started     time.Time
	pausedSince time.Time
	pausedTotal time.Duration
	pauses      int
	seq         int
	pauseMode   sandboxapi.Mode
	frozen      bool
	fallbacks   int

	stop     sandboxapi.StopReason
	timedOut bool
	graceAt  time.Time
	killSent bool

	outcome          sandboxapi.Outcome
	exitCode         int
	signal           string
	err              string
	ended            time.Time
	cleanupDone      bool
	cleanupConfirmed bool
}

// NewMachine returns the machine of a launch with the given timeout (0:
// none), counted from its start with paused time excluded, and the grace
// a deadline stop gives between SIGINT and SIGKILL.
func NewMachine(timeout, grace time.Duration) *Machine {
	return &Machine{timeout: timeout, grace: grace, exitCode: -1}
}

// State returns the current state.
func (m *Machine) State() sandboxapi.State { return m.state }

// Deadline returns when the launch's deadline passes, given the pauses so
// far, and false when there is none (no timeout, not started, paused, or
// stopping).
func (m *Machine) Deadline() (time.Time, bool) {
	if m.timeout <= 0 || m.state != sandboxapi.StateRunning {
		return time.Time{}, false
	}
	return m.started.Add(m.timeout + m.pausedTotal), true
}

// Started returns when the launch's process started, and false if it has not.
func (m *Machine) Started() (time.Time, bool) { return m.started, !m.started.IsZero() }

// Pauses returns the pause statistics, counting a pause in progress up to
// now.
func (m *Machine) Pauses(now time.Time) sandboxapi.PauseStats {
	total := m.pausedTotal
	if m.state == sandboxapi.StatePaused {
		total += now.Sub(m.pausedSince)
	}
	return sandboxapi.PauseStats{
		Count: m.pauses, Seq: m.seq, Total: total, Since: m.pausedSince,
		Mode: m.pauseMode, Frozen: m.frozen, Fallbacks: m.fallbacks,
	}
}

// Seq returns the number of the current (or last) pause.
func (m *Machine) Seq() int { return m.seq }

// PauseMode returns the mode of the current (or last) pause.
func (m *Machine) PauseMode() sandboxapi.Mode { return m.pauseMode }

// StopReason returns why the launch is being or was stopped.
func (m *Machine) StopReason() sandboxapi.StopReason { return m.stop }

// Result returns how the launch ended (OutcomeNone until it has).
func (m *Machine) Result() (o sandboxapi.Outcome, code int, signal, err string, timedOut bool) {
	return m.outcome, m.exitCode, m.signal, m.err, m.timedOut
}

// Ended returns when the launch ended, and whether its cleanup is done and
// confirmed.
func (m *Machine) Ended() (at time.Time, cleanupDone, confirmed bool) {
	return m.ended, m.cleanupDone, m.cleanupConfirmed
}

func (m *Machine) to(s sandboxapi.State) error {
	if err := CheckTransition(m.state, s); err != nil {
		return err
	}
	m.state = s
	return nil
}

func (m *Machine) refuse(in Input) error {
	return fmt.Errorf("%w: %T in state %s", ErrTransition, in, m.state)
}

// creditPause ends the pause in progress, adding its time to the total.
func (m *Machine) creditPause(now time.Time) {
	if m.state == sandboxapi.StatePaused && !m.pausedSince.IsZero() {
		m.pausedTotal += now.Sub(m.pausedSince)
	}
	m.pausedSince = time.Time{}
}

// timer returns the SetTimer for the next thing that time decides.
func (m *Machine) timer() SetTimer {
	if at, ok := m.Deadline(); ok {
		return SetTimer{At: at}
	}
	if m.state == sandboxapi.StateStopping && !m.killSent && !m.graceAt.IsZero() {
		return SetTimer{At: m.graceAt}
	}
	return SetTimer{}
}

func (m *Machine) endUnstarted(now time.Time, r sandboxapi.StopReason) ([]Effect, error) {
	if err := m.to(sandboxapi.StateEnded); err != nil {
		return nil, err
	}
	m.stop, m.outcome, m.ended = r, sandboxapi.OutcomeInterrupted, now
	m.cleanupDone, m.cleanupConfirmed = true, true
	m.pausedSince = time.Time{}
	return []Effect{SetTimer{}, Persist{}, Done{}}, nil
}

func (m *Machine) beginStop(now time.Time, r sandboxapi.StopReason, grace time.Duration) ([]Effect, error) {
	wasPaused := m.state == sandboxapi.StatePaused
	m.creditPause(now)
	if err := m.to(sandboxapi.StateStopping); err != nil {
		return nil, err
	}
	m.stop = r
	if grace <= 0 || wasPaused {
		m.killSent = true
		return []Effect{SetTimer{}, Persist{}, Kill{}}, nil
	}
	m.graceAt = now.Add(grace)
	return []Effect{Persist{}, Interrupt{}, m.timer()}, nil
}

// Step applies in at time now and returns the effects, in order.
func (m *Machine) Step(now time.Time, in Input) ([]Effect, error) {
	switch in := in.(type) {
	case Begin:
		if m.state != sandboxapi.StatePending {
			return nil, m.refuse(in)
		}
		switch {
		case in.StopFile:
			return m.endUnstarted(now, sandboxapi.StopFile)
		case in.PauseFile:
			m.pauses++
			m.seq++
			return []Effect{Persist{}, Hold{}}, m.to(sandboxapi.StateHeld)
		}
		return []Effect{Spawn{}}, nil

	case Spawned:
		if err := m.to(sandboxapi.StateRunning); err != nil {
			return nil, err
		}
		m.started = now
		return []Effect{Persist{}, m.timer()}, nil

	case SpawnFailed:
		if m.state != sandboxapi.StatePending && m.state != sandboxapi.StateHeld {
			return nil, m.refuse(in)
		}
		if err := m.to(sandboxapi.StateEnded); err != nil {
			return nil, err
		}
		m.outcome, m.err, m.ended = sandboxapi.OutcomeFailed, in.Err, now
		m.cleanupDone, m.cleanupConfirmed = true, true
		return []Effect{Persist{}, Done{}}, nil

	case PauseAsked:
		switch m.state {
		case sandboxapi.StatePending, sandboxapi.StateHeld:
			// A pause before the start holds the launch until continue.
			m.pauses++
			m.seq++
			eff := []Effect{Persist{}, Hold{}}
			if m.state == sandboxapi.StatePending {
				return eff, m.to(sandboxapi.StateHeld)
			}
			return eff, nil
		case sandboxapi.StateRunning:
			return []Effect{DoPause{Mode: in.Mode, Seq: m.seq + 1}}, nil
		case sandboxapi.StateStopping:
			return nil, fmt.Errorf("%w (%s)", ErrStopping, m.stop)
		}
		return nil, nil // paused already, or ended: nothing to do

	case PauseDone:
		if m.state != sandboxapi.StateRunning {
			return nil, m.refuse(in)
		}
		if in.Ended {
			return nil, nil
		}
		if !in.Confirmed {
			m.fallbacks++
			return []Effect{Persist{}}, nil
		}
		if err := m.to(sandboxapi.StatePaused); err != nil {
			return nil, err
		}
		m.pauses++
		m.seq++
		m.pausedSince, m.pauseMode, m.frozen = now, in.Mode, in.Frozen
		return []Effect{SetTimer{}, Persist{}}, nil

	case ContinueAsked:
		switch m.state {
		case sandboxapi.StateHeld:
			return []Effect{Spawn{}}, nil
		case sandboxapi.StatePaused:
			return []Effect{DoContinue{Mode: m.pauseMode}}, nil
		}
		return nil, nil

	case ContinueDone:
		if m.state != sandboxapi.StatePaused {
			return nil, m.refuse(in)
		}
		if !in.OK {
			return m.beginStop(now, sandboxapi.StopContinueFailed, 0)
		}
		m.creditPause(now)
		if err := m.to(sandboxapi.StateRunning); err != nil {
			return nil, err
		}
		return []Effect{Persist{}, m.timer()}, nil

	case StopAsked:
		switch m.state {
		case sandboxapi.StatePending, sandboxapi.StateHeld:
			return m.endUnstarted(now, in.Reason)
		case sandboxapi.StateRunning, sandboxapi.StatePaused:
			return m.beginStop(now, in.Reason, in.Grace)
		case sandboxapi.StateStopping:
			if in.Grace <= 0 && !m.killSent {
				m.killSent = true
				return []Effect{SetTimer{}, Kill{}}, nil
			}
		}
		return nil, nil

	case Tick:
		switch m.state {
		case sandboxapi.StateRunning:
			if at, ok := m.Deadline(); ok && !now.Before(at) {
				m.timedOut = true
				return m.beginStop(now, sandboxapi.StopDeadline, m.grace)
			}
		case sandboxapi.StateStopping:
			if !m.killSent && !m.graceAt.IsZero() && !now.Before(m.graceAt) {
				m.killSent = true
				return []Effect{Kill{}}, nil
			}
		}
		return []Effect{m.timer()}, nil

	case Exited:
		switch m.state {
		case sandboxapi.StateRunning, sandboxapi.StatePaused, sandboxapi.StateStopping:
		default:
			return nil, m.refuse(in)
		}
		m.creditPause(now)
		m.exitCode, m.signal, m.ended = in.Code, in.Signal, now
		switch {
		case m.stop != sandboxapi.StopNone:
			m.outcome = sandboxapi.OutcomeInterrupted
		case in.Signal != "":
			m.outcome = sandboxapi.OutcomeFailed
			m.err = "process killed by " + in.Signal
		default:
			m.outcome = sandboxapi.OutcomeFinished
		}
		if err := m.to(sandboxapi.StateEnded); err != nil {
			return nil, err
		}
		return []Effect{SetTimer{}, Persist{}, Cleanup{}}, nil

	case CleanedUp:
		if m.state != sandboxapi.StateEnded || m.cleanupDone {
			return nil, m.refuse(in)
		}
		m.cleanupDone, m.cleanupConfirmed = true, in.Confirmed
		return []Effect{Persist{}, Done{}}, nil
	}
	return nil, fmt.Errorf("%w: unknown input %T", ErrTransition, in)
}
