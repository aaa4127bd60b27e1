package agent

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// stallingOwner is the world's owner as the agent calls it, except that
// one call (stall: "seed" or "verify") gets no answer until its caller
// gives up: an owner still busy when the agent stops. It counts the
// sessions the agent closes.
type stallingOwner struct {
	Owner
	stall   string
	stalled chan struct{} // receives once the call hangs
	closes  atomic.Int32
}

func newStallingOwner(t *testing.T, w *world, stall string) *stallingOwner {
	t.Helper()
	c, err := ownerapi.NewClient(w.env.Conn, testRun, "o1")
	if err != nil {
		t.Fatal(err)
	}
	return &stallingOwner{Owner: c, stall: stall, stalled: make(chan struct{}, 1)}
}

func (o *stallingOwner) hang(ctx context.Context) error {
	select {
	case o.stalled <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ctx.Err() // as the service client returns it
}

func (o *stallingOwner) SeedSession(ctx context.Context, r ownerapi.SeedRequest) (ownerapi.SessionInfo, error) {
	if o.stall == "seed" {
		return ownerapi.SessionInfo{}, o.hang(ctx)
	}
	return o.Owner.SeedSession(ctx, r)
}

func (o *stallingOwner) VerifyEnd(ctx context.Context, r ownerapi.VerifyRequest) (ownerapi.VerifyResult, error) {
	if o.stall == "verify" {
		return ownerapi.VerifyResult{}, o.hang(ctx)
	}
	return o.Owner.VerifyEnd(ctx, r)
}

func (o *stallingOwner) CloseSession(ctx context.Context, id string) error {
	o.closes.Add(1)
	return o.Owner.CloseSession(ctx, id)
}

// stallingSandbox is a sandbox daemon whose launch request gets no answer
// until its caller gives up.
type stallingSandbox struct {
	*endlessSandbox
	stalled chan struct{}
}

func (s *stallingSandbox) Launch(ctx context.Context, _ sandboxapi.LaunchRequest) (sandboxapi.Record, error) {
	select {
	case s.stalled <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return sandboxapi.Record{}, ctx.Err()
}

// startAgent runs a second agent, a2, of the world with its own owner and
// sandbox services; stop ends its Run and returns once Run has.
func startAgent(t *testing.T, w *world, o Owner, sandboxes func(string) (Sandbox, error), opts ...func(*Config)) (a *Agent, stop func()) {
	t.Helper()
	cfg := Config{Run: testRun, Name: "a2", JS: w.env.JS, Bus: w.env.Bus, Owner: "o1", OwnerService: o,
		SandboxService: sandboxes, Adapter: testAdapter{}, Logger: testLogger(t)}
	for _, opt := range opts {
		opt(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	membertest.WaitRegistered(t, w.env, testRun, a.Name(), nil)
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		if err := <-done; err != nil {
			t.Errorf("agent a2: Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return a, stop
}

// stopDuring starts rollout r1 (attempt) on a, waits until stalled
// receives, stops the agent, and checks that the run ended as a crash
// ends it: with errShutdown, and no result remembered for the attempt.
func stopDuring(t *testing.T, a *Agent, stop func(), attempt int, stalled <-chan struct{}) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := a.Rollout(context.WithoutCancel(t.Context()), agentapi.Request{RolloutID: "r1", Attempt: attempt, Task: task})
		done <- err
	}()
	select {
	case <-stalled:
	case err := <-done:
		t.Fatalf("the rollout ended before its call stalled: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the rollout's call never stalled")
	}
	stop()
	if err := <-done; !errors.Is(err, errShutdown) {
		t.Errorf("a rollout cut off by the agent's stop: %v, want errShutdown", err)
	}
	a.mu.Lock()
	_, remembered := a.finished["r1"]
	a.mu.Unlock()
	if remembered {
		t.Error("the agent remembered a result for an attempt its stop cut off")
	}
}

// PROTOCOL §6: an agent that stops while the owner seeds a session
// touches nothing shared, as a crash would: it does not close the
// session.
func TestStoppingAgentDuringSeedClosesNoSession(t *testing.T) {
	w := newWorld(t)
	o := newStallingOwner(t, w, "seed")
	a, stop := startAgent(t, w, o, nil)
	stopDuring(t, a, stop, 0, o.stalled)
	if n := o.closes.Load(); n != 0 {
		t.Fatalf("%d sessions closed by an agent that was stopping, want none", n)
	}
}

// PROTOCOL §6: an agent that stops while it asks a daemon for a launch
// neither stops a launch nor closes the session.
func TestStoppingAgentDuringLaunchClosesNoSession(t *testing.T) {
	w := newWorld(t)
	o := newStallingOwner(t, w, "")
	sb := &stallingSandbox{endlessSandbox: newEndlessSandbox(), stalled: make(chan struct{}, 1)}
	a, stop := startAgent(t, w, o, func(string) (Sandbox, error) { return sb, nil })
	stopDuring(t, a, stop, 0, sb.stalled)
	if n := o.closes.Load(); n != 0 {
		t.Fatalf("%d sessions closed by an agent that was stopping, want none", n)
	}
	if n := sb.stops.Load(); n != 0 {
		t.Fatalf("%d launches stopped by an agent that was stopping, want none", n)
	}
	if _, ok := w.owner.Session("r1"); !ok {
		t.Fatal("the session is gone after the agent stopped")
	}
}

// PROTOCOL §6: an agent that stops while the owner grades the session
// leaves the session to the owner.
func TestStoppingAgentDuringVerifyClosesNoSession(t *testing.T) {
	w := newWorld(t)
	if _, err := w.owner.StartSession(t.Context(), "r1", events.Episode{Rollout: "r1", Attempt: 1}, provider.Spec{}); err != nil {
		t.Fatal(err)
	}
	o := newStallingOwner(t, w, "verify")
	a, stop := startAgent(t, w, o, nil)
	bm := agentapi.Bookmark{V: 1, Next: agentapi.StageVerify, Rollout: "r1", Task: task, Session: "r1", Owner: "o1",
		Answer: []byte(`"42"`), Launches: []agentapi.LaunchRecord{{ID: "r1.l1", Sandbox: "sb-r1", Ended: agentapi.LaunchFinished}}}
	if _, err := a.Install(t.Context(), events.Restore{}, []events.Record{record(t, "r1", bm)}); err != nil {
		t.Fatal(err)
	}
	stopDuring(t, a, stop, 1, o.stalled)
	if n := o.closes.Load(); n != 0 {
		t.Fatalf("%d sessions closed by an agent that was stopping, want none", n)
	}
	if _, ok := w.owner.Session("r1"); !ok {
		t.Fatal("the session is gone after the agent stopped")
	}
}

// losingOwner loses the answers of its first lose sandbox_access asks, as
// a server that went away loses a request or its answer: the caller's
// wait runs out.
type losingOwner struct {
	*stallingOwner
	lose int32
	asks atomic.Int32
}

func (o *losingOwner) SandboxAccess(ctx context.Context, id string) (ownerapi.SessionInfo, error) {
	if o.asks.Add(1) <= o.lose {
		return ownerapi.SessionInfo{}, fmt.Errorf("owner sandbox_access: %w", context.DeadlineExceeded)
	}
	return o.stallingOwner.Owner.SandboxAccess(ctx, id)
}

// An ask of the owner that goes unanswered is a fault of the bus, never
// the rollout's result (such as the owner's answer to sandbox_access lost
// in a restart of the NATS server): the launch stage runs again from its
// bookmark and launches, and the rollout does not end rollout_failed.
func TestUnansweredOwnerIsAskedAgain(t *testing.T) {
	w := newWorld(t)
	o := &losingOwner{stallingOwner: newStallingOwner(t, w, ""), lose: 2}
	sb := newEndlessSandbox()
	a, _ := startAgent(t, w, o, func(string) (Sandbox, error) { return sb, nil })
	ctx, cancel := context.WithCancel(t.Context())
	done := startEndlessOn(t, a, sb, ctx) // returns once it launched
	if n := o.asks.Load(); n != 3 {
		t.Errorf("%d sandbox_access asks, want 3 (two lost, one answered)", n)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled rollout: %v, want context.Canceled", err)
	}
}

// relaySandbox is an endless sandbox with a relay that is down for its
// first down status asks.
type relaySandbox struct {
	*endlessSandbox
	down     int32
	statuses atomic.Int32
}

func (s *relaySandbox) RelayStatus(context.Context) (sandboxapi.RelayStatus, error) {
	if s.statuses.Add(1) <= s.down {
		return sandboxapi.RelayStatus{}, nil
	}
	return sandboxapi.RelayStatus{Up: true, URL: "http://127.0.0.1:18480/v1"}, nil
}

func (s *relaySandbox) RepointWith(_ context.Context, rq sandboxapi.RepointRequest) (sandboxapi.RelayStatus, error) {
	url, gen := rq.URL, rq.Generation
	return sandboxapi.RelayStatus{Up: true, URL: "http://127.0.0.1:18480/v1", Upstream: url, Generation: gen,
		Capture: &sandboxapi.CaptureStatus{Path: "/capture.jsonl"}}, nil
}

// A relay that is there but not up is waited for: the launch stage runs
// again until it is, and the harness is launched through it, never around
// it (which would leave the rollout without its trajectory).
func TestUnreadyRelayIsWaitedFor(t *testing.T) {
	w := newWorld(t)
	sb := &relaySandbox{endlessSandbox: newEndlessSandbox(), down: 2}
	a, _ := startAgent(t, w, newStallingOwner(t, w, ""), func(string) (Sandbox, error) { return sb, nil },
		func(c *Config) { c.ModelURL = "http://model.invalid:1" })
	ctx, cancel := context.WithCancel(t.Context())
	done := startEndlessOn(t, a, sb.endlessSandbox, ctx)
	if n := sb.statuses.Load(); n != 3 {
		t.Errorf("%d relay_status asks, want 3 (two down, one up)", n)
	}
	a.mu.Lock()
	var rec agentapi.LaunchRecord
	for _, r := range a.runs {
		rec = r.bm.Launches[len(r.bm.Launches)-1]
	}
	a.mu.Unlock()
	if !rec.Captured {
		t.Errorf("launch %+v: want it captured by the relay", rec)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled rollout: %v, want context.Canceled", err)
	}
}
