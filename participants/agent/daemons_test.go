package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/jetstream/live"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// heartbeat puts sandbox id's daemon heartbeat in sp_daemons, as a
// running daemon does; dies deletes it, as the owner does.
func heartbeat(t *testing.T, w *world, id string) (dies func()) {
	t.Helper()
	m, err := events.NewMember(events.KindSandbox, id)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(events.MemberInfo{Run: testRun, Member: m, Instance: "daemon-1", Started: time.Now(), Heartbeat: time.Now()})
	key := events.MemberKey(testRun, m)
	if _, err := w.env.Bus.Daemons.Put(t.Context(), key, b); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := w.env.Bus.Daemons.Delete(t.Context(), key); err != nil {
			t.Fatal(err)
		}
	}
}

// sandboxOf returns the sandbox the owner lent session r1.
func sandboxOf(t *testing.T, w *world) string {
	t.Helper()
	s, ok := w.owner.Session("r1")
	if !ok {
		t.Fatal("the owner holds no session r1")
	}
	return s.Sandbox.ID
}

// A launch whose sandbox's daemon goes (its heartbeat expired or was
// deleted) is lost: the rollout ends sandbox_lost, for its controller to
// start it over one attempt later, without asking the dead daemon to stop
// it, and its session is closed.
func TestLostDaemonLosesTheLaunch(t *testing.T) {
	sb := newEndlessSandbox()
	w := newWorldWith(t, false, func(string) (Sandbox, error) { return sb, nil })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	done := startEndless(t, w, sb, ctx)
	dies := heartbeat(t, w, sandboxOf(t, w))
	select {
	case err := <-done:
		t.Fatalf("the rollout ended while its daemon lived: %v", err)
	default:
	}
	dies()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		t.Fatal("the rollout did not end after its sandbox's daemon went")
	}
	if !errors.Is(err, errSandboxLost) {
		t.Fatalf("rollout: %v, want errSandboxLost", err)
	}
	if status, code := classify(err); status != 409 || code != agentapi.CodeSandboxLost {
		t.Fatalf("classify: %d %s, want 409 %s", status, code, agentapi.CodeSandboxLost)
	}
	if n := sb.stops.Load(); n != 0 {
		t.Fatalf("%d stops sent to a daemon that is gone, want none", n)
	}
	poll.Wait(t, 10*time.Second, "the lost attempt's session to be closed", func() bool {
		_, ok := w.owner.Session("r1")
		return !ok
	})
}

// A checkpoint does not wait on a dead daemon: the run whose launch waits
// for its sandbox's pause ack is ready once the daemon's heartbeat goes,
// at its launch bookmark (a restore relaunches it on its saved session in
// a fork), and after the resume it finds the sandbox lost.
func TestLostDaemonDoesNotHoldThePrepare(t *testing.T) {
	sb := newEndlessSandbox()
	w := newWorldWith(t, false, func(string) (Sandbox, error) { return sb, nil })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	done := startEndless(t, w, sb, ctx)
	dies := heartbeat(t, w, sandboxOf(t, w))

	cp := member.Checkpoint{Run: testRun, ID: "c1", Seq: 1, Deadline: time.Now().Add(time.Minute)}
	rep, err := w.agent.Prepare(ctx, cp)
	if err != nil || rep.Ready {
		t.Fatalf("prepare with the launch running and no pause ack: %+v %v, want not ready", rep, err)
	}
	dies()
	poll.Wait(t, 20*time.Second, "the agent to be ready without the dead daemon's ack", func() bool {
		rep, err = w.agent.Prepare(ctx, cp)
		return err == nil && rep.Ready
	})
	if rep.Counts["parked"] != 1 {
		t.Fatalf("prepare: %+v, want the run parked at its bookmark", rep)
	}
	recs, err := membertest.Drain(w.agent.Export(ctx, events.Commit{PhaseHeader: events.PhaseHeader{Run: testRun, CheckpointID: "c1", Seq: 2}}))
	if err != nil || len(recs) != 1 {
		t.Fatalf("export: %v %v", recs, err)
	}
	bm, err := agentapi.DecodeBookmark(recs[0].Data)
	if err != nil {
		t.Fatal(err)
	}
	if last := bm.Launches[len(bm.Launches)-1]; bm.Next != agentapi.StageLaunch || last.Ended != agentapi.LaunchFailed {
		t.Fatalf("exported %+v, want its launch bookmark with the lost launch failed", bm)
	}
	select {
	case err := <-done:
		t.Fatalf("the rollout ended under the checkpoint: %v", err)
	default:
	}
	if err := w.agent.Resume(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-done:
	case <-ctx.Done():
		t.Fatal("the rollout did not end after the resume")
	}
	if !errors.Is(err, errSandboxLost) {
		t.Fatalf("rollout after the resume: %v, want errSandboxLost", err)
	}
	if n := sb.stops.Load(); n != 0 {
		t.Fatalf("%d stops sent to a daemon that is gone, want none", n)
	}
}

