package membertest

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/member"
)

// restoreRules runs the subtests of restore, retire marks and epochs (§5).
func restoreRules(t *testing.T, h Suite) {
	t.Run("§5 restore: all or none, next attempts, only into a fresh member", func(t *testing.T) {
		s := newWorld(t, h)
		a, b := s.name("c0"), s.name("c1")
		hd := s.start(a, Options{})
		eps := hd.Subject.AddWork(t, 3)
		s.checkpoint(a, "k1", eps)
		bad := s.checkpoint(a, "k2", eps[:2])
		// A served member refuses a restore of its own epoch.
		s.expect(s.phase(a, events.Restore{PhaseHeader: s.bridge.Header("r0", 10*time.Second, a), Source: "k1", Scope: eps}),
			events.CodeInvalidPhase, events.StateIdle)
		if err := hd.Stop(); err != nil {
			t.Fatalf("Run: %v", err)
		}
		source := "k2"
		if h.NoRecords {
			// No object to damage: a manifest of no records whose digest is
			// not that of no bytes is just as corrupt.
			source = "k3"
			forged := bad
			forged.CheckpointID, forged.SHA256 = source, strings.Repeat("ab", 32)
			forged.Object = events.RecordsObject(s.run, source, a, forged.SHA256)
			if err := member.CreateManifest(t.Context(), s.env.Bus.Manifests, forged); err != nil {
				t.Fatal(err)
			}
		} else {
			data, err := s.env.Bus.Records.GetBytes(t.Context(), bad.Object)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.env.Bus.Records.PutBytes(t.Context(), bad.Object, append(data, data...)); err != nil {
				t.Fatal(err)
			}
		}

		fresh := s.start(a, Options{}) // a new process of the same member
		s.bridge.Epoch = 1
		r := s.phase(a, events.Restore{PhaseHeader: s.bridge.Header("r1", 10*time.Second, a), Source: source, Scope: eps[:2]}).(events.RestoreAck)
		if h.NoRecords {
			// A participant that neither exports nor installs reads no
			// manifest at a restore (its credentials may read none): the
			// forged one is not its to find, and nothing is installed.
			s.expect(r, "", events.StateRestored)
		} else {
			s.expect(r, member.CodeCorruptRecords, events.StateIdle)
		}
		if live := fresh.Subject.Live(); len(live) != 0 {
			t.Fatalf("live %v after a failed restore, want nothing installed", live)
		}
		s.expect(s.resume(a, "r1"), "", events.StateIdle)
		if h.NoRecords {
			// It served that restore: the next one goes to a fresh process.
			if err := fresh.Stop(); err != nil {
				t.Fatalf("Run: %v", err)
			}
			fresh = s.start(a, Options{})
		}

		s.start(b, Options{}) // a member with no records in k1
		s.bridge.Epoch = 2
		scope := eps[1:]
		seq := s.bridge.Publish(events.Restore{PhaseHeader: s.bridge.Header("r2", 10*time.Second, a, b), Source: "k1", Scope: scope})
		ra := s.bridge.Ack(seq, events.PhaseRestore, a).(events.RestoreAck)
		rb := s.bridge.Ack(seq, events.PhaseRestore, b).(events.RestoreAck)
		s.expect(ra, "", events.StateRestored)
		s.expect(rb, "", events.StateRestored)
		want := nextKeys(scope)
		if h.NoRecords {
			want = []string{} // nothing was exported, nothing comes back
		}
		if !slices.Equal(ra.Restored, want) || ra.Source != "k1" {
			t.Fatalf("restored %v from %s, want %v from k1", ra.Restored, ra.Source, want)
		}
		if len(rb.Restored) != 0 {
			t.Fatalf("member without records restored %v", rb.Restored)
		}
		if live := fresh.Subject.Live(); !slices.Equal(live, want) {
			t.Fatalf("live %v after restore, want %v", live, want)
		}
		for _, m := range []events.Member{a, b} {
			s.expect(s.resume(m, "r2"), "", events.StateIdle)
		}
	})

	t.Run("§5 retire marks refuse attempts until forget", func(t *testing.T) {
		s := newWorld(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{})
		eps := hd.Subject.AddWork(t, 2)
		s.expect(s.phase(a, events.Retire{PhaseHeader: s.bridge.Header("op1", 10*time.Second, a), Episodes: eps[:1]}), "", events.StateIdle)
		if err := hd.Member.Admit(eps[0]); !errors.Is(err, member.ErrStaleAttempt) {
			t.Fatalf("Admit(%s) after retire: %v, want ErrStaleAttempt", eps[0], err)
		}
		if err := hd.Member.Admit(eps[0].Next()); err != nil {
			t.Fatalf("Admit(%s): %v", eps[0].Next(), err)
		}
		if err := hd.Member.Admit(eps[1]); err != nil {
			t.Fatalf("Admit(%s): %v", eps[1], err)
		}
		if live := hd.Subject.Live(); slices.Contains(live, eps[0].String()) {
			t.Fatalf("live %v still holds the retired %s", live, eps[0])
		}
		s.expect(s.phase(a, events.Retire{PhaseHeader: s.bridge.Header("op2", 10*time.Second, a),
			Episodes: []events.Episode{{Rollout: eps[0].Rollout, Attempt: 3}}}), "", events.StateIdle)
		if err := hd.Member.Admit(events.Episode{Rollout: eps[0].Rollout, Attempt: 2}); !errors.Is(err, member.ErrStaleAttempt) {
			t.Fatalf("attempt 2 under mark 3: %v, want ErrStaleAttempt", err)
		}
		s.expect(s.phase(a, events.Forget{PhaseHeader: s.bridge.Header("op3", 10*time.Second, a), Rollouts: []string{eps[0].Rollout}}), "", events.StateIdle)
		if err := hd.Member.Admit(eps[0]); err != nil {
			t.Fatalf("Admit after forget: %v", err)
		}
		s.expect(s.phase(a, events.Release{PhaseHeader: s.bridge.Header("op4", 10*time.Second, a), Keep: []string{"k1"}}), "", events.StateIdle)
	})

	t.Run("§5 Epochs: a newer epoch supersedes a member that served", func(t *testing.T) {
		s := newWorld(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{})
		hd.Subject.AddWork(t, 1)
		s.expect(s.prepare(a, "c1", 10*time.Second), "", events.StatePrepared)
		s.expect(s.resume(a, "c1"), "", events.StateIdle)
		s.bridge.Epoch = 1
		seq := s.bridge.Publish(events.Prepare{PhaseHeader: s.bridge.Header("c2", 10*time.Second, a)})
		waitClosed(t, hd.Done(), "Run to return")
		if err := hd.Err(); !errors.Is(err, member.ErrSuperseded) {
			t.Fatalf("Run: %v, want ErrSuperseded", err)
		}
		if _, ok := s.bridge.Lookup(seq, events.PhasePrepare, a); ok {
			t.Fatal("a superseded member answered the newer epoch")
		}
		if l, ok := s.lastMembership(a).(events.MemberLeft); a.Kind() != events.KindSandbox && (!ok || l.Reason != "superseded" || l.Epoch != 0) {
			t.Fatalf("last membership event %#v, want MemberLeft{superseded, epoch 0}", l)
		}
	})

	t.Run("§5 Epochs: older epochs and phases for others are ignored", func(t *testing.T) {
		s := newWorld(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{})
		hd.Subject.AddWork(t, 1)
		other := s.name("someone")
		nseq := s.bridge.Publish(events.Prepare{PhaseHeader: s.bridge.Header("c1", 10*time.Second, other)})
		s.bridge.Epoch = 1
		s.expect(s.phase(a, events.Restore{PhaseHeader: s.bridge.Header("r1", 10*time.Second, a), Source: "k0"}), "", events.StateRestored)
		s.expect(s.resume(a, "r1"), "", events.StateIdle)
		s.bridge.Epoch = 0
		oseq := s.bridge.Publish(events.Prepare{PhaseHeader: s.bridge.Header("c2", 10*time.Second, a)})
		s.bridge.Epoch = 1
		s.bridge.Barrier(a)
		if _, ok := s.bridge.Lookup(nseq, events.PhasePrepare, a); ok {
			t.Fatal("answered a phase addressed to another member")
		}
		if _, ok := s.bridge.Lookup(oseq, events.PhasePrepare, a); ok {
			t.Fatal("answered a phase of an older epoch")
		}
		p := s.prepare(a, "c3", 10*time.Second)
		s.expect(p, "", events.StatePrepared)
		if p.Epoch != 1 {
			t.Fatalf("ack epoch %d, want 1", p.Epoch)
		}
	})
}
