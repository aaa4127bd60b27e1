package bridge

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
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

// Resume acks travel on core NATS (PROTOCOL §3): the bridge listens from
// before the resume is published, so an ack that comes before its watch
// starts counts, and records what it heard in the stream, once the
// deadline passed: who answered, who did not, who answered with an error.
func TestResumeAcksAreHeardOnCoreAndRecorded(t *testing.T) {
	env := jstest.Start(t)
	b := newTestBridge(t, env, Config{})
	ms := []events.Member{"agent.t0", "owner.o0", "sandbox.s0", "sandbox.s1"}
	h := events.PhaseHeader{Run: "run1", CheckpointID: "c1", Seq: 3, Deadline: time.Now().Add(time.Second)}.Address(ms)
	r := events.Resume{PhaseHeader: h}
	if err := b.openResumeInbox(r); err != nil {
		t.Fatal(err)
	}
	ack := func(m events.Member, code string) {
		a := events.ResumeAck{AckHeader: events.AckHeader{Run: "run1", Member: m, Seq: 3, CheckpointID: "c1", OK: true, State: events.StateIdle}}
		if code != "" {
			a.Fail(code, "no")
		}
		if m == "sandbox.s0" {
			a.Pause = &events.PauseReport{Mode: "freeze", PauseSeq: 1, HeldCalls: 2}
		}
		msg, err := events.Marshal(m, a)
		if err != nil {
			t.Fatal(err)
		}
		if msg.Subject != events.LiveAckSubject("run1", 3, events.PhaseResume, m) {
			t.Fatalf("a resume ack on %s", msg.Subject)
		}
		if err := env.Conn.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}
	ack("agent.t0", "") // before the watch starts
	if err := env.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	b.watchResume(r)
	ack("sandbox.s0", "")
	ack("owner.o0", events.CodeCheckpointConflict)
	var got events.ResumeAcked
	poll.Wait(t, 10*time.Second, "the record of the resume's acks", func() bool {
		raw, err := env.Bus.Stream.GetLastMsgForSubject(t.Context(), events.ResumeAckedSubject("run1", 3))
		if err != nil {
			return false
		}
		_, d, err := events.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
		if err != nil {
			t.Fatal(err)
		}
		got = d.(events.ResumeAcked)
		return true
	})
	if got.Expected != 4 || got.Answered != 3 || got.MissingCount != 1 || len(got.Missing) != 1 || got.Missing[0] != "sandbox.s1" ||
		got.ErrorCount != 1 || got.Errors[0].Member != "owner.o0" || got.HeldCalls != 2 || got.MaxMS < got.P50MS {
		t.Fatalf("recorded %+v", got)
	}
	info, err := env.Bus.Stream.Info(t.Context(), natsjs.WithSubjectFilter("sp.run1.ack.>"))
	if err != nil {
		t.Fatal(err)
	}
	if len(info.State.Subjects) != 0 {
		t.Fatalf("acks stored on %v; resume acks are not", info.State.Subjects)
	}
}

// PROTOCOL-HISTORY §30: a phase publish that goes unanswered (here the server is
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

