package membertest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
)

// fencingRules runs the subtests of fencing, readiness and the lease (§5).
func fencingRules(t *testing.T, h Suite) {
	t.Run("§5 Fencing: stale_checkpoint after resume", func(t *testing.T) {
		s := newWorld(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{})
		eps := hd.Subject.AddWork(t, 1)
		s.expect(s.prepare(a, "c1", 10*time.Second), "", events.StatePrepared)
		s.expect(s.resume(a, "c1"), "", events.StateIdle)
		s.expect(s.prepare(a, "c1", 10*time.Second), events.CodeStaleCheckpoint, events.StateIdle)
		s.expect(s.commit(a, "c1", eps, false), events.CodeStaleCheckpoint, events.StateIdle)
		s.expect(s.resume(a, "c1"), "", events.StateIdle)
		// A resume of an id the member never saw fences it too.
		s.expect(s.resume(a, "never"), "", events.StateIdle)
		s.expect(s.prepare(a, "never", 10*time.Second), events.CodeStaleCheckpoint, events.StateIdle)
	})

	t.Run("§5 Fencing: checkpoint_conflict while another is open", func(t *testing.T) {
		s := newWorld(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{})
		eps := hd.Subject.AddWork(t, 1)
		s.expect(s.prepare(a, "c1", 10*time.Second), "", events.StatePrepared)
		s.expect(s.prepare(a, "c2", 10*time.Second), events.CodeCheckpointConflict, events.StatePrepared)
		s.expect(s.commit(a, "c2", eps, false), events.CodeCheckpointConflict, events.StatePrepared)
		s.expect(s.resume(a, "c2"), events.CodeCheckpointConflict, events.StatePrepared)
		s.expect(s.resume(a, "c1"), "", events.StateIdle)
		s.expect(s.prepare(a, "c2", 10*time.Second), "", events.StatePrepared)
	})

	t.Run("§5 Fencing: invalid_phase", func(t *testing.T) {
		s := newWorld(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{})
		eps := hd.Subject.AddWork(t, 1)
		s.expect(s.commit(a, "c1", eps, false), events.CodeInvalidPhase, events.StateIdle)
		s.expect(s.phase(a, events.Renew{PhaseHeader: s.bridge.Header("c1", time.Minute, a)}), events.CodeInvalidPhase, events.StateIdle)
		s.expect(s.prepare(a, "c1", 10*time.Second), "", events.StatePrepared)
		s.expect(s.phase(a, events.Retire{PhaseHeader: s.bridge.Header("op1", 10*time.Second, a), Episodes: eps}), events.CodeInvalidPhase, events.StatePrepared)
		s.expect(s.phase(a, events.Forget{PhaseHeader: s.bridge.Header("op2", 10*time.Second, a), Rollouts: []string{eps[0].Rollout}}), events.CodeInvalidPhase, events.StatePrepared)
		s.expect(s.phase(a, events.Release{PhaseHeader: s.bridge.Header("op3", 10*time.Second, a)}), events.CodeInvalidPhase, events.StatePrepared)
		s.expect(s.phase(a, events.Restore{PhaseHeader: s.bridge.Header("c1", 10*time.Second, a), Source: "c0", Scope: eps}), events.CodeInvalidPhase, events.StatePrepared)
		if err := hd.Member.Admit(eps[0]); err != nil {
			t.Fatalf("Admit after a refused retire: %v", err)
		}
		s.expect(s.resume(a, "c1"), "", events.StateIdle)
	})

	t.Run("§5 prepare: not ready answers its blockers before the deadline", func(t *testing.T) {
		s := newWorld(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{})
		eps := hd.Subject.AddWork(t, 2)
		release := hd.Subject.Hold(eps[0])
		// Long enough for the other episode to pause on a loaded machine.
		hdr := s.bridge.Header("c1", 3*time.Second, a)
		seq := s.bridge.Publish(events.Prepare{PhaseHeader: hdr})
		p := s.bridge.Ack(seq, events.PhasePrepare, a).(events.PrepareAck)
		answered := time.Now()
		s.expect(p, "", events.StatePreparing)
		if p.Ready || p.BlockerCount != 1 || !slices.Equal(p.Blockers, []string{eps[0].String()}) {
			t.Fatalf("prepare ack %+v, want not ready with blocker %s", p, eps[0])
		}
		// The reply time is deadline − min(1 s, a tenth of the time left):
		// about 300 ms before this deadline. Not at once, and not much
		// later.
		if answered.Before(hdr.Deadline.Add(-time.Second)) {
			t.Errorf("answered %s before the deadline: it did not wait", hdr.Deadline.Sub(answered))
		}
		if answered.After(hdr.Deadline.Add(time.Second)) {
			t.Errorf("answered %s after the deadline", answered.Sub(hdr.Deadline))
		}
		s.expect(s.commit(a, "c1", eps, false), events.CodeInvalidPhase, events.StatePreparing)
		release()
		s.expect(s.prepare(a, "c1", 10*time.Second), "", events.StatePrepared)
		s.expect(s.resume(a, "c1"), "", events.StateIdle)
	})

	t.Run("§5 prepare: Notify wakes a waiting prepare", func(t *testing.T) {
		s := newWorld(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{PollEvery: time.Hour})
		eps := hd.Subject.AddWork(t, 1)
		release := hd.Subject.Hold(eps[0])
		seq := s.bridge.Publish(events.Prepare{PhaseHeader: s.bridge.Header("c1", 30*time.Second, a)})
		// The first readiness check has happened once the member is
		// preparing (a conflicting prepare says so).
		poll.Wait(t, 10*time.Second, "the member to be preparing", func() bool {
			return s.prepare(a, "other", 10*time.Second).State == events.StatePreparing
		})
		start := time.Now()
		release()
		s.expect(s.bridge.Ack(seq, events.PhasePrepare, a), "", events.StatePrepared)
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("ready %s after Notify", took)
		}
	})

	t.Run("§5 resume while a prepare waits", func(t *testing.T) {
		s := newWorld(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{})
		eps := hd.Subject.AddWork(t, 1)
		release := hd.Subject.Hold(eps[0])
		defer release()
		seq := s.bridge.Publish(events.Prepare{PhaseHeader: s.bridge.Header("c1", 30*time.Second, a)})
		s.expect(s.resume(a, "c1"), "", events.StateIdle)
		s.expect(s.bridge.Ack(seq, events.PhasePrepare, a), events.CodeStaleCheckpoint, events.StateIdle)
		s.expect(s.prepare(a, "c1", 10*time.Second), events.CodeStaleCheckpoint, events.StateIdle)
	})

	t.Run("§5 Lease: a member resumes by itself when the lease runs out", func(t *testing.T) {
		s := newWorld(t, h)
		a := s.name("c0")
		grace := 300 * time.Millisecond
		hd := s.start(a, Options{Grace: grace})
		hd.Subject.AddWork(t, 1)
		// The member must take the prepare before its deadline, which a
		// loaded machine can delay by a second or more; the lease runs
		// out grace after it.
		hdr := s.bridge.Header("c1", 2*time.Second, a)
		s.expect(s.bridge.Ack(s.bridge.Publish(events.Prepare{PhaseHeader: hdr}), events.PhasePrepare, a), "", events.StatePrepared)
		lease := hdr.Deadline.Add(grace)
		probe := 0
		poll.Wait(t, 10*time.Second, "the member to resume by itself", func() bool {
			probe++
			return Code(s.resume(a, fmt.Sprintf("probe-%d", probe))) == ""
		})
		if now := time.Now(); now.Before(lease) {
			t.Fatalf("resumed by itself %s before the lease ran out", lease.Sub(now))
		}
		s.expect(s.prepare(a, "c1", 10*time.Second), events.CodeStaleCheckpoint, events.StateIdle)
	})

	t.Run("§5 Lease: renew extends the lease, never backwards", func(t *testing.T) {
		s := newWorld(t, h)
		a := s.name("c0")
		grace := 20 * time.Second
		hd := s.start(a, Options{Grace: grace})
		hd.Subject.AddWork(t, 1)
		s.expect(s.prepare(a, "c1", 5*time.Second), "", events.StatePrepared)
		long := s.bridge.Header("c1", time.Minute, a)
		r := s.phase(a, events.Renew{PhaseHeader: long}).(events.RenewAck)
		s.expect(r, "", events.StatePrepared)
		if !r.Lease.Equal(long.Deadline.Add(grace)) {
			t.Fatalf("lease %s, want %s", r.Lease, long.Deadline.Add(grace))
		}
		r = s.phase(a, events.Renew{PhaseHeader: s.bridge.Header("c1", time.Second, a)}).(events.RenewAck)
		if !r.Lease.Equal(long.Deadline.Add(grace)) {
			t.Fatalf("lease moved back to %s, want %s", r.Lease, long.Deadline.Add(grace))
		}
		s.expect(s.phase(a, events.Renew{PhaseHeader: s.bridge.Header("c2", time.Second, a)}), events.CodeCheckpointConflict, events.StatePrepared)
	})
}
