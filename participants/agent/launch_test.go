package agent

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// endlessSandbox is a sandbox daemon, as the agent calls it, whose
// launches run until they are stopped: a wait for a receipt holds until
// its caller gives up. It counts the waits in flight and the stops, and
// notes a stop that came while a wait was in flight.
type endlessSandbox struct {
	waiting   atomic.Int32
	stops     atomic.Int32
	stopEarly atomic.Bool   // a stop while a receipt wait was in flight
	waited    chan struct{} // receives once a wait is in flight
	stopped   chan struct{} // closed by the first stop
	once      sync.Once
}

func newEndlessSandbox() *endlessSandbox {
	return &endlessSandbox{waited: make(chan struct{}, 1), stopped: make(chan struct{})}
}

func (s *endlessSandbox) Launch(_ context.Context, r sandboxapi.LaunchRequest) (sandboxapi.Record, error) {
	return sandboxapi.Record{V: 1, ID: r.LaunchID, Argv: r.Argv, State: sandboxapi.StateRunning}, nil
}

func (s *endlessSandbox) Status(_ context.Context, id string) (sandboxapi.Record, error) {
	return sandboxapi.Record{V: 1, ID: id, State: sandboxapi.StateRunning}, nil
}

func (s *endlessSandbox) Stop(_ context.Context, id string, _ bool) (sandboxapi.Receipt, error) {
	if s.waiting.Load() > 0 {
		s.stopEarly.Store(true)
	}
	s.stops.Add(1)
	s.once.Do(func() { close(s.stopped) })
	return sandboxapi.Receipt{ID: id, ExitCode: -1, Outcome: sandboxapi.OutcomeInterrupted, StopReason: sandboxapi.StopCancelled,
		Ended: time.Now()}, nil
}

// WaitReceipt holds until its caller gives up, then lingers until a stop
// comes or a moment has passed: a run whose cleanup stops the launch
// while its receipt watcher still waits would be seen here, every time.
func (s *endlessSandbox) WaitReceipt(ctx context.Context, _ string, _ time.Duration) (sandboxapi.Receipt, error) {
	s.waiting.Add(1)
	defer s.waiting.Add(-1)
	select {
	case s.waited <- struct{}{}:
	default:
	}
	<-ctx.Done()
	select {
	case <-s.stopped:
	case <-time.After(50 * time.Millisecond):
	}
	return sandboxapi.Receipt{}, ctx.Err()
}

// startEndless starts a rollout whose launch never ends and returns once
// the agent waits for its receipt; the rollout's error comes on the
// channel, which the test must read.
func startEndless(t *testing.T, w *world, sb *endlessSandbox, ctx context.Context) <-chan error {
	t.Helper()
	return startEndlessOn(t, w.agent, sb, ctx)
}

// startEndlessOn is startEndless on agent a.
func startEndlessOn(t *testing.T, a *Agent, sb *endlessSandbox, ctx context.Context) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := a.Rollout(ctx, agentapi.Request{RolloutID: "r1", Task: task})
		done <- err
	}()
	select {
	case <-sb.waited:
	case err := <-done:
		t.Fatalf("the rollout ended before its launch was waited for: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the agent never waited for the launch's receipt")
	}
	return done
}

// A rollout cancelled by its caller stops the wait for its launch's
// receipt before the cleanup rule kills the launch, and returns after
// both.
func TestCancelledRolloutStopsItsReceiptWatcher(t *testing.T) {
	sb := newEndlessSandbox()
	w := newWorldWith(t, false, func(string) (Sandbox, error) { return sb, nil })
	ctx, cancel := context.WithCancel(t.Context())
	done := startEndless(t, w, sb, ctx)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled rollout: %v, want context.Canceled", err)
	}
	if n := sb.waiting.Load(); n != 0 {
		t.Fatalf("%d receipt waits still in flight after the rollout returned", n)
	}
	if n := sb.stops.Load(); n != 1 {
		t.Fatalf("%d stops, want the cancelled launch killed once", n)
	}
	if sb.stopEarly.Load() {
		t.Fatal("the launch was stopped while the run's receipt watcher still waited")
	}
}

// An agent that stops returns from Run only once every run's receipt
// watcher has stopped; like a crash, it does not stop the launch.
func TestStoppedAgentStopsItsReceiptWatchers(t *testing.T) {
	sb := newEndlessSandbox()
	var done <-chan error
	t.Cleanup(func() {
		// After the world's cleanups: the agent's Run has returned.
		if n := sb.waiting.Load(); n != 0 {
			t.Errorf("%d receipt waits still in flight after Run returned", n)
		}
		if n := sb.stops.Load(); n != 0 {
			t.Errorf("%d stops by an agent that was shutting down, want none", n)
		}
		if err := <-done; !errors.Is(err, errShutdown) {
			t.Errorf("a rollout cut off by the agent's stop: %v, want errShutdown", err)
		}
	})
	w := newWorldWith(t, false, func(string) (Sandbox, error) { return sb, nil })
	// Not the test's context, which ends before the cleanups: only the
	// agent's stop ends this rollout.
	done = startEndless(t, w, sb, context.WithoutCancel(t.Context()))
}

// A launch's relay edits must be known, and need a relay to apply them;
// a launch that names none needs neither.
func TestCheckRelayEdits(t *testing.T) {
	known := relay.EditNames()
	if len(known) == 0 {
		t.Fatal("no relay edit registered")
	}
	for _, c := range []struct {
		edits []string
		relay bool
		want  string
	}{
		{nil, false, ""},
		{nil, true, ""},
		{known[:1], true, ""},
		{known[:1], false, "no model relay"},
		{[]string{"no-such-edit"}, true, "no-such-edit"},
	} {
		err := checkRelayEdits(c.edits, c.relay)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("edits %v, relay %v: %v, want %q", c.edits, c.relay, err, c.want)
		}
	}
}
