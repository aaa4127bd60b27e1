package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// putHeartbeat writes a heartbeat of member m of run1 as process
// instance, as a member does, in its kind's bucket.
func putHeartbeat(t *testing.T, env *jstest.Env, m events.Member, instance string) {
	t.Helper()
	v, _ := json.Marshal(events.MemberInfo{Run: "run1", Member: m, Instance: instance, Started: time.Now().UTC(), Heartbeat: time.Now().UTC()})
	if _, err := env.Bus.Heartbeats(m.Kind()).Put(t.Context(), events.MemberKey("run1", m), v); err != nil {
		t.Fatal(err)
	}
}

// A heartbeat is read from its kind's bucket alone, and one stored its
// bucket's TTL ago is gone though no marker said so (neither bucket leaves
// one): an agent's or an owner's after the member TTL, a sandbox daemon's
// after the sandbox TTL. A daemon's key in sp_members, an earlier build's,
// is not read. A phase's watch tells of a member whose heartbeat expires
// while it runs, once, and a watch started later of every expired one.
func TestMemberViewJudgesExpiryByStoreTime(t *testing.T) {
	env := jstest.Start(t)
	var offset atomic.Int64
	b := newTestBridge(t, env, Config{Now: func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }})
	t.Cleanup(b.stopView)
	all := []events.Member{"agent.a", "owner.o", "sandbox.s"}
	for _, m := range all {
		putHeartbeat(t, env, m, "i0")
	}
	v, _ := json.Marshal(events.MemberInfo{Run: "run1", Member: "sandbox.old", Instance: "i0"})
	if _, err := env.Bus.Members.Put(t.Context(), events.MemberKey("run1", "sandbox.old"), v); err != nil {
		t.Fatal(err)
	}
	listed := func(want []events.Member, when string) {
		t.Helper()
		ms, _, err := b.liveMembers(t.Context(), 0, false)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(ms, want) {
			t.Fatalf("listed %v %s, want %v", ms, when, want)
		}
	}
	listed(all, "at first")
	vw, err := b.view(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	w := vw.watch("run1", all, b.cfg.Now())
	defer w.close()
	w.expire(b.cfg.Now())
	if len(w.gone) != 0 {
		t.Fatalf("%d members gone while every heartbeat lives", len(w.gone))
	}

	offset.Store(int64(jetstream.DefaultMemberTTL))
	listed([]events.Member{"sandbox.s"}, "a member TTL on")
	w.expire(b.cfg.Now())
	w.expire(b.cfg.Now())
	gone := map[events.Member]machine.Gone{}
	for len(w.gone) > 0 {
		g := (<-w.gone).(machine.MemberGone)
		gone[g.Member] = g.Why
	}
	if len(gone) != 2 || gone["agent.a"] != machine.GoneLeft || gone["owner.o"] != machine.GoneLeft {
		t.Fatalf("the watch said %v a member TTL on, want agent.a and owner.o left, once each", gone)
	}

	offset.Store(int64(jetstream.DefaultSandboxTTL))
	listed([]events.Member{}, "a sandbox TTL on")
	w2 := vw.watch("run1", all, b.cfg.Now())
	defer w2.close()
	if len(w2.gone) != len(all) {
		t.Fatalf("a watch started a sandbox TTL on said %d gone, want all %d", len(w2.gone), len(all))
	}
	for range all {
		if g := (<-w2.gone).(machine.MemberGone); g.Why != machine.GoneNotAlive {
			t.Errorf("%+v, want not alive", g)
		}
	}
}

