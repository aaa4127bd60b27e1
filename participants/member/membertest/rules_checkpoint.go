package membertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/member"
)

// checkpointRules runs the subtests of registration (§3), a checkpoint's
// phases and their idempotence (§5), and event decoding (§4).
func checkpointRules(t *testing.T, h Suite) {
	t.Run("§3 registration: heartbeat, served flag, joined and left", func(t *testing.T) {
		s := newWorld(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{})
		info, ok := s.info(a)
		if !ok || info.Served || info.Run != s.run || info.Member != a {
			t.Fatalf("heartbeat %+v (present %v); want an unserved member", info, ok)
		}
		sandbox := a.Kind() == events.KindSandbox // announces nothing (lastMembership)
		if j, ok := s.lastMembership(a).(events.MemberJoined); !sandbox && (!ok || j.Member != a) {
			t.Fatalf("last membership event %#v, want MemberJoined", j)
		}
		hd.Subject.AddWork(t, 1)
		s.expect(s.prepare(a, "c1", 10*time.Second), "", events.StatePrepared)
		if info, _ := s.info(a); !info.Served || info.Epoch != 0 {
			t.Fatalf("heartbeat after a prepare %+v, want served in epoch 0", info)
		}
		s.expect(s.resume(a, "c1"), "", events.StateIdle)
		if err := hd.Stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if _, ok := s.info(a); ok {
			t.Fatal("heartbeat key still there after a clean stop")
		}
		if l, ok := s.lastMembership(a).(events.MemberLeft); !sandbox && (!ok || l.Reason != "shutdown") {
			t.Fatalf("last membership event %#v, want MemberLeft{shutdown}", l)
		}
	})

	t.Run("§5 prepare, commit, resume: the manifest verifies", func(t *testing.T) {
		s := newWorld(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{})
		eps := hd.Subject.AddWork(t, 3)
		p := s.prepare(a, "c1", 10*time.Second)
		s.expect(p, "", events.StatePrepared)
		if !p.Ready || p.BlockerCount != 0 {
			t.Fatalf("prepare ack %+v, want ready", p)
		}
		c := s.commit(a, "c1", eps, false)
		s.expect(c, "", events.StateCommitted)
		// PROTOCOL §5, commit: the commit ack is the manifest's record; an
		// export of nothing carries none, and writes no member key.
		got, recs, err := member.ReadRecordsAt(t.Context(), s.env.Bus, s.run, "c1", a, c.Seq, nil)
		if h.NoRecords {
			if c.Manifest != nil || !errors.Is(err, member.ErrNoManifest) {
				t.Fatalf("manifest %+v of a participant without records (read: %v), want none", c.Manifest, err)
			}
		} else {
			if err != nil {
				t.Fatalf("ReadRecordsAt: %v", err)
			}
			if c.Manifest == nil {
				t.Fatal("a commit ack of exported records without their manifest")
			}
		}
		if _, err := s.env.Bus.Manifests.Get(t.Context(), events.MemberManifestKey(s.run, "c1", a)); !errors.Is(err, natsjs.ErrKeyNotFound) {
			t.Fatalf("member manifest key after a commit: %v, want none (PROTOCOL-HISTORY §35)", err)
		}
		var man events.MemberManifest
		if c.Manifest != nil {
			man = *c.Manifest
		}
		if !slices.Equal(got.Episodes, man.Episodes) || got.SHA256 != man.SHA256 || got.Count != len(recs) {
			t.Fatalf("stored manifest %+v, ack's %+v, %d records", got, man, len(recs))
		}
		for _, k := range keys(eps) {
			if !h.NoRecords && !slices.Contains(man.Episodes, k) {
				t.Errorf("manifest episodes %v lack %s", man.Episodes, k)
			}
		}
		s.expect(s.resume(a, "c1"), "", events.StateIdle)
		if live := hd.Subject.Live(); !isSubset(keys(eps), live) {
			t.Fatalf("live %v after resume, want %v kept", live, keys(eps))
		}
	})

	t.Run("§5 Idempotence: a redelivered event is a no-op", func(t *testing.T) {
		s := newWorld(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{})
		eps := hd.Subject.AddWork(t, 2)
		pd := events.Prepare{PhaseHeader: s.bridge.Header("c1", 10*time.Second, a)}
		s.expect(s.bridge.Ack(s.bridge.Publish(pd), events.PhasePrepare, a), "", events.StatePrepared)
		cd := events.Commit{PhaseHeader: s.bridge.Header("c1", 10*time.Second, a), Scope: eps}
		c := s.bridge.Ack(s.bridge.Publish(cd), events.PhaseCommit, a).(events.CommitAck)
		s.expect(c, "", events.StateCommitted)
		// The same events again: inside the duplicate window (dropped by the
		// server) and under new ids (stored again, delivered again).
		for i, d := range []events.PhaseEvent{pd, cd} {
			s.bridge.Publish(d)
			s.bridge.PublishWithID(d, fmt.Sprintf("again-%d", i))
		}
		s.bridge.Barrier(a)
		for _, x := range []struct {
			seq uint64
			p   events.Phase
		}{{pd.Seq, events.PhasePrepare}, {cd.Seq, events.PhaseCommit}} {
			if n := s.bridge.AckCount(x.seq, x.p, a); n != 1 {
				t.Errorf("%s %d has %d acks, want 1", x.p, x.seq, n)
			}
		}
		if again := s.bridge.Ack(cd.Seq, events.PhaseCommit, a).(events.CommitAck); sha(again.Manifest) != sha(c.Manifest) {
			t.Fatalf("commit ack changed: %+v, was %+v", again.Manifest, c.Manifest)
		}
	})

	t.Run("§5 Idempotence: duplicate phases get the same reply, export once", func(t *testing.T) {
		s := newWorld(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{})
		eps := hd.Subject.AddWork(t, 3)
		p1 := s.prepare(a, "c1", 10*time.Second)
		p2 := s.prepare(a, "c1", 10*time.Second)
		s.expect(p1, "", events.StatePrepared)
		s.expect(p2, "", events.StatePrepared)
		if !p2.Ready || p2.Seq == p1.Seq {
			t.Fatalf("second prepare ack %+v, want the recorded ready reply on its own seq", p2)
		}
		c1 := s.commit(a, "c1", eps, false)
		c2 := s.commit(a, "c1", eps, false)
		s.expect(c1, "", events.StateCommitted)
		s.expect(c2, "", events.StateCommitted)
		if sha(c1.Manifest) != sha(c2.Manifest) || (c1.Manifest == nil) != (c2.Manifest == nil) ||
			c1.Manifest != nil && c1.Manifest.Count != c2.Manifest.Count {
			t.Fatalf("second commit manifest %+v, first %+v: exported twice?", c2.Manifest, c1.Manifest)
		}
		for _, c := range []events.CommitAck{c1, c2} {
			if _, _, err := member.ReadRecordsAt(t.Context(), s.env.Bus, s.run, "c1", a, c.Seq, nil); err != nil && !(h.NoRecords && errors.Is(err, member.ErrNoManifest)) {
				t.Fatalf("ReadRecordsAt the commit %d after a duplicate commit: %v", c.Seq, err)
			}
		}
		// A commit of another scope while this one is recorded is still the
		// recorded reply: the checkpoint was written once.
		s.expect(s.resume(a, "c1"), "", events.StateIdle)
		s.expect(s.resume(a, "c1"), "", events.StateIdle)
	})

	t.Run("§5 a resume during a commit write: no manifest, ever", func(t *testing.T) {
		if h.NoRecords {
			resumeRacingCommit(t, h)
			return
		}
		s := newWorld(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{})
		eps := hd.Subject.AddWork(t, 4)
		reached := make(chan struct{})
		stopped := make(chan struct{})
		hd.Subject.PaceWrites(func(ctx context.Context, i int) {
			if i == 2 {
				close(reached)
				<-ctx.Done()
				close(stopped)
			}
		})
		s.expect(s.prepare(a, "c1", 10*time.Second), "", events.StatePrepared)
		cseq := s.bridge.Publish(events.Commit{PhaseHeader: s.bridge.Header("c1", 10*time.Second, a), Scope: eps})
		waitClosed(t, reached, "the commit write to reach record 2")
		s.expect(s.resume(a, "c1"), "", events.StateIdle)
		waitClosed(t, stopped, "the writer to stop")
		// The commit's one ack is the stale answer: no manifest is recorded.
		s.expect(s.bridge.Ack(cseq, events.PhaseCommit, a), events.CodeStaleCheckpoint, events.StateIdle)
		if _, err := member.FindManifest(t.Context(), s.env.Bus, s.run, "c1", a, cseq); !errors.Is(err, member.ErrNoManifest) {
			t.Fatalf("manifest after a resume during the write: %v, want none", err)
		}
		if has, err := member.HasObjects(t.Context(), s.env.Bus.Records, s.run, "c1", a); has || err != nil {
			t.Fatalf("records object after a stopped write: %v %v, want none", has, err)
		}
		hd.Subject.PaceWrites(nil)
		later := s.commit(a, "c1", eps, false)
		s.expect(later, events.CodeStaleCheckpoint, events.StateIdle)
		s.bridge.Barrier(a)
		for _, seq := range []uint64{cseq, later.Seq} {
			if n := s.bridge.AckCount(seq, events.PhaseCommit, a); n != 1 {
				t.Fatalf("commit %d has %d acks, want its one stale answer", seq, n)
			}
			if _, err := member.FindManifest(t.Context(), s.env.Bus, s.run, "c1", a, seq); !errors.Is(err, member.ErrNoManifest) {
				t.Fatalf("a manifest of commit %d appeared later: %v", seq, err)
			}
		}
	})

	t.Run("§4 a malformed event is refused and changes nothing", func(t *testing.T) {
		s := newWorld(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{})
		hd.Subject.AddWork(t, 1)
		msg, err := events.Marshal(s.bridge.Name, events.Prepare{PhaseHeader: s.bridge.Header("c1", 10*time.Second, a)})
		if err != nil {
			t.Fatal(err)
		}
		msg.Data = []byte(`{"run":"run1","checkpoint_id":"c1","seq":"one"}`)
		if _, err := s.env.JS.PublishMsg(t.Context(), msg); err != nil {
			t.Fatal(err)
		}
		s.bridge.Barrier(a)
		s.expect(s.prepare(a, "c1", 10*time.Second), "", events.StatePrepared)
	})
}