// A daemon that stops answering while its heartbeat lives on (a sandbox
// daemon's lives 2 minutes) is taken for gone by the wait for its pause
// ack, which asks it whether it is there: the run is ready, parked at its
// launch bookmark, and after the resume it finds the sandbox lost at once,
// rather than asking the missing daemon for a launch for DaemonWait.
func TestSilentDaemonIsLostAfterTheResume(t *testing.T) {
	sb := newEndlessSandbox()
	w := newWorldWith(t, false, func(string) (Sandbox, error) { return sb, nil })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	done := startEndless(t, w, sb, ctx)
	heartbeat(t, w, sandboxOf(t, w)) // registered, and never expires here; nothing answers its alive subject

	cp := member.Checkpoint{Run: testRun, ID: "c1", Seq: 1, Deadline: time.Now().Add(time.Minute)}
	var rep member.Report
	poll.Wait(t, 30*time.Second, "the agent to be ready without the silent daemon's ack", func() bool {
		var err error
		rep, err = w.agent.Prepare(ctx, cp)
		return err == nil && rep.Ready
	})
	if rep.Counts["parked"] != 1 {
		t.Fatalf("prepare: %+v, want the run parked at its bookmark", rep)
	}
	if _, err := membertest.Drain(w.agent.Export(ctx, events.Commit{PhaseHeader: events.PhaseHeader{Run: testRun, CheckpointID: "c1", Seq: 2}})); err != nil {
		t.Fatal(err)
	}
	if err := w.agent.Resume(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(15 * time.Second):
		t.Fatal("the rollout did not end within 15 s of the resume: it waits on the silent daemon")
	}
	if !errors.Is(err, errSandboxLost) {
		t.Fatalf("rollout after the resume: %v, want errSandboxLost", err)
	}
}

// A session the owner does not know when the run asks for its sandbox
// (an owner that restarted since the seed lost it) is a lost sandbox, not
// a failed rollout: the controller starts the rollout over.
func TestSessionUnknownToTheOwnerIsLost(t *testing.T) {
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	bm := agentapi.Bookmark{V: 1, Next: agentapi.StageLaunch, Rollout: "r1", Task: task, Session: "r1", Owner: "o1",
		Sandbox: "sb-gone", VerifyMode: "owner", State: json.RawMessage(`{"data_dir":"/var/lib/test-harness/r1"}`)}
	if _, err := w.agent.Install(ctx, events.Restore{}, []events.Record{record(t, "r1", bm)}); err != nil {
		t.Fatal(err)
	}
	_, err := w.agent.Rollout(ctx, agentapi.Request{RolloutID: "r1", Attempt: 1, Task: task})
	if !errors.Is(err, errSandboxLost) {
		t.Fatalf("rollout of a session the owner does not know: %v, want errSandboxLost", err)
	}
	if _, code := classify(err); code != agentapi.CodeSandboxLost {
		t.Fatalf("code %s, want %s", code, agentapi.CodeSandboxLost)
	}
}