// PROTOCOL §4: a phase or an outcome this bridge publishes again carries
// the id it drew the first time, so that the stream holds it once: the
// phase published again (after a publish that failed but landed) is taken
// for this bridge's own, by its id, and the outcome is a duplicate.
// Another bridge process draws other ids: its publish of the same phase is
// fenced, not taken for its own.
func TestPublishedAgainKeepsItsID(t *testing.T) {
	env := jstest.Start(t)
	b := newTestBridge(t, env, Config{})
	p := events.Prepare{PhaseHeader: events.PhaseHeader{Run: "run1", CheckpointID: "c1", Seq: 1,
		Deadline: time.Now().Add(time.Minute), Members: []events.Member{"agent.t0"}}}
	first, err := b.publishPhase(t.Context(), 0, p)
	if err != nil {
		t.Fatal(err)
	}
	again, err := b.publishPhase(t.Context(), 0, p)
	if err != nil {
		t.Fatalf("the same phase published again by the same bridge: %v", err)
	}
	if again.ID != first.ID || again.StreamSeq != first.StreamSeq {
		t.Fatalf("published again: id %q at %d; the first %q at %d", again.ID, again.StreamSeq, first.ID, first.StreamSeq)
	}
	other := newTestBridge(t, env, Config{})
	if _, err := other.publishPhase(t.Context(), 0, p); !errors.Is(err, bridgeapi.ErrFenced) {
		t.Fatalf("another bridge's publish of the same phase: %v, want fenced", err)
	}
	if n := subjectCount(t, env, events.PhaseSubject("run1", events.PhasePrepare)); n != 1 {
		t.Fatalf("the stream holds %d prepares, want 1", n)
	}

	o := events.CheckpointCommitted{OutcomeHeader: events.OutcomeHeader{Run: "run1", CheckpointID: "c1"}, Members: []events.Member{"agent.t0"}}
	for range 2 {
		if err := b.publishOutcomeOnce(t.Context(), o, "c1", false); err != nil {
			t.Fatal(err)
		}
	}
	subj := events.OutcomeSubject("run1", events.TypeCheckpointCommitted)
	if n := subjectCount(t, env, subj); n != 1 {
		t.Fatalf("the stream holds %d outcomes after the same bridge published one twice, want 1", n)
	}
	// Another process replays the operation: it reads the outcome there.
	if err := other.publishOutcomeOnce(t.Context(), o, "c1", true); err != nil {
		t.Fatal(err)
	}
	if n := subjectCount(t, env, subj); n != 1 {
		t.Fatalf("the stream holds %d outcomes after a replay, want 1", n)
	}
}

// subjectCount returns how many messages the stream holds on subj.
func subjectCount(t *testing.T, env *jstest.Env, subj string) uint64 {
	t.Helper()
	info, err := env.Bus.Stream.Info(t.Context(), natsjs.WithSubjectFilter(subj))
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Subjects[subj]
}

// PROTOCOL §3, live phases: a live copy names the bridge's live copy
// before it only when no other bridge published in between; else the
// phase before it, so that a daemon that missed the other bridge's copy
// reads the stream. A phase that addresses no sandbox daemon has no copy.
func TestLiveCopiesNameTheOneBefore(t *testing.T) {
	env := jstest.Start(t)
	a := newTestBridge(t, env, Config{})
	b2 := newTestBridge(t, env, Config{Name: "second"})
	live, err := env.Conn.SubscribeSync(events.LivePhaseFilter("run1"))
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	fence := uint64(0)
	publish := func(br *Bridge, seq uint64, members ...events.Member) {
		t.Helper()
		h := events.PhaseHeader{Run: "run1", CheckpointID: fmt.Sprintf("c%d", seq), Seq: seq, Deadline: time.Now().Add(time.Minute)}.Address(members)
		pub, err := br.publishPhase(ctx, fence, events.Prepare{PhaseHeader: h})
		if err != nil {
			t.Fatalf("publish %d: %v", seq, err)
		}
		fence = pub.StreamSeq
	}
	// expect reads len(want) copies and checks what each names before
	// it. The copies come on two connections, and core NATS keeps order
	// only within one: a daemon may see 9 before 7 (it reads the gap from
	// the stream and drops 7 as old), so the test holds each copy to the
	// phase it names, not to the order they arrive in.
	expect := func(want [][2]string) {
		t.Helper()
		got := map[string]string{}
		for range want {
			m, err := live.NextMsg(5 * time.Second)
			if err != nil {
				t.Fatalf("live copies so far %v: %v", got, err)
			}
			got[m.Header.Get(events.HeaderPrefix+events.ExtSeq)] = m.Header.Get(events.HeaderLivePrev)
		}
		for _, w := range want {
			if prev, ok := got[w[0]]; !ok || prev != w[1] {
				t.Errorf("live copy of %s names %q before it, want %s (copies: %v)", w[0], prev, w[1], got)
			}
		}
	}
	publish(a, 1, "sandbox.s")
	publish(a, 2, "agent.x") // no copy
	publish(a, 3, "sandbox.s")
	publish(b2, 4, "sandbox.s")
	publish(a, 5, "sandbox.s")
	expect([][2]string{{"1", "0"}, {"3", "1"}, {"4", "3"}, {"5", "4"}})
	// Another bridge's phases in between, then one of this bridge's
	// that is not the daemons': the copy after names the phase before it,
	// not this bridge's copy of long ago.
	publish(b2, 6, "sandbox.s")
	publish(b2, 7, "sandbox.s")
	publish(a, 8, "agent.x")
	publish(a, 9, "sandbox.s")
	// A copy that cannot be sent: the next names the phase before it,
	// so a daemon that saw copy 9 finds the gap and reads 10.
	closed, _ := env.Connect(t)
	closed.Close()
	a.cfg.LiveConn = closed
	publish(a, 10, "sandbox.s")
	a.cfg.LiveConn = nil
	publish(a, 11, "sandbox.s")
	expect([][2]string{{"6", "5"}, {"7", "6"}, {"9", "8"}, {"11", "10"}})
	if m, err := live.NextMsg(200 * time.Millisecond); err == nil {
		t.Errorf("an extra live copy %s", m.Subject)
	}
}

