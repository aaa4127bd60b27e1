package bridge_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// sandboxes starts n members of kind sandbox with a daemon's abilities.
func sandboxes(t *testing.T, env *jstest.Env, n int) []*membertest.Handle {
	t.Helper()
	var hs []*membertest.Handle
	for i := range n {
		name := events.Member(fmt.Sprintf("sandbox.s%d", i))
		hs = append(hs, membertest.StartMember(t, env, run, name, membertest.NewParticipant(name.Name()), membertest.Options{}))
	}
	return hs
}

// phaseOf reads the last phase p of the run from the stream.
func phaseOf(t *testing.T, env *jstest.Env, p events.Phase) events.PhaseEvent {
	t.Helper()
	raw, err := env.Bus.Stream.GetLastMsgForSubject(t.Context(), events.PhaseSubject(run, p))
	if err != nil {
		t.Fatalf("the last %s: %v", p, err)
	}
	_, d, err := events.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
	if err != nil {
		t.Fatal(err)
	}
	return d.(events.PhaseEvent)
}

// PROTOCOL §3, Rosters; §5, commit: a checkpoint of agents and sandbox
// daemons names the daemons in one roster, which the prepare and the
// resume name; the commit goes to the agents only, and every daemon still
// prepared, paused until the resume; the result and the outcome name them
// all. A stop commit addresses the daemons too.
func TestSandboxDaemonsAreAddressedByRoster(t *testing.T) {
	env := jstest.Start(t)
	agents := fleet(t, env, 2, 1)
	sbs := sandboxes(t, env, 3)
	b := startBridge(t, env, bridge.Config{})

	res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1"})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c1: %+v %v", res, err)
	}
	if len(res.Members) != 5 {
		t.Fatalf("result names %v, want the 2 agents and the 3 sandbox daemons", res.Members)
	}
	prep, commit, resume := phaseOf(t, env, events.PhasePrepare).Header(), phaseOf(t, env, events.PhaseCommit).Header(), phaseOf(t, env, events.PhaseResume).Header()
	if prep.Sandboxes == nil || prep.Sandboxes.Count != 3 || len(prep.Members) != 2 {
		t.Fatalf("prepare: members %v, sandboxes %+v", prep.Members, prep.Sandboxes)
	}
	if commit.Sandboxes != nil || len(commit.Members) != 2 {
		t.Fatalf("commit: members %v, sandboxes %+v: a daemon is sent no commit", commit.Members, commit.Sandboxes)
	}
	if r, p := resume.Sandboxes, prep.Sandboxes; r == nil || r.StreamSeq != p.StreamSeq || r.Seq != p.Seq || !r.Same(*p) {
		t.Fatalf("resume names roster %+v, the prepare %+v: the same daemons, the same roster", resume.Sandboxes, prep.Sandboxes)
	}
	raw, err := env.Bus.Stream.GetMsg(t.Context(), prep.Sandboxes.StreamSeq)
	if err != nil || raw.Subject != events.RosterSubject(run, prep.Seq) {
		t.Fatalf("the roster at %d: %v %v", prep.Sandboxes.StreamSeq, raw, err)
	}
	var roster events.Roster
	if err := json.Unmarshal(raw.Data, &roster); err != nil || len(roster.Members) != 3 {
		t.Fatalf("roster %+v %v", roster, err)
	}
	// The daemons' prepare acks travel on core NATS: the stream holds the
	// bridge's record of them, and none of its own (PROTOCOL §3, acks).
	var rec events.PrepareAcked
	if raw, err := env.Bus.Stream.GetLastMsgForSubject(t.Context(), events.PrepareAckedSubject(run, prep.Seq, 1)); err != nil {
		t.Fatalf("the record of the prepare's daemons' acks: %v", err)
	} else if _, d, err := events.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}); err != nil {
		t.Fatalf("the record of the prepare's daemons' acks: %v", err)
	} else {
		rec = d.(events.PrepareAcked)
	}
	if rec.Expected != 3 || rec.Answered != 3 || rec.Ready != 3 || rec.MissingCount+rec.ErrorCount+rec.NotReadyCount != 0 || rec.MaxMS <= 0 ||
		rec.Part != 1 || rec.Parts != 1 || rec.NotableCount != 0 || len(rec.Acks) != 0 {
		t.Errorf("prepare record %+v, want 3 of 3 daemons ready, with latencies, in 1 part, none notable", rec)
	}
	for _, s := range sbs {
		if got := s.Participant.Count("prepare"); got != 1 {
			t.Errorf("%s prepared %d times", s.Name, got)
		}
		if _, err := env.Bus.Stream.GetLastMsgForSubject(t.Context(), events.AckSubject(run, prep.Seq, events.PhasePrepare, s.Name)); err == nil {
			t.Errorf("%s's prepare ack is in the stream: it travels on core NATS", s.Name)
		}
		if _, ok := membertest.NewBridge(t, env, run).Lookup(commit.Seq, events.PhaseCommit, s.Name); ok {
			t.Errorf("%s answered a commit that does not address it", s.Name)
		}
	}
	poll.Wait(t, 10*time.Second, "every member to reopen admission", func() bool { return allOpen(agents) && allOpen(sbs) })

	res, err = b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c2", Stop: true})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c2: %+v %v", res, err)
	}
	c := phaseOf(t, env, events.PhaseCommit).Header()
	if c.Sandboxes == nil || c.Sandboxes.Count != 3 {
		t.Fatalf("a stop commit: sandboxes %+v, want the 3 daemons", c.Sandboxes)
	}
	// The daemons' commit acks travel on core NATS too; the bridge
	// records each in the stream on its ack subject, the daemon's event
	// with no message id of the daemon's choosing (PROTOCOL §3, acks).
	for _, s := range sbs {
		commitAckRecorded(t, env, c.Seq, s.Name)
	}
}