// The bridge's view of the heartbeats is as fresh as a read of every key
// (it reads the bucket as far as it was when asked before it answers),
// while 500 heartbeats are written again all the time: a member that
// joined is in the next listing, one that left is not.
func TestMemberViewIsAsFreshAsARead(t *testing.T) {
	env := jstest.Start(t)
	b := newTestBridge(t, env, Config{})
	t.Cleanup(b.stopView)
	var all []events.Member
	for i := range 500 {
		m := events.Member(fmt.Sprintf("sandbox.s%03d", i))
		all = append(all, m)
		putHeartbeat(t, env, m, "i0")
	}
	wctx, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	// The heartbeats go on meanwhile, but for the member that has left:
	// away is checked and the put made under mu, so none is put again
	// after its delete.
	var (
		mu   sync.Mutex
		away events.Member
	)
	go func() {
		defer close(done)
		for n := 1; wctx.Err() == nil; n++ {
			for _, m := range all {
				v, _ := json.Marshal(events.MemberInfo{Run: "run1", Member: m, Instance: "i0", Heartbeat: time.Now().UTC()})
				mu.Lock()
				if m != away {
					_, _ = env.Bus.Heartbeats(m.Kind()).Put(wctx, events.MemberKey("run1", m), v)
				}
				mu.Unlock()
			}
		}
	}()
	defer func() { stop(); <-done }()
	for round := range 5 {
		joined := events.Member(fmt.Sprintf("agent.a%d", round))
		putHeartbeat(t, env, joined, "i0")
		left := all[round]
		mu.Lock()
		away = left
		err := env.Bus.Heartbeats(left.Kind()).Delete(t.Context(), events.MemberKey("run1", left))
		mu.Unlock()
		if err != nil {
			t.Fatal(err)
		}
		ms, _, err := b.liveMembers(t.Context(), 0, false)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(ms, joined) {
			t.Fatalf("round %d: %s joined, and is not listed", round, joined)
		}
		if slices.Contains(ms, left) {
			t.Fatalf("round %d: %s left, and is listed", round, left)
		}
		mu.Lock()
		away = ""
		mu.Unlock()
		putHeartbeat(t, env, left, "i0")
	}
}

// A phase's watch says at once which of its members have no heartbeat,
// then which leave and which another process replaces; no member twice.
func TestMemberWatchSaysWhoIsGone(t *testing.T) {
	env := jstest.Start(t)
	b := newTestBridge(t, env, Config{})
	t.Cleanup(b.stopView)
	for _, m := range []events.Member{"agent.a", "sandbox.s", "owner.o"} {
		putHeartbeat(t, env, m, "i0")
	}
	ctx := t.Context()
	p := events.Prepare{PhaseHeader: events.PhaseHeader{Run: "run1", CheckpointID: "c1", Seq: 1, Deadline: time.Now().Add(time.Minute)}.
		Address([]events.Member{"agent.a", "sandbox.s", "owner.o", "agent.ghost"})}
	r, _, err := b.openAcks(ctx, p, true, true)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	next := func() machine.MemberGone {
		t.Helper()
		select {
		case in := <-r.gone:
			return in.(machine.MemberGone)
		case <-time.After(10 * time.Second):
			t.Fatal("no member said gone")
		}
		return machine.MemberGone{}
	}
	if g := next(); g.Member != "agent.ghost" || g.Why != machine.GoneNotAlive {
		t.Fatalf("first %+v, want agent.ghost not alive", g)
	}
	if err := env.Bus.Daemons.Delete(ctx, events.MemberKey("run1", "sandbox.s")); err != nil {
		t.Fatal(err)
	}
	if g := next(); g.Member != "sandbox.s" || g.Why != machine.GoneLeft {
		t.Fatalf("then %+v, want sandbox.s left", g)
	}
	putHeartbeat(t, env, "owner.o", "i0") // a heartbeat: nothing
	putHeartbeat(t, env, "owner.o", "i1") // another process
	if g := next(); g.Member != "owner.o" || g.Why != machine.GoneReplaced {
		t.Fatalf("then %+v, want owner.o replaced", g)
	}
	putHeartbeat(t, env, "owner.o", "i2")
	select {
	case in := <-r.gone:
		t.Fatalf("%+v: a member said gone twice", in)
	case <-time.After(200 * time.Millisecond):
	}
}

