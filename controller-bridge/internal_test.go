package bridge

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// newTestBridge is a bridge of run1 on env that is not run: the tests of
// this file drive its parts.
func newTestBridge(t *testing.T, env *jstest.Env, cfg Config) *Bridge {
	t.Helper()
	nc, js := env.Connect(t)
	bus, err := jetstream.Open(t.Context(), js)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Run, cfg.Conn, cfg.JS, cfg.Bus = "run1", nc, js, bus
	cfg.Logger = zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		b.bgCancel()
		b.bg.Wait()
	})
	return b
}

// A gathering whose heartbeat watch closes (nats.go closes Updates when
// the watch's subscription closes) stops reading it and fails the wait:
// a closed channel would otherwise be read, empty, for ever.
func TestClosedHeartbeatWatchFailsTheWait(t *testing.T) {
	env := jstest.Start(t)
	hs := membertest.StartMembers(t, env, "run1", 1, membertest.Options{})
	b := newTestBridge(t, env, Config{})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	p := events.Prepare{PhaseHeader: events.PhaseHeader{Run: "run1", CheckpointID: "c1", Seq: 1,
		Deadline: time.Now().Add(time.Minute), Members: []events.Member{hs[0].Name}}}
	r, _, err := b.openAcks(ctx, p, true)
	if err != nil {
		t.Fatal(err)
	}
	d := b.newDriving(machine.New(b.machineConfig()))
	d.acks = r
	defer d.close()
	if err := r.watcher.Stop(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := d.wait(ctx)
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || ctx.Err() != nil {
			t.Fatalf("wait after the watch closed: %v, want the watch's failure", err)
		}
		t.Logf("wait: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		<-done
		t.Fatal("the wait still reads a closed heartbeat watch")
	}
}

// The resume watcher reads the acks already recorded whatever the time;
// when the last of them never comes (it left the stream), it gives up a
// phase timeout after it started and reports on what it read, instead of
// polling, with a consumer open, until the bridge stops.
func TestResumeWatchGivesUpAReadBackThatNeverEnds(t *testing.T) {
	env := jstest.Start(t)
	b := newTestBridge(t, env, Config{PhaseTimeout: 300 * time.Millisecond})
	r := events.Resume{PhaseHeader: events.PhaseHeader{Run: "run1", CheckpointID: "c1", Seq: 3,
		Deadline: time.Now().Add(100 * time.Millisecond), Members: []events.Member{"agent.t0"}}}
	rd := &ackReader{b: b, phase: events.PhaseResume, msgs: make(chan ackMsg)} // no ack ever comes
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	done := make(chan []string, 1)
	go func() { done <- b.unresumed(ctx, r, rd, 7) }()
	select {
	case missing := <-done:
		if len(missing) != 1 || missing[0] != "agent.t0" {
			t.Fatalf("not resumed: %v, want agent.t0", missing)
		}
	case <-time.After(10 * time.Second):
		cancel()
		<-done
		t.Fatal("the resume watcher still waits for a recorded ack that never comes")
	}
}

// PROTOCOL §8: a phase publish that goes unanswered (here the server is
// down; in a cluster the stream is electing a leader) is published again,
// the same message with the same id and fence, until the stream answers,
// and lands once: nothing else is published before it.
func TestUnansweredPhasePublishIsRetriedAndLandsOnce(t *testing.T) {
	env := jstest.Start(t)
	b := newTestBridge(t, env, Config{})
	var logs jstest.Buffer
	b.log = zerolog.New(io.MultiWriter(&logs, zerolog.NewTestWriter(t)))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	p := events.Prepare{PhaseHeader: events.PhaseHeader{Run: "run1", CheckpointID: "c1", Seq: 1,
		Deadline: time.Now().Add(time.Minute), Members: []events.Member{"agent.t0"}}}

	env.StopServer(t)
	type result struct {
		p   machine.PhasePublished
		err error
	}
	done := make(chan result, 1)
	go func() {
		pub, err := b.publishPhase(ctx, 0, p)
		done <- result{pub, err}
	}()
	poll.Wait(t, time.Minute, "a second attempt of the unanswered publish", func() bool {
		return strings.Contains(logs.String(), "publishing the same again")
	})
	env.StartServer(t)
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("the publish never landed")
	}
	if r.err != nil {
		t.Fatalf("publish: %v", r.err)
	}
	info, err := env.Bus.Stream.Info(t.Context(), natsjs.WithSubjectFilter(events.PhaseFilter("run1")))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[events.PhaseSubject("run1", events.PhasePrepare)]; n != 1 {
		t.Fatalf("the stream holds %d prepares, want 1", n)
	}
	raw, err := env.Bus.Stream.GetLastMsgForSubject(t.Context(), events.PhaseSubject("run1", events.PhasePrepare))
	if err != nil {
		t.Fatal(err)
	}
	if raw.Sequence != r.p.StreamSeq || raw.Header.Get("Nats-Msg-Id") != r.p.ID {
		t.Fatalf("stored seq %d id %q; the publish reported seq %d id %q", raw.Sequence, raw.Header.Get("Nats-Msg-Id"), r.p.StreamSeq, r.p.ID)
	}
}