// commitAckRecorded checks that the stream holds daemon m's commit ack of
// commit seq, as the bridge records it: the daemon's own event, ok, with
// no manifest (a daemon exports nothing) and no Nats-Msg-Id.
func commitAckRecorded(t *testing.T, env *jstest.Env, seq uint64, m events.Member) {
	t.Helper()
	raw, err := env.Bus.Stream.GetLastMsgForSubject(t.Context(), events.AckSubject(run, seq, events.PhaseCommit, m))
	if err != nil {
		t.Errorf("%s's commit ack of seq %d in the stream: %v", m, seq, err)
		return
	}
	e, d, err := events.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
	if err != nil {
		t.Errorf("%s's recorded commit ack: %v", m, err)
		return
	}
	a, ok := d.(events.CommitAck)
	if !ok || a.Member != m || !a.OK || a.Manifest != nil || e.Source() != "/"+run+"/"+string(m) {
		t.Errorf("%s's recorded commit ack: %+v from %s", m, d, e.Source())
	}
	if id := raw.Header.Get(nats.MsgIdHdr); id != "" {
		t.Errorf("%s's recorded commit ack has message id %q, which the daemon chose", m, id)
	}
}

// PROTOCOL §3, live acks: a sandbox's workload holds its daemon's
// credentials and floods the daemon's ack subjects of every phase with
// garbage and with acks of another epoch, on core NATS, for the whole of
// two checkpoints. The bridge hears those subjects only while it waits,
// takes each daemon's first valid ack and drops the rest (bounded work),
// and a daemon whose subject its flood buries answers the probe with its
// ack: both checkpoints commit, the stop commit with every daemon's commit
// ack recorded.
func TestDaemonAckFloodDoesNotStopACheckpoint(t *testing.T) {
	env := jstest.Start(t)
	fleet(t, env, 1, 1)
	sbs := sandboxes(t, env, 2)
	victim := sbs[0].Name
	b := startBridge(t, env, bridge.Config{})
	nc, _ := env.Connect(t)
	fctx, stop := context.WithCancel(t.Context())
	var sent atomic.Int64
	flooded := make(chan struct{})
	go func() {
		defer close(flooded)
		junk := []byte(`{"not":"an ack"}`)
		for n := 0; fctx.Err() == nil; n++ {
			for seq := uint64(1); seq <= 12; seq++ {
				for _, p := range []events.Phase{events.PhasePrepare, events.PhaseCommit, events.PhaseResume} {
					subject := events.LiveAckSubject(run, seq, p, victim)
					for range 32 {
						_ = nc.Publish(subject, junk)
					}
					// A well-formed ack, of an epoch no phase has.
					a := events.PrepareAck{AckHeader: events.AckHeader{Run: run, Member: victim, Seq: seq, CheckpointID: "c1",
						Epoch: 99, OK: true, State: events.StatePrepared}, Ready: true}
					if msg, err := events.Marshal(victim, a); err == nil && p == events.PhasePrepare {
						_ = nc.PublishMsg(msg)
					}
					sent.Add(33)
				}
			}
			_ = nc.Flush()
		}
	}()
	defer func() { stop(); <-flooded }()
	poll.Wait(t, 10*time.Second, "the flood to start", func() bool { return sent.Load() > 1000 })

	res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1", TimeoutMS: 30000})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c1 under the flood: %+v %v", res, err)
	}
	if !slices.Contains(res.Members, victim) {
		t.Errorf("c1 names %v: the flooded daemon answered, and is in it", res.Members)
	}
	res, err = b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c2", Stop: true, TimeoutMS: 30000})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c2 under the flood: %+v %v", res, err)
	}
	c := phaseOf(t, env, events.PhaseCommit).Header()
	for _, s := range sbs {
		commitAckRecorded(t, env, c.Seq, s.Name)
	}
	t.Logf("%d messages flooded on %s's ack subjects", sent.Load(), victim)
}