// The book takes a daemon for gone when the owner deletes its key, and when
// its last heartbeat has lived the bucket's TTL: an expired key of
// sp_daemons leaves no marker to hear. A daemon that heartbeats again is
// back.
func TestDaemonBookExpiry(t *testing.T) {
	env := jstest.Start(t)
	ctx := t.Context()
	var offset atomic.Int64
	b := newDaemonBook(testRun)
	b.now = func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	if err := b.watch(ctx, env.Bus, false); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.close)
	put := func(id string) {
		m, _ := events.NewMember(events.KindSandbox, id)
		v, _ := json.Marshal(events.MemberInfo{Run: testRun, Member: m, Instance: "i1"})
		if _, err := env.Bus.Daemons.Put(ctx, events.MemberKey(testRun, m), v); err != nil {
			t.Fatal(err)
		}
	}
	put("sb-quiet")
	put("sb-stopped")
	poll.Wait(t, 10*time.Second, "the book to hear both heartbeats", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.stored) == 2
	})
	quiet := b.goneCh("sb-quiet")
	if err := env.Bus.Daemons.Delete(ctx, events.MemberKey(testRun, "sandbox.sb-stopped")); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 10*time.Second, "the deleted daemon to be gone", func() bool { return b.isGone("sb-stopped") })
	b.sweep()
	if b.isGone("sb-quiet") {
		t.Fatal("a daemon whose heartbeat is fresh is gone")
	}
	offset.Store(int64(jetstream.DefaultSandboxTTL))
	b.sweep()
	select {
	case <-quiet:
	default:
		t.Fatal("a daemon whose heartbeat lived its TTL is not gone")
	}
	offset.Store(0)
	put("sb-quiet")
	poll.Wait(t, 10*time.Second, "the daemon that heartbeats again to be back", func() bool { return !b.isGone("sb-quiet") })
}

// A stage that fails on its sandbox itself ends the attempt sandbox_lost:
// its daemon gone, a daemon that never answered a launch, an init that
// exited; any other failure, or a run cancelled, keeps its error.
func TestLostOr(t *testing.T) {
	a := &Agent{daemons: newDaemonBook(testRun)}
	a.daemons.set("sb-dead", true)
	other := errors.New("the harness's model is down")
	exited := &jetstream.ServiceError{Status: 409, Code: codeOwnerSandboxExited, Detail: "sandbox exited"}
	live := func() *run { return &run{ctx: context.Background()} }
	cancelled := func() *run {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		return &run{ctx: ctx}
	}
	launch := func(sb string) agentapi.Bookmark { return agentapi.Bookmark{Next: agentapi.StageLaunch, Sandbox: sb} }
	for _, c := range []struct {
		name string
		r    *run
		bm   agentapi.Bookmark
		err  error
		lost bool
	}{
		{"daemon gone", live(), launch("sb-dead"), other, true},
		{"daemon never answered", live(), launch("sb-live"), fmt.Errorf("resume decision: %w", nats.ErrNoResponders), true},
		{"init exited at the grade", live(), agentapi.Bookmark{Next: agentapi.StageVerify, Sandbox: "sb-live"}, exited, true},
		{"another failure", live(), launch("sb-live"), other, false},
		{"no responders at the seed", live(), agentapi.Bookmark{Next: agentapi.StageSeed}, nats.ErrNoResponders, false},
		{"cancelled", cancelled(), launch("sb-dead"), other, false},
	} {
		got := a.lostOr(c.r, c.bm, c.err)
		if errors.Is(got, errSandboxLost) != c.lost || !errors.Is(got, c.err) {
			t.Errorf("%s: %v, want lost %v, wrapping %v", c.name, got, c.lost, c.err)
		}
	}
}