// A resume inbox a watch took is kept until the watch closes it, however
// many resumes follow within its deadline; only inboxes no watch took are
// bounded (resumeInboxes).
func TestResumeInboxesTakenAreKept(t *testing.T) {
	env := jstest.Start(t)
	b := newTestBridge(t, env, Config{})
	defer b.stopResumeAcks()
	for seq := uint64(1); seq <= 3*resumeInboxes+1; seq++ {
		if err := b.openResumeInbox(events.Resume{PhaseHeader: events.PhaseHeader{Run: "run1", CheckpointID: "c1", Seq: seq}}); err != nil {
			t.Fatal(err)
		}
		if seq%2 == 0 && b.takeResumeInbox(seq) == nil {
			t.Fatalf("resume %d: its inbox is gone before its watch took it", seq)
		}
	}
	for seq := uint64(2); seq <= 3*resumeInboxes; seq += 2 {
		if b.takeResumeInbox(seq) == nil {
			t.Errorf("resume %d: a taken inbox was dropped while its watch runs", seq)
		}
	}
	if untaken := b.resumes.Untaken(); untaken != resumeInboxes {
		t.Errorf("%d inboxes no watch took are kept, want %d", untaken, resumeInboxes)
	}
	b.closeResumeInbox(2)
	if b.takeResumeInbox(2) != nil {
		t.Error("a closed inbox is still there")
	}
}