// PROTOCOL §3, Liveness: a sandbox daemon whose process is gone while its
// heartbeat still lives (minutes, jetstream.DefaultSandboxTTL) is found
// gone by the bridge's probe, nothing answering on its alive subject, and
// left out of the phase, seconds in, rather than failing the checkpoint at
// its deadline.
func TestSilentSandboxDaemonIsLeftOut(t *testing.T) {
	env := jstest.Start(t)
	fleet(t, env, 1, 1)
	sandboxes(t, env, 1)
	ghost := events.Member("sandbox.ghost")
	v, _ := json.Marshal(events.MemberInfo{Run: run, Member: ghost, Instance: "gone", Started: time.Now().UTC(), Heartbeat: time.Now().UTC()})
	if _, err := env.Bus.Daemons.Put(t.Context(), events.MemberKey(run, ghost), v); err != nil {
		t.Fatal(err)
	}
	b := startBridge(t, env, bridge.Config{})
	start := time.Now()
	res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1", TimeoutMS: 30000})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c1: %+v %v", res, err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("the silent daemon held the checkpoint %s", took)
	}
	if slices.Contains(res.Members, ghost) || len(res.Members) != 2 {
		t.Fatalf("result names %v: the gone daemon is left out", res.Members)
	}
	if prep := phaseOf(t, env, events.PhasePrepare).Header(); prep.Sandboxes == nil || prep.Sandboxes.Count != 2 {
		t.Fatalf("the prepare's roster %+v: it was listed", prep.Sandboxes)
	}
}

// A daemon found gone by the probe is left out of the next phases while
// its heartbeat still lives, not asked again at each; one that heartbeats
// again is back.
func TestSilentSandboxDaemonStaysOut(t *testing.T) {
	env := jstest.Start(t)
	fleet(t, env, 1, 1)
	ghost := events.Member("sandbox.ghost")
	put := func(instance string) {
		t.Helper()
		v, _ := json.Marshal(events.MemberInfo{Run: run, Member: ghost, Instance: instance, Started: time.Now().UTC(), Heartbeat: time.Now().UTC()})
		if _, err := env.Bus.Daemons.Put(t.Context(), events.MemberKey(run, ghost), v); err != nil {
			t.Fatal(err)
		}
	}
	put("gone")
	b := startBridge(t, env, bridge.Config{})
	if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1", TimeoutMS: 30000}); err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c1: %+v %v", res, err)
	}
	start := time.Now()
	res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c2"})
	if err != nil || res.Status != bridgeapi.StatusCommitted || slices.Contains(res.Members, ghost) {
		t.Fatalf("c2: %+v %v", res, err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("c2 took %s: the daemon found gone was asked again", took)
	}
	put("back") // a heartbeat again: listed again (and, silent, found gone again)
	res, err = b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c3", TimeoutMS: 30000})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c3: %+v %v", res, err)
	}
	if p := phaseOf(t, env, events.PhasePrepare).Header(); p.Sandboxes == nil || p.Sandboxes.Count != 1 {
		t.Fatalf("c3's prepare: sandboxes %+v, want the daemon that heartbeat again", p.Sandboxes)
	}
}

