package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// PROTOCOL §3, acks and Liveness (membertest.RunAsker): a sandbox daemon's
// prepare ack travels on core NATS. One published before the agent looked,
// or missed, is not lost to it: the agent asks the daemon on its alive
// subject with the prepare named, and the daemon says the ack again.
func TestAgentAsksSilentDaemons(t *testing.T) {
	membertest.RunAsker(t, membertest.AskerSuite{AwaitPrepareAck: func(t *testing.T, env *jstest.Env, run string, daemon events.Member) error {
		b := newAckBook(run)
		if err := b.subscribe(env.Conn); err != nil {
			return err
		}
		defer b.close()
		br := membertest.NewBridge(t, env, run)
		seq := br.Publish(events.Prepare{PhaseHeader: br.Header("c1", time.Minute, daemon)})
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		got, err := b.wait(ctx, seq, daemon.Name(), nil, nil, 250*time.Millisecond)
		if err != nil {
			return err
		}
		if !got.Ready || got.Seq != seq || got.Member != daemon {
			return fmt.Errorf("waited for the ack said again: got %+v", got)
		}
		return nil
	}})
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