// A prepare's record counts how every sandbox daemon paused, by kind of
// pause, and holds whole the acks of those that did not answer ok, ready
// and still, in parts that each stay well under NATS's 1 MB payload however
// large those acks are; every part carries the same counts and tallies,
// the parts together every notable ack once, in the order heard.
func TestPrepareRecordComesInParts(t *testing.T) {
	h := events.PhaseHeader{Run: "run1", CheckpointID: "c1", Seq: 7, Epoch: 2}
	var members []events.Member
	for i := range 3000 {
		members = append(members, events.Member(fmt.Sprintf("sandbox.s%04d", i)))
	}
	members = append(members, "agent.a0")
	began := time.Now()
	r := newPrepareRecord(h, members, began)
	blockers := make([]string, events.MaxBlockers)
	for i := range blockers {
		blockers[i] = strings.Repeat("b", 200)
	}
	var notable []events.Member
	for i, m := range members[:2990] {
		a := events.PrepareAck{AckHeader: events.AckHeader{Run: "run1", Member: m, Seq: 7, CheckpointID: "c1", Epoch: 2, OK: true, State: events.StatePrepared},
			Ready: i%100 != 0, Pause: &events.PauseReport{Mode: "freeze", PIDCount: 1 + i%5, TookMS: float64(i % 7)}}
		switch {
		case !a.Ready:
			a.SetBlockers(blockers)
			a.Pause = nil
			notable = append(notable, m)
		case i%100 == 1:
			a.Pause.Mode, a.Pause.Fallback = "stop", "l1: not confirmed"
			notable = append(notable, m)
		}
		r.add(a, began.Add(time.Duration(i)*time.Millisecond))
		r.add(a, began.Add(time.Hour)) // a repeat counts once
	}
	parts := r.record("run1")
	if len(parts) < 2 {
		t.Fatalf("%d parts for 30 acks of ~20 KB", len(parts))
	}
	want := []events.PauseTally{
		{Mode: "freeze", Count: 2930, Still: true, PIDsMin: 1, PIDsMax: 5, TookMaxMS: 6},
		{Mode: "stop", Fallback: true, Count: 30, PIDsMin: 2, PIDsMax: 2, TookMaxMS: 6},
	}
	var order []events.Member
	for i, p := range parts {
		msg, err := events.Marshal("bridge.main", p)
		if err != nil {
			t.Fatalf("part %d: %v", i+1, err)
		}
		if len(msg.Data) > 900<<10 {
			t.Errorf("part %d is %d bytes", i+1, len(msg.Data))
		}
		if msg.Subject != events.PrepareAckedSubject("run1", 7, i+1) {
			t.Errorf("part %d on %s", i+1, msg.Subject)
		}
		if p.Part != i+1 || p.Parts != len(parts) || p.Expected != 3000 || p.Answered != 2990 || p.Ready != 2960 ||
			p.NotReadyCount != 30 || p.MissingCount != 10 || len(p.Missing) != 10 || p.MaxMS < 2989 || p.NotableCount != 60 {
			t.Errorf("part %d: %+v", i+1, p)
		}
		if !slices.Equal(p.Pauses, want) {
			t.Errorf("part %d: pauses %+v, want %+v", i+1, p.Pauses, want)
		}
		for _, a := range p.Acks {
			order = append(order, a.Ack.Member)
		}
	}
	if !slices.Equal(order, notable) {
		t.Errorf("the parts hold the acks of %v, want the 60 notable ones, each once, in order", order)
	}
}