// PROTOCOL §3, Liveness: the probe asks every silent daemon in turn, the
// next round going on from the last it asked, and takes a daemon for gone
// only as the silence rule has it (live.Silence, whose timing its own
// tests check): not on one request that found no responder, which may be
// a daemon reconnecting, nor once it answered again.
func TestProbeAsksEverySilentDaemonInTurn(t *testing.T) {
	env := jstest.Start(t)
	b := newTestBridge(t, env, Config{})
	ctx := t.Context()
	var silent []events.Member
	for i := range probeBatch + 88 {
		m := events.Member(fmt.Sprintf("sandbox.s%04d", i))
		putHeartbeat(t, env, m, "gone")
		silent = append(silent, m)
	}
	// One daemon answers again after its first probe (it reconnected).
	back := silent[3]
	v, err := b.view(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.sync(ctx, b); err != nil {
		t.Fatal(err)
	}
	w := v.watch("run1", silent, time.Now())
	defer w.close()
	if len(w.gone) != 0 {
		t.Fatalf("%d members gone before any probe", len(w.gone))
	}
	b.probe(ctx, w, silent, events.AliveQuery{}, nil)
	b.probe(ctx, w, silent, events.AliveQuery{}, nil)
	if len(w.unanswered) != len(silent) {
		t.Fatalf("two rounds asked %d of the %d silent daemons, want all", len(w.unanswered), len(silent))
	}
	if len(w.gone) != 0 {
		t.Fatalf("%d members taken for gone on one unanswered probe", len(w.gone))
	}
	sub, err := env.Conn.Subscribe(events.AliveSubject("run1", back), func(m *nats.Msg) { _ = m.Respond([]byte("back")) })
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := env.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	gone := map[events.Member]bool{}
	poll.Wait(t, 60*time.Second, "every silent daemon but one to be found gone", func() bool {
		b.probe(ctx, w, silent, events.AliveQuery{}, nil)
		for len(w.gone) > 0 {
			gone[(<-w.gone).(machine.MemberGone).Member] = true
		}
		return len(gone) >= len(silent)-1
	})
	if gone[back] {
		t.Errorf("%s answered again and was taken for gone", back)
	}
	if len(gone) != len(silent)-1 {
		t.Errorf("%d members gone, want every silent one but %s (%d)", len(gone), back, len(silent)-1)
	}
	if _, ok := w.unanswered[back]; ok {
		t.Errorf("%s answered: its unanswered time should be forgotten", back)
	}
}

// PROTOCOL §3, Liveness: an agent whose heartbeat stops while a phase
// waits for it (its process hung or cut off, its key left in place) is
// gone once its bucket's TTL has passed since the server stored its last
// heartbeat, though the key leaves no marker: the driver has the phase's
// watch look every second, and the checkpoint fails naming the agent, long
// before its deadline, as a daemon found silent is left out.
func TestAgentWhoseHeartbeatExpiresMidPhaseFailsIt(t *testing.T) {
	env := jstest.Start(t)
	membertest.StartMembers(t, env, "run1", 1, membertest.Options{Episodes: 1})
	ghost := events.Member("agent.ghost")
	putHeartbeat(t, env, ghost, "hung")
	var offset atomic.Int64
	b := newTestBridge(t, env, Config{Now: func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }})
	ctx, cancel := context.WithCancel(t.Context())
	ran := make(chan error, 1)
	go func() { ran <- b.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("bridge Run: %v", err)
		}
	}()

	// The agent's heartbeat outlives its TTL once the prepare's watch names
	// it: the phase is in flight.
	var watching sync.WaitGroup
	defer watching.Wait()
	watching.Go(func() {
		key := events.MemberKey("run1", ghost)
		err := poll.Until(ctx, poll.Every(10*time.Millisecond), func() (bool, error) {
			b.members.mu.Lock()
			defer b.members.mu.Unlock()
			for w := range b.members.watches {
				if _, ok := w.memberOf[key]; ok {
					return true, nil
				}
			}
			return false, nil
		})
		if err == nil {
			offset.Store(int64(jetstream.DefaultMemberTTL))
		}
	})
	start := time.Now()
	res, err := b.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: "c1", TimeoutMS: 60000})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the agent whose heartbeat expired held the checkpoint %s", took)
	}
	if res.Status != bridgeapi.StatusFailed || res.Failure == nil || !slices.ContainsFunc(res.Failure.Errors, func(e events.MemberError) bool {
		return e.Member == ghost && e.Code == "member_dead"
	}) {
		t.Fatalf("c1: %+v (failure %+v), want failed with %s dead", res, res.Failure, ghost)
	}
}
