package agent

import (
	"context"
	"encoding/json"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// PROTOCOL §3, Liveness: the agent asks a silent daemon whether it is
// there, and takes it for gone only once its alive subject has found no
// responder for events.AliveUnanswered; a daemon that answers again in
// between (it reconnected) is not gone.
func TestAckBookProbeWaitsOutAReconnect(t *testing.T) {
	env := jstest.Start(t)
	b := newAckBook(testRun)
	if err := b.subscribe(env.Conn); err != nil {
		t.Fatal(err)
	}
	defer b.close()
	daemon := events.Member("sandbox.sb-1")
	answer := func() *nats.Subscription {
		t.Helper()
		nc, _ := env.Connect(t)
		sub, err := nc.Subscribe(events.AliveSubject(testRun, daemon), func(m *nats.Msg) { _ = m.Respond([]byte("i1")) })
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		return sub
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	start := time.Now()
	dead := b.probe(ctx, daemon.Name(), events.AliveQuery{})

	// Away for about half of AliveUnanswered, then back: not gone.
	time.Sleep(events.AliveUnanswered / 2)
	sub := answer()
	select {
	case <-dead:
		t.Fatalf("taken for gone %s in, on a daemon away for less than %s", time.Since(start), events.AliveUnanswered)
	case <-time.After(events.AliveUnanswered):
	}
	// Gone for good: found gone, no sooner than AliveUnanswered after.
	_ = sub.Unsubscribe()
	gone := time.Now()
	select {
	case <-dead:
		if took := time.Since(gone); took < events.AliveUnanswered {
			t.Errorf("taken for gone %s after it left, sooner than %s", took, events.AliveUnanswered)
		}
	case <-time.After(4 * events.AliveUnanswered):
		t.Fatalf("a daemon gone for %s is not found gone", 4*events.AliveUnanswered)
	}
}

// PROTOCOL §3, acks: a sandbox daemon's prepare ack travels on core NATS.
// One published before the agent looked (or missed) is not lost to it: the
// agent asks the daemon on its alive subject with the prepare named, and
// the daemon says the ack again.
func TestAckBookAsksTheDaemonToSayItsAckAgain(t *testing.T) {
	env := jstest.Start(t)
	daemon := events.Member("sandbox.sb-1")
	ack := events.PrepareAck{AckHeader: events.AckHeader{Run: testRun, Member: daemon, Seq: 4, CheckpointID: "c1", OK: true,
		State: events.StatePrepared}, Ready: true}
	msg, err := events.Marshal(daemon, ack)
	if err != nil {
		t.Fatal(err)
	}
	nc, _ := env.Connect(t)
	// Published before the book subscribed: nobody heard it.
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	var asked atomic.Int32
	if _, err := nc.Subscribe(events.AliveSubject(testRun, daemon), func(m *nats.Msg) {
		var q events.AliveQuery
		if json.Unmarshal(m.Data, &q) == nil && q.Seq == ack.Seq && q.Phase == events.PhasePrepare {
			asked.Add(1)
			_ = nc.PublishMsg(msg)
		}
		_ = m.Respond([]byte("i1"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	b := newAckBook(testRun)
	if err := b.subscribe(env.Conn); err != nil {
		t.Fatal(err)
	}
	defer b.close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	got, err := b.wait(ctx, ack.Seq, daemon.Name(), nil, nil, 250*time.Millisecond)
	if err != nil || !got.Ready || got.Seq != ack.Seq {
		t.Fatalf("waited for the ack said again: %+v %v", got, err)
	}
	if asked.Load() == 0 {
		t.Errorf("the daemon was never asked with the prepare named")
	}
}

// A daemon asked for its prepare ack answers with it, on the agent's own
// inbox: the agent takes it from the answer, though nothing reaches its
// subscription of the ack subject (a flood there may bury it).
func TestAckBookTakesTheAckFromTheAnswer(t *testing.T) {
	env := jstest.Start(t)
	daemon := events.Member("sandbox.sb-1")
	ack := events.PrepareAck{AckHeader: events.AckHeader{Run: testRun, Member: daemon, Seq: 4, CheckpointID: "c1", OK: true,
		State: events.StatePrepared}, Ready: true}
	msg, err := events.Marshal(daemon, ack)
	if err != nil {
		t.Fatal(err)
	}
	nc, _ := env.Connect(t)
	if _, err := nc.Subscribe(events.AliveSubject(testRun, daemon), func(m *nats.Msg) {
		var q events.AliveQuery
		if json.Unmarshal(m.Data, &q) == nil && q.Seq == ack.Seq && q.Phase == events.PhasePrepare {
			_ = m.RespondMsg(&nats.Msg{Header: msg.Header, Data: msg.Data})
			return
		}
		_ = m.Respond([]byte("i1"))
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	b := newAckBook(testRun)
	if err := b.subscribe(env.Conn); err != nil {
		t.Fatal(err)
	}
	defer b.close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	got, err := b.wait(ctx, ack.Seq, daemon.Name(), nil, nil, 250*time.Millisecond)
	if err != nil || !got.Ready || got.Seq != ack.Seq {
		t.Fatalf("waited for the ack the answer carries: %+v %v", got, err)
	}
}

// A sandbox's workload holds its daemon's credentials and may publish acks
// of any sequence on its daemon's subjects: the book keeps the newest few
// acks of each sandbox by its own sequences, so that none pushes another
// sandbox's ack out.
func TestAckBookKeepsEachSandboxsAcks(t *testing.T) {
	b := newAckBook(testRun)
	ack := func(sandbox string, seq uint64) events.PrepareAck {
		m, _ := events.NewMember(events.KindSandbox, sandbox)
		return events.PrepareAck{AckHeader: events.AckHeader{Run: testRun, Member: m, Seq: seq, CheckpointID: "c1", OK: true,
			State: events.StatePrepared}, Ready: true}
	}
	b.add(ack("sb-good", 7))
	for seq := range uint64(100) {
		b.add(ack("sb-flood", 1<<40+seq))
	}
	if _, ok := b.lookup(7, "sb-good"); !ok {
		t.Fatal("another sandbox's acks pushed sb-good's out")
	}
	n := 0
	for k := range b.acks {
		if k.sandbox == "sb-flood" {
			n++
		}
	}
	if n != acksKept {
		t.Errorf("the book keeps %d acks of the flooding sandbox, want %d", n, acksKept)
	}
	if _, ok := b.lookup(1<<40+99, "sb-flood"); !ok {
		t.Error("the newest ack of the flooding sandbox is not kept")
	}
}

// A sandbox's workload floods its daemon's prepare-ack subject: each copy
// of an ack the book has costs the agent a look at the subject, not a
// decode (docs/BENCHMARKS.md, "An ack flood at the agent"). The baseline
// is the decode of a first ack.
func BenchmarkAckBookFlood(b *testing.B) {
	daemon := events.Member("sandbox.sb-1")
	ack := events.PrepareAck{AckHeader: events.AckHeader{Run: testRun, Member: daemon, Seq: 4, CheckpointID: "c1", OK: true,
		State: events.StatePrepared}, Ready: true}
	msg, err := events.Marshal(daemon, ack)
	if err != nil {
		b.Fatal(err)
	}
	msg.Subject = events.LiveAckSubject(testRun, 4, events.PhasePrepare, daemon)
	b.Run("first", func(b *testing.B) {
		for b.Loop() {
			book := newAckBook(testRun)
			book.take(msg)
		}
	})
	b.Run("copy", func(b *testing.B) {
		book := newAckBook(testRun)
		book.take(msg)
		if _, ok := book.lookup(4, daemon.Name()); !ok {
			b.Fatal("the first ack was not taken")
		}
		for b.Loop() {
			book.take(msg)
		}
	})
}