// agentWithLiveDaemon is an agent with only its daemon and ack books, on a
// server where sandbox sb-live's daemon answers its alive subject and no
// other daemon does.
func agentWithLiveDaemon(t *testing.T) *Agent {
	t.Helper()
	env := jstest.Start(t)
	nc, _ := env.Connect(t)
	a := &Agent{daemons: newDaemonBook(testRun), acks: newAckBook(testRun)}
	if err := a.acks.subscribe(nc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.acks.close)
	up, err := events.NewMember(events.KindSandbox, "sb-live")
	if err != nil {
		t.Fatal(err)
	}
	sub, err := nc.Subscribe(events.AliveSubject(testRun, up), func(m *nats.Msg) { _ = m.Respond(nil) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return a
}

// A launch stage whose call to the daemon found no answer asks the daemon
// whether it is there: one that never answers its alive subject is taken
// for lost (its heartbeat would outlive it by minutes); one that answers
// keeps the error.
func TestLostOrAsksTheDaemon(t *testing.T) {
	a := agentWithLiveDaemon(t)
	r := &run{ctx: t.Context()}
	timedOut := fmt.Errorf("resume decision: %w", context.DeadlineExceeded)
	launch := func(sb string) agentapi.Bookmark { return agentapi.Bookmark{Next: agentapi.StageLaunch, Sandbox: sb} }
	if got := a.lostOr(r, launch("sb-dead"), timedOut); !errors.Is(got, errSandboxLost) || !errors.Is(got, context.DeadlineExceeded) {
		t.Errorf("a daemon that never answers: %v, want sandbox lost, wrapping the timeout", got)
	}
	if got := a.lostOr(r, launch("sb-live"), timedOut); errors.Is(got, errSandboxLost) || !errors.Is(got, context.DeadlineExceeded) {
		t.Errorf("a daemon that answers: %v, want the timeout alone", got)
	}
}

// A call to a daemon that dies while it holds the call ends as a lost
// sandbox once the daemon answers no alive query, rather than after the
// call's own timeout; a daemon that answers keeps its slow call going, and
// a call its caller gave up on finds no daemon gone.
func TestWhileDaemonLives(t *testing.T) {
	a := agentWithLiveDaemon(t)
	held := func(ctx context.Context) (int, error) { // a call the daemon never answers
		<-ctx.Done()
		return 0, ctx.Err()
	}

	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := time.Now()
	if _, err := whileDaemonLives(ctx, a, "sb-dead", held); !errors.Is(err, errSandboxLost) || ctx.Err() != nil {
		t.Errorf("a call held by a daemon that answers nothing: %v after %v, want sandbox lost before the call's timeout", err, time.Since(start))
	}
	if !a.daemons.isGone("sb-dead") {
		t.Error("the daemon found dead is not gone for the book")
	}

	slow := func(ctx context.Context) (int, error) {
		select {
		case <-time.After(live.SilenceLimit + 3*time.Second): // past a round of asking
			return 7, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	if v, err := whileDaemonLives(ctx, a, "sb-live", slow); v != 7 || err != nil {
		t.Errorf("a slow call of a daemon that answers: %d, %v; want 7, nil", v, err)
	}

	gctx, gcancel := context.WithTimeout(ctx, live.SilenceLimit+time.Second)
	defer gcancel()
	if _, err := whileDaemonLives(gctx, a, "sb-quiet", held); errors.Is(err, errSandboxLost) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a call its caller gave up on: %v, want the caller's deadline", err)
	}
	if a.daemons.isGone("sb-quiet") {
		t.Error("a daemon whose probe its caller cut short is gone for the book")
	}
}

// silentSandbox is a daemon that never came up: every call finds no
// responders.
type silentSandbox struct{ endlessSandbox }

func (s *silentSandbox) Launch(context.Context, sandboxapi.LaunchRequest) (sandboxapi.Record, error) {
	return sandboxapi.Record{}, nats.ErrNoResponders
}

// A launch waits for a daemon that has not answered yet (a fork's starts
// in the background) until the owner says the sandbox's init exited: a
// daemon killed before it ever answered loses the sandbox in seconds, not
// after DaemonWait, during which its run holds every checkpoint of its
// agent unready.
func TestDaemonDeadBeforeItAnsweredIsLost(t *testing.T) {
	sb := &silentSandbox{*newEndlessSandbox()}
	w := newWorldWith(t, false, func(string) (Sandbox, error) { return sb, nil })
	ctx, cancel := context.WithTimeout(t.Context(), DaemonWait-10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := w.agent.Rollout(ctx, agentapi.Request{RolloutID: "r1", Task: task})
		done <- err
	}()
	var pid int
	poll.Wait(t, 20*time.Second, "the session's sandbox", func() bool {
		s, ok := w.owner.Session("r1")
		if ok {
			pid = s.Sandbox.InitPID
		}
		return ok && pid > 0
	})
	select {
	case err := <-done:
		t.Fatalf("the rollout ended while its sandbox ran: %v", err)
	case <-time.After(live.SilenceLimit + 2*time.Second):
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, errSandboxLost) {
			t.Fatalf("rollout: %v, want errSandboxLost", err)
		}
	case <-ctx.Done():
		t.Fatal("the rollout still waits for a daemon whose sandbox's init exited")
	}
}

// lossySandbox is a live daemon whose answer to the first launch request
// is lost on the way (a NATS node went down between the two); it started
// the launch, so a repeat is answered launch_exists.
type lossySandbox struct {
	endlessSandbox
	asked atomic.Int32
}

func (s *lossySandbox) Launch(ctx context.Context, r sandboxapi.LaunchRequest) (sandboxapi.Record, error) {
	if s.asked.Add(1) == 1 {
		<-ctx.Done()
		return sandboxapi.Record{}, ctx.Err()
	}
	return sandboxapi.Record{}, &jetstream.ServiceError{Code: sandboxapi.CodeLaunchExists, Status: 409, Detail: "launch " + r.LaunchID + " exists"}
}

// A launch request whose answer was lost while its daemon lives is asked
// again once launchAsk passes, and the daemon's launch_exists is the
// launch: the run is not failed by the call's timeout (a cluster node
// killed at a prepare failed a rollout so, and held its agent unready
// for three checkpoints).
func TestLaunchRequestLostOnTheWayIsAskedAgain(t *testing.T) {
	tier.Long(t)
	a := agentWithLiveDaemon(t)
	sb := &lossySandbox{endlessSandbox: *newEndlessSandbox()}
	start := time.Now()
	_, err := a.startLaunchIn(t.Context(), sb, "", "sb-live", sandboxapi.LaunchRequest{LaunchID: "r1.l1", Episode: "r1", Argv: []string{"true"}})
	if !isCode(err, sandboxapi.CodeLaunchExists) || sb.asked.Load() != 2 {
		t.Fatalf("after %v: %v, %d requests; want launch_exists from the second", time.Since(start), err, sb.asked.Load())
	}
}

// heldStop is a daemon that went while it held the stop of its launch:
// the stop is never answered.
type heldStop struct{ *endlessSandbox }

func (s heldStop) Stop(ctx context.Context, _ string, _ bool) (sandboxapi.Receipt, error) {
	<-ctx.Done()
	return sandboxapi.Receipt{}, ctx.Err()
}

// A run that ends without a result stops its launch, unless the daemon
// goes while it holds the stop: an owner that retires the same attempt
// stops the sandbox, and the launch with it. The cleanup takes the daemon
// for gone once it answers no alive query, and goes on to the session,
// rather than waiting out its 30 s bound on every such retire.
func TestCleanupOfALaunchWhoseDaemonWent(t *testing.T) {
	tier.Long(t)
	a := agentWithLiveDaemon(t)
	a.sandboxes = map[string]Sandbox{}
	a.cfg.SandboxService = func(string) (Sandbox, error) { return heldStop{newEndlessSandbox()}, nil }
	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	r := &run{key: "r1", ep: events.Episode{Rollout: "r1"}, ctx: ctx, log: zerolog.Nop(), launch: "r1.l1", sandbox: "sb-dead"}
	start := time.Now()
	a.cleanup(r, errors.New("retired"))
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the cleanup took %v: it waited out the stop of a daemon that went", took)
	}
	if !a.daemons.isGone("sb-dead") {
		t.Error("the daemon that held the stop is not gone for the book")
	}
}