// A roster gone from the stream (aged out under a checkpoint held longer
// than the stream keeps a message, or purged) does not leave the run's
// open operation unrecoverable: another bridge takes the sandbox daemons
// alive now for it, and aborts the checkpoint, resuming the daemons.
func TestHeldCheckpointOutlivesItsRoster(t *testing.T) {
	env := jstest.Start(t)
	agents := fleet(t, env, 1, 1)
	sbs := sandboxes(t, env, 2)
	b := newBridge(t, env, bridge.Config{PhaseTimeout: 30 * time.Second})
	res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1", Hold: true})
	if err != nil || res.Status != bridgeapi.StatusPrepared {
		t.Fatalf("hold: %+v %v", res, err)
	}
	prep := phaseOf(t, env, events.PhasePrepare).Header()
	if prep.Sandboxes == nil {
		t.Fatal("the prepare names no roster")
	}
	if err := env.Bus.Stream.DeleteMsg(ctx(t), prep.Sandboxes.StreamSeq); err != nil {
		t.Fatal(err)
	}
	b2 := newBridge(t, env, bridge.Config{PhaseTimeout: 30 * time.Second, Name: "second"})
	if st, err := b2.Status(ctx(t)); err != nil || st.LastCheckpoint != "c1" {
		t.Fatalf("status with the roster gone: %+v %v", st, err)
	}
	// The prepare left open by another bridge is aborted: every member
	// resumed, the daemons by the ones alive.
	if err := b2.Recover(ctx(t)); err != nil {
		t.Fatalf("recover with the roster gone: %v", err)
	}
	if r := phaseOf(t, env, events.PhaseResume).Header(); r.Sandboxes == nil || r.Sandboxes.Count != 2 {
		t.Fatalf("the resume names sandboxes %+v, want the 2 daemons alive", r.Sandboxes)
	}
	poll.Wait(t, 10*time.Second, "every member to reopen admission", func() bool { return allOpen(agents) && allOpen(sbs) })
}

// PROTOCOL §3, acks and Liveness (membertest.RunAsker): a sandbox
// daemon's prepare ack travels on core NATS, which delivers at most once.
// A daemon whose ack the bridge did not hear (here one that never sends it
// unasked) is asked whether it is there, with the prepare named, once the
// phase is a few seconds old; it says its ack again and the checkpoint
// commits, where it would have failed at its deadline, the daemon being
// alive. The bridge records the ack heard after the probe began.
func TestBridgeAsksSilentDaemons(t *testing.T) {
	membertest.RunAsker(t, membertest.AskerSuite{AwaitPrepareAck: func(t *testing.T, env *jstest.Env, run string, quiet events.Member) error {
		fleet(t, env, 1, 1)
		sandboxes(t, env, 2)
		b := startBridge(t, env, bridge.Config{})
		res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1", TimeoutMS: 20000})
		if err != nil || res.Status != bridgeapi.StatusCommitted {
			return fmt.Errorf("c1: %+v %v", res, err)
		}
		if !slices.Contains(res.Members, quiet) {
			return fmt.Errorf("the result names %v, without %s", res.Members, quiet)
		}
		prep := phaseOf(t, env, events.PhasePrepare).Header()
		raw, err := env.Bus.Stream.GetLastMsgForSubject(t.Context(), events.PrepareAckedSubject(run, prep.Seq, 1))
		if err != nil {
			return fmt.Errorf("the record of the prepare's daemons' acks: %w", err)
		}
		var rec events.PrepareAcked
		if err := json.Unmarshal(raw.Data, &rec); err != nil || rec.Expected != 3 || rec.Answered != 3 || rec.Ready != 3 || rec.MaxMS < 2000 {
			return fmt.Errorf("prepare record %+v %v: want 3 of 3 ready, the last after the probe began", rec, err)
		}
		return nil
	}})
}
