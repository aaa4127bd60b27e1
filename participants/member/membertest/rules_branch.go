package membertest

import (
	"slices"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/member"
)

// branchRules runs the subtests of the branch phase (§5, Branch).
func branchRules(t *testing.T, h Suite) {
	t.Run("§5 Branch: an outside phase that branches the parents a member holds", func(t *testing.T) {
		s := newWorld(t, h)
		a, b := s.name("c0"), s.name("c1")
		hd := s.start(a, Options{})
		s.start(b, Options{}) // a member with no records anywhere
		eps := hd.Subject.AddWork(t, 3)
		q1 := s.committedAt(a, "k1", eps)
		q2 := s.committedAt(a, "k2", eps[1:])
		specs := []events.BranchSpec{events.NewBranchSpec(eps[0], 1, 11), events.NewBranchSpec(eps[0], 2, 12), events.NewBranchSpec(eps[1], 1, 13)}
		d := events.Branch{PhaseHeader: s.bridge.Header("b1", 10*time.Second, a, b), Source: "k2", SourceCommitSeq: q2, Branches: specs,
			Carried: []events.CarriedSource{{Source: "k1", SourceCommitSeq: q1, Episodes: eps[:1]}}}
		seq := s.bridge.Publish(d)
		ra := s.bridge.Ack(seq, events.PhaseBranch, a).(events.BranchAck)
		rb := s.bridge.Ack(seq, events.PhaseBranch, b).(events.BranchAck)
		s.expect(rb, "", events.StateIdle)
		if len(rb.Branched) != 0 {
			t.Fatalf("a member with no records branched %v", rb.Branched)
		}
		_, brancher := hd.Subject.(member.Brancher)
		switch {
		case h.NoRecords:
			s.expect(ra, "", events.StateIdle)
			if len(ra.Branched) != 0 {
				t.Fatalf("a member that exports nothing branched %v", ra.Branched)
			}
		case !brancher:
			s.expect(ra, events.CodeInstallFailed, events.StateIdle)
		default:
			s.expect(ra, "", events.StateIdle)
			var want []string
			for _, sp := range specs {
				want = append(want, sp.Episode.String())
			}
			slices.Sort(want)
			if !slices.Equal(ra.Branched, want) {
				t.Fatalf("branched %v, want %v", ra.Branched, want)
			}
			// The same operation again answers what the first did.
			again := s.phase(a, events.Branch{PhaseHeader: s.bridge.Header("b1", 10*time.Second, a), Source: "k2", SourceCommitSeq: q2, Branches: specs,
				Carried: d.Carried}).(events.BranchAck)
			s.expect(again, "", events.StateIdle)
			if !slices.Equal(again.Branched, want) {
				t.Fatalf("repeat branched %v, want %v", again.Branched, want)
			}
		}
		// A branch is refused while a checkpoint is open.
		s.expect(s.prepare(a, "k3", 10*time.Second), "", events.StatePrepared)
		s.expect(s.phase(a, events.Branch{PhaseHeader: s.bridge.Header("b2", 10*time.Second, a), Source: "k2", Branches: specs[2:]}),
			events.CodeInvalidPhase, events.StatePrepared)
		s.expect(s.resume(a, "k3"), "", events.StateIdle)
	})
}

// committedAt checkpoints scope on m as id and returns the commit's
// sequence, by which a later operation finds m's manifest (its commit ack).
func (s *world) committedAt(m events.Member, id string, scope []events.Episode) uint64 {
	s.t.Helper()
	s.expect(s.prepare(m, id, 10*time.Second), "", events.StatePrepared)
	seq := s.bridge.Publish(events.Commit{PhaseHeader: s.bridge.Header(id, 10*time.Second, m), Scope: scope})
	s.expect(s.bridge.Ack(seq, events.PhaseCommit, m), "", events.StateCommitted)
	s.expect(s.resume(m, id), "", events.StateIdle)
	return seq
}
