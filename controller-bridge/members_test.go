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

	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
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

// A sandbox daemon's heartbeat is read from sp_daemons alone, and one
// stored a TTL ago is gone though no marker said so (its bucket leaves
// none); a daemon's key in sp_members, an earlier build's, is not read.
func TestMemberViewOfTheDaemons(t *testing.T) {
	env := jstest.Start(t)
	var offset atomic.Int64
	b := newTestBridge(t, env, Config{Now: func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }})
	t.Cleanup(b.stopView)
	putHeartbeat(t, env, "agent.a", "i0")
	putHeartbeat(t, env, "sandbox.s", "i0")
	v, _ := json.Marshal(events.MemberInfo{Run: "run1", Member: "sandbox.old", Instance: "i0"})
	if _, err := env.Bus.Members.Put(t.Context(), events.MemberKey("run1", "sandbox.old"), v); err != nil {
		t.Fatal(err)
	}
	ms, _, err := b.liveMembers(t.Context(), 0, false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ms, []events.Member{"agent.a", "sandbox.s"}) {
		t.Fatalf("listed %v, want agent.a and sandbox.s", ms)
	}
	offset.Store(int64(jetstream.DefaultSandboxTTL))
	ms, _, err = b.liveMembers(t.Context(), 0, false)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ms, []events.Member{"agent.a"}) {
		t.Fatalf("listed %v a TTL on, want agent.a alone (its own TTL is its bucket's to keep)", ms)
	}
	vw, err := b.view(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	w := vw.watch("run1", []events.Member{"agent.a", "sandbox.s"}, b.cfg.Now())
	defer w.close()
	if g := (<-w.gone).(machine.MemberGone); g.Member != "sandbox.s" || g.Why != machine.GoneNotAlive || len(w.gone) != 0 {
		t.Fatalf("the watch said %+v (and %d more), want sandbox.s not alive alone", g, len(w.gone))
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
// only once its alive subject has found no responder for
// events.AliveUnanswered: one such answer may be a daemon reconnecting.
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
	time.Sleep(events.AliveUnanswered)
	for range 2 {
		b.probe(ctx, w, silent, events.AliveQuery{}, nil)
	}
	gone := map[events.Member]bool{}
	for len(w.gone) > 0 {
		gone[(<-w.gone).(machine.MemberGone).Member] = true
	}
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
