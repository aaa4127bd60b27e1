package sandboxd

import (
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

// step is one line of a machine script: at time ms, feed in, expect the
// effects and the state after.
type step struct {
	ms    int
	in    Input
	want  []Effect
	state sandboxapi.State
	err   error
}

func runScript(t *testing.T, m *Machine, script []step) {
	t.Helper()
	for i, s := range script {
		got, err := m.Step(at(s.ms), s.in)
		if s.err != nil {
			if !errors.Is(err, s.err) {
				t.Fatalf("step %d (%T): err %v, want %v", i, s.in, err, s.err)
			}
		} else if err != nil {
			t.Fatalf("step %d (%T): %v", i, s.in, err)
		}
		if !reflect.DeepEqual(got, s.want) {
			t.Fatalf("step %d (%T): effects %#v, want %#v", i, s.in, got, s.want)
		}
		if m.State() != s.state {
			t.Fatalf("step %d (%T): state %s, want %s", i, s.in, m.State(), s.state)
		}
	}
}

// The launch lifecycle as PROTOCOL §6 (Stop, Pause modes) and the
// reference's launch record describe it.
func TestMachine(t *testing.T) {
	grace := 500 * time.Millisecond
	t.Run("finishes with its exit code", func(t *testing.T) {
		m := NewMachine(0, grace)
		runScript(t, m, []step{
			{0, Begin{}, []Effect{Spawn{}}, sandboxapi.StatePending, nil},
			{1, Spawned{}, []Effect{Persist{}, SetTimer{}}, sandboxapi.StateRunning, nil},
			{9, Exited{Code: 3}, []Effect{SetTimer{}, Persist{}, Cleanup{}}, sandboxapi.StateEnded, nil},
			{10, CleanedUp{Confirmed: true}, []Effect{Persist{}, Done{}}, sandboxapi.StateEnded, nil},
		})
		o, code, sig, _, timedOut := m.Result()
		if o != sandboxapi.OutcomeFinished || code != 3 || sig != "" || timedOut {
			t.Fatalf("result %v %d %q %v", o, code, sig, timedOut)
		}
	})
	t.Run("stop file: never starts", func(t *testing.T) {
		m := NewMachine(0, grace)
		runScript(t, m, []step{
			{0, Begin{StopFile: true, PauseFile: true}, []Effect{SetTimer{}, Persist{}, Done{}}, sandboxapi.StateEnded, nil},
		})
		if o, _, _, _, _ := m.Result(); o != sandboxapi.OutcomeInterrupted || m.StopReason() != sandboxapi.StopFile {
			t.Fatalf("outcome %v reason %v", o, m.StopReason())
		}
		if _, ok := m.Started(); ok {
			t.Fatal("started")
		}
	})
	t.Run("pause file holds until continue, then a stop file wins", func(t *testing.T) {
		m := NewMachine(0, grace)
		runScript(t, m, []step{
			{0, Begin{PauseFile: true}, []Effect{Persist{}, Hold{}}, sandboxapi.StateHeld, nil},
			{5, PauseAsked{Mode: sandboxapi.ModeFreeze}, []Effect{Persist{}, Hold{}}, sandboxapi.StateHeld, nil},
			{9, StopAsked{Reason: sandboxapi.StopFile}, []Effect{SetTimer{}, Persist{}, Done{}}, sandboxapi.StateEnded, nil},
		})
		if p := m.Pauses(at(9)); p.Count != 2 || p.Seq != 2 {
			t.Fatalf("pauses %+v", p)
		}
	})
	t.Run("held launch starts on continue", func(t *testing.T) {
		m := NewMachine(0, grace)
		runScript(t, m, []step{
			{0, PauseAsked{Mode: sandboxapi.ModeStop}, []Effect{Persist{}, Hold{}}, sandboxapi.StateHeld, nil},
			{5, ContinueAsked{}, []Effect{Spawn{}}, sandboxapi.StateHeld, nil},
			{6, Spawned{}, []Effect{Persist{}, SetTimer{}}, sandboxapi.StateRunning, nil},
		})
	})
	t.Run("paused time does not count against the deadline", func(t *testing.T) {
		m := NewMachine(time.Second, grace)
		runScript(t, m, []step{
			{0, Begin{}, []Effect{Spawn{}}, sandboxapi.StatePending, nil},
			{0, Spawned{}, []Effect{Persist{}, SetTimer{At: at(1000)}}, sandboxapi.StateRunning, nil},
			{400, PauseAsked{Mode: sandboxapi.ModeFreeze}, []Effect{DoPause{Mode: sandboxapi.ModeFreeze, Seq: 1}}, sandboxapi.StateRunning, nil},
			{400, PauseDone{Mode: sandboxapi.ModeFreeze, Confirmed: true}, []Effect{SetTimer{}, Persist{}}, sandboxapi.StatePaused, nil},
			// A timer that fires while paused does nothing.
			{1000, Tick{}, []Effect{SetTimer{}}, sandboxapi.StatePaused, nil},
			{2400, ContinueAsked{}, []Effect{DoContinue{Mode: sandboxapi.ModeFreeze}}, sandboxapi.StatePaused, nil},
			{2400, ContinueDone{OK: true}, []Effect{Persist{}, SetTimer{At: at(3000)}}, sandboxapi.StateRunning, nil},
			{2999, Tick{}, []Effect{SetTimer{At: at(3000)}}, sandboxapi.StateRunning, nil},
			{3000, Tick{}, []Effect{Persist{}, Interrupt{}, SetTimer{At: at(3500)}}, sandboxapi.StateStopping, nil},
			{3500, Tick{}, []Effect{Kill{}}, sandboxapi.StateStopping, nil},
			{3510, Exited{Code: -1, Signal: "SIGKILL"}, []Effect{SetTimer{}, Persist{}, Cleanup{}}, sandboxapi.StateEnded, nil},
		})
		o, _, _, _, timedOut := m.Result()
		if o != sandboxapi.OutcomeInterrupted || !timedOut || m.StopReason() != sandboxapi.StopDeadline {
			t.Fatalf("outcome %v timedOut %v reason %v", o, timedOut, m.StopReason())
		}
		if p := m.Pauses(at(3510)); p.Count != 1 || p.Total != 2*time.Second {
			t.Fatalf("pauses %+v", p)
		}
	})
	t.Run("an unconfirmed pause leaves it running", func(t *testing.T) {
		m := NewMachine(time.Second, grace)
		runScript(t, m, []step{
			{0, Begin{}, []Effect{Spawn{}}, sandboxapi.StatePending, nil},
			{0, Spawned{}, []Effect{Persist{}, SetTimer{At: at(1000)}}, sandboxapi.StateRunning, nil},
			{10, PauseAsked{Mode: sandboxapi.ModeStop}, []Effect{DoPause{Mode: sandboxapi.ModeStop, Seq: 1}}, sandboxapi.StateRunning, nil},
			{20, PauseDone{Mode: sandboxapi.ModeStop}, []Effect{Persist{}}, sandboxapi.StateRunning, nil},
			{30, PauseAsked{Mode: sandboxapi.ModeStop}, []Effect{DoPause{Mode: sandboxapi.ModeStop, Seq: 1}}, sandboxapi.StateRunning, nil},
			{40, PauseDone{Mode: sandboxapi.ModeStop, Ended: true}, nil, sandboxapi.StateRunning, nil},
		})
		if p := m.Pauses(at(40)); p.Count != 0 || p.Fallbacks != 1 {
			t.Fatalf("pauses %+v", p)
		}
	})
	t.Run("pause is idempotent; a stopping launch refuses it", func(t *testing.T) {
		m := NewMachine(0, grace)
		runScript(t, m, []step{
			{0, Begin{}, []Effect{Spawn{}}, sandboxapi.StatePending, nil},
			{0, Spawned{}, []Effect{Persist{}, SetTimer{}}, sandboxapi.StateRunning, nil},
			{1, PauseAsked{Mode: sandboxapi.ModeHold}, []Effect{DoPause{Mode: sandboxapi.ModeHold, Seq: 1}}, sandboxapi.StateRunning, nil},
			{1, PauseDone{Mode: sandboxapi.ModeHold, Confirmed: true}, []Effect{SetTimer{}, Persist{}}, sandboxapi.StatePaused, nil},
			{2, PauseAsked{Mode: sandboxapi.ModeHold}, nil, sandboxapi.StatePaused, nil},
			{3, ContinueAsked{}, []Effect{DoContinue{Mode: sandboxapi.ModeHold}}, sandboxapi.StatePaused, nil},
			{3, ContinueDone{OK: true}, []Effect{Persist{}, SetTimer{}}, sandboxapi.StateRunning, nil},
			{4, ContinueAsked{}, nil, sandboxapi.StateRunning, nil},
			{5, StopAsked{Reason: sandboxapi.StopRequested, Grace: grace}, []Effect{Persist{}, Interrupt{}, SetTimer{At: at(505)}}, sandboxapi.StateStopping, nil},
			{6, PauseAsked{Mode: sandboxapi.ModeStop}, nil, sandboxapi.StateStopping, ErrStopping},
			// Cancel while stopping escalates to SIGKILL at once.
			{7, StopAsked{Reason: sandboxapi.StopCancelled}, []Effect{SetTimer{}, Kill{}}, sandboxapi.StateStopping, nil},
			{8, StopAsked{Reason: sandboxapi.StopCancelled}, nil, sandboxapi.StateStopping, nil},
			{9, Exited{Code: 130}, []Effect{SetTimer{}, Persist{}, Cleanup{}}, sandboxapi.StateEnded, nil},
		})
		if o, code, _, _, _ := m.Result(); o != sandboxapi.OutcomeInterrupted || code != 130 {
			t.Fatalf("outcome %v code %d", o, code)
		}
	})
	t.Run("a paused launch is killed at once on stop", func(t *testing.T) {
		m := NewMachine(0, grace)
		runScript(t, m, []step{
			{0, Begin{}, []Effect{Spawn{}}, sandboxapi.StatePending, nil},
			{0, Spawned{}, []Effect{Persist{}, SetTimer{}}, sandboxapi.StateRunning, nil},
			{1, PauseAsked{Mode: sandboxapi.ModeFreeze}, []Effect{DoPause{Mode: sandboxapi.ModeFreeze, Seq: 1}}, sandboxapi.StateRunning, nil},
			{1, PauseDone{Mode: sandboxapi.ModeFreeze, Confirmed: true}, []Effect{SetTimer{}, Persist{}}, sandboxapi.StatePaused, nil},
			{50, StopAsked{Reason: sandboxapi.StopRequested, Grace: grace}, []Effect{SetTimer{}, Persist{}, Kill{}}, sandboxapi.StateStopping, nil},
			{51, Exited{Code: -1, Signal: "SIGKILL"}, []Effect{SetTimer{}, Persist{}, Cleanup{}}, sandboxapi.StateEnded, nil},
		})
		if p := m.Pauses(at(51)); p.Total != 49*time.Millisecond {
			t.Fatalf("paused %v", p.Total)
		}
	})
	t.Run("continue that fails kills", func(t *testing.T) {
		m := NewMachine(0, grace)
		runScript(t, m, []step{
			{0, Begin{}, []Effect{Spawn{}}, sandboxapi.StatePending, nil},
			{0, Spawned{}, []Effect{Persist{}, SetTimer{}}, sandboxapi.StateRunning, nil},
			{1, PauseAsked{Mode: sandboxapi.ModeFreeze}, []Effect{DoPause{Mode: sandboxapi.ModeFreeze, Seq: 1}}, sandboxapi.StateRunning, nil},
			{1, PauseDone{Mode: sandboxapi.ModeFreeze, Confirmed: true}, []Effect{SetTimer{}, Persist{}}, sandboxapi.StatePaused, nil},
			{2, ContinueAsked{}, []Effect{DoContinue{Mode: sandboxapi.ModeFreeze}}, sandboxapi.StatePaused, nil},
			{3, ContinueDone{OK: false}, []Effect{SetTimer{}, Persist{}, Kill{}}, sandboxapi.StateStopping, nil},
		})
		if m.StopReason() != sandboxapi.StopContinueFailed {
			t.Fatal(m.StopReason())
		}
	})
	t.Run("killed by a signal nobody sent: failed", func(t *testing.T) {
		m := NewMachine(0, grace)
		runScript(t, m, []step{
			{0, Begin{}, []Effect{Spawn{}}, sandboxapi.StatePending, nil},
			{0, Spawned{}, []Effect{Persist{}, SetTimer{}}, sandboxapi.StateRunning, nil},
			{1, Exited{Code: -1, Signal: "SIGSEGV"}, []Effect{SetTimer{}, Persist{}, Cleanup{}}, sandboxapi.StateEnded, nil},
		})
		if o, _, _, _, _ := m.Result(); o != sandboxapi.OutcomeFailed {
			t.Fatal(o)
		}
	})
	t.Run("start failure", func(t *testing.T) {
		m := NewMachine(0, grace)
		runScript(t, m, []step{
			{0, Begin{}, []Effect{Spawn{}}, sandboxapi.StatePending, nil},
			{0, SpawnFailed{Err: "no such file"}, []Effect{Persist{}, Done{}}, sandboxapi.StateEnded, nil},
			{1, Spawned{}, nil, sandboxapi.StateEnded, ErrTransition},
		})
	})
}

func TestCheckTransition(t *testing.T) {
	for from := sandboxapi.StatePending; from <= sandboxapi.StateEnded; from++ {
		for to := sandboxapi.StatePending; to <= sandboxapi.StateEnded; to++ {
			err := CheckTransition(from, to)
			legal := false
			for _, s := range successors[from] {
				legal = legal || s == to
			}
			if legal != (err == nil) {
				t.Errorf("%s -> %s: %v", from, to, err)
			}
			if err != nil && !errors.Is(err, ErrTransition) {
				t.Errorf("%s -> %s: %v is not ErrTransition", from, to, err)
			}
		}
	}
}

// classifyThread and classifyProcess decide when a stop-mode pause is
// confirmed (docs/SANDBOXD.md, Pausing: the multi-threaded trap, vfork
// parents, D with a stop pending).
func TestClassify(t *testing.T) {
	threads := []struct {
		state                             byte
		leaderStopped, pending, vforkWait bool
		want                              threadClass
	}{
		{'T', false, false, false, threadStopped},
		{'t', false, false, false, threadStopped},
		{'Z', false, false, false, threadGone},
		{'X', false, false, false, threadGone},
		{'R', true, true, true, threadRunning},
		{'S', true, false, false, threadRunning},
		{'D', false, false, false, threadHoldoutD},
		{'D', true, false, false, threadPausedD},  // group stop under way
		{'D', false, true, false, threadPausedD},  // SIGSTOP pending
		{'D', false, false, true, threadPausedD},  // vfork parent
		{'I', false, false, false, threadRunning}, // anything else: not stopped
	}
	for _, c := range threads {
		if got := classifyThread(c.state, c.leaderStopped, c.pending, c.vforkWait); got != c.want {
			t.Errorf("classifyThread(%c, %v, %v, %v) = %d, want %d", c.state, c.leaderStopped, c.pending, c.vforkWait, got, c.want)
		}
	}
	procs := []struct {
		threads []threadClass
		want    procClass
	}{
		{[]threadClass{threadStopped}, procPaused},
		{[]threadClass{threadGone}, procGone},
		{nil, procGone},
		// The trap: the leader is stopped, one thread still runs.
		{[]threadClass{threadStopped, threadStopped, threadRunning}, procPending},
		{[]threadClass{threadStopped, threadPausedD}, procPausedD},
		{[]threadClass{threadGone, threadStopped}, procPaused},
		{[]threadClass{threadStopped, threadHoldoutD}, procHoldoutD},
		{[]threadClass{threadHoldoutD, threadRunning}, procPending},
	}
	for _, c := range procs {
		if got := classifyProcess(c.threads); got != c.want {
			t.Errorf("classifyProcess(%v) = %d, want %d", c.threads, got, c.want)
		}
	}
}

func TestValidate(t *testing.T) {
	for _, id := range []string{"a", "run-1.a_b", "X9"} {
		if err := ValidateID(id); err != nil {
			t.Errorf("ValidateID(%q): %v", id, err)
		}
	}
	for _, id := range []string{"", ".", "..", "-a", "a/b", "a b", string(make([]byte, 129))} {
		if err := ValidateID(id); !errors.Is(err, ErrInvalidSpec) {
			t.Errorf("ValidateID(%q) = %v", id, err)
		}
	}
	if err := (Spec{ID: "a"}).Validate(); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("spec without command: %v", err)
	}
	if err := (Spec{ID: "a", Command: "x", Argv: []string{"y"}}).Validate(); !errors.Is(err, ErrInvalidSpec) {
		t.Errorf("spec with both: %v", err)
	}
	if err := (Config{}).Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("empty config: %v", err)
	}
	if err := (Config{StateDir: "/x", Grace: -1, CgroupRoot: "rel"}).Validate(); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bad config: %v", err)
	}
}