// A prepare gathered without its inbox in the ack feed (the feed could not
// be made) still hears its sandbox daemons' acks, which are not stored: on
// a core subscription of its own.
func TestPrepareWithoutTheAckFeedHearsTheDaemons(t *testing.T) {
	env := jstest.Start(t)
	b := newTestBridge(t, env, Config{})
	ms := []events.Member{"agent.a0", "sandbox.s0"}
	h := events.PhaseHeader{Run: "run1", CheckpointID: "c1", Seq: 5, Deadline: time.Now().Add(10 * time.Second)}.Address(ms)
	r, _, err := b.openAcks(t.Context(), events.Prepare{PhaseHeader: h}, false, true)
	if err != nil {
		t.Fatal(err)
	}
	defer r.close()
	if r.inboxSeq != 0 || r.live == nil {
		t.Fatalf("no ack feed inbox: want a consumer and a core subscription of the phase's own, got inbox %d, live %v", r.inboxSeq, r.live)
	}
	a := events.PrepareAck{AckHeader: events.AckHeader{Run: "run1", Member: "sandbox.s0", Seq: 5, CheckpointID: "c1", OK: true, State: events.StatePrepared}, Ready: true}
	msg, err := events.Marshal("sandbox.s0", a)
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Conn.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	select {
	case am := <-r.msgs:
		in := r.ack(am)
		if seen, ok := in.(machine.AckSeen); !ok || seen.Ack == nil || seen.Ack.Header().Member != "sandbox.s0" {
			t.Fatalf("heard %+v", in)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the daemon's prepare ack, on core NATS, was not heard")
	}
}

// A release lists a checkpoint's records from the records stream's leader
// (its info's meta subjects, each read there) and leaves the deleted out;
// the bridge's role may make those reads. On a 3-node cluster, R3.
func TestLeaderObjects(t *testing.T) {
	env := jstest.StartCluster(t, jstest.WithRoles())
	nc, js := env.As(embedded.RoleBridge).Connect(t)
	ctx := t.Context()
	store := env.Bus.Records
	for _, name := range []string{"run1/c1/agent.a.1.jsonl", "run1/c1/owner.o.2.jsonl", "run1/c10/agent.a.3.jsonl", "run2/c1/agent.a.4.jsonl"} {
		if _, err := store.PutString(ctx, name, "records of "+name); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.Delete(ctx, "run1/c1/owner.o.2.jsonl"); err != nil {
		t.Fatal(err)
	}
	names, err := leaderObjects(ctx, js, nc, jetstream.BucketRecords, "run1/c1/")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"run1/c1/agent.a.1.jsonl"}; !slices.Equal(names, want) {
		t.Errorf("leader's listing of run1/c1/: %v, want %v", names, want)
	}
	for name, want := range map[string]bool{"run1/c10/agent.a.3.jsonl": true, "run1/c1/owner.o.2.jsonl": false, "run1/c9/none": false} {
		if live, err := leaderObjectLive(ctx, nc, jetstream.BucketRecords, name); err != nil || live != want {
			t.Errorf("%s there: %v, %v; want %v", name, live, err, want)
		}
	}
}

// A phase's gate on core NATS takes each member's first valid ack and
// nothing else of it: a repeat, garbage, or an ack of another epoch or
// sequence is dropped; past liveGarbage refusals a member's messages are
// dropped undecoded, its valid ack too, and the ack its probe's answer
// carries is still taken. Another member's place is not touched.
func TestLiveGateTakesTheFirstValidAck(t *testing.T) {
	h := events.PhaseHeader{Run: "run1", CheckpointID: "c1", Seq: 4, Epoch: 2, Deadline: time.Now().Add(time.Minute)}
	g := newLiveGate("run1", events.PhaseCommit, h, zerolog.Nop())
	ack := func(m events.Member, seq, epoch uint64) *nats.Msg {
		t.Helper()
		a := events.CommitAck{AckHeader: events.AckHeader{Run: "run1", Member: m, Seq: seq, CheckpointID: "c1", Epoch: epoch, OK: true, State: events.StateCommitted}}
		msg, err := events.Marshal(m, a)
		if err != nil {
			t.Fatal(err)
		}
		msg.Subject = events.LiveAckSubject("run1", 4, events.PhaseCommit, m)
		return msg
	}
	junk := func(m events.Member) *nats.Msg {
		return &nats.Msg{Subject: events.LiveAckSubject("run1", 4, events.PhaseCommit, m), Data: []byte("junk")}
	}
	if a, _ := g.admit(ack("sandbox.s1", 4, 1)); a != nil {
		t.Fatal("an ack of another epoch was taken")
	}
	if a, _ := g.admit(junk("sandbox.s1")); a != nil {
		t.Fatal("garbage was taken")
	}
	if a, ev := g.admit(ack("sandbox.s1", 4, 2)); a == nil || a.Header().Member != "sandbox.s1" || ev.ID() == "" {
		t.Fatalf("the first valid ack: %v", a)
	}
	if a, _ := g.admit(ack("sandbox.s1", 4, 2)); a != nil {
		t.Fatal("a second ack of the same member was taken")
	}
	for range liveGarbage {
		g.admit(junk("sandbox.s2"))
	}
	if a, _ := g.admit(ack("sandbox.s2", 4, 2)); a != nil {
		t.Fatal("a member's ack was decoded past its garbage limit")
	}
	if a, _ := g.admitAsked("sandbox.s2", &nats.Msg{Data: []byte("instance")}); a != nil {
		t.Fatal("an answer that is no ack was taken")
	}
	answer := ack("sandbox.s2", 4, 2)
	if a, _ := g.admitAsked("sandbox.s2", &nats.Msg{Subject: "_INBOX.x", Header: answer.Header, Data: answer.Data}); a == nil {
		t.Fatal("the ack a probe's answer carries was not taken past the flood")
	}
	if a, _ := g.admit(ack("sandbox.s3", 4, 2)); a == nil {
		t.Fatal("another member's first ack was not taken")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.refused["sandbox.s1"] != 2 || g.refused["sandbox.s2"] != liveGarbage || g.dropped != 2 {
		t.Errorf("refused %v, dropped %d", g.refused, g.dropped)
	}
}