// resumeRacingCommit is the resume-during-a-commit-write rule for a
// participant without records: nothing to pace, so a commit and a resume
// are published back to back and whichever the member handles first
// wins. Either the commit was answered before the resume (its manifest
// exists), or it was cut short (stale_checkpoint) and its manifest never
// appears, not even after a barrier and another commit.
func resumeRacingCommit(t *testing.T, h Suite) {
	s := newWorld(t, h)
	a := s.name("c0")
	hd := s.start(a, Options{})
	eps := hd.Subject.AddWork(t, 2)
	s.expect(s.prepare(a, "c1", 10*time.Second), "", events.StatePrepared)
	cseq := s.bridge.Publish(events.Commit{PhaseHeader: s.bridge.Header("c1", 10*time.Second, a), Scope: eps})
	s.expect(s.resume(a, "c1"), "", events.StateIdle)
	c := s.bridge.Ack(cseq, events.PhaseCommit, a)
	switch Code(c) {
	case "":
		t.Log("the commit was handled before the resume")
		s.expect(c, "", events.StateCommitted)
		return
	case events.CodeStaleCheckpoint:
		t.Log("the resume cut the commit short")
	default:
		s.expect(c, events.CodeStaleCheckpoint, events.StateIdle)
	}
	if n := s.bridge.AckCount(cseq, events.PhaseCommit, a); n != 1 {
		t.Fatalf("commit %d has %d acks after a resume cut it short, want its one stale answer", cseq, n)
	}
	later := s.commit(a, "c1", eps, false)
	s.expect(later, events.CodeStaleCheckpoint, events.StateIdle)
	s.bridge.Barrier(a)
	if n := s.bridge.AckCount(later.Seq, events.PhaseCommit, a); n != 1 {
		t.Fatalf("commit %d has %d acks, want its one stale answer", later.Seq, n)
	}
}

// sha is the digest a commit ack's manifest names, "" for none.
func sha(m *events.MemberManifest) string {
	if m == nil {
		return ""
	}
	return m.SHA256
}
