package membertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
)

// Subject is a participant under test, as the suite drives it. The test
// Participant implements it; a participant package implements it for its
// own participant (test-only methods may live in its _test.go files).
type Subject interface {
	member.Participant
	// Bind hands the participant the Member built for it, before Run: it
	// calls Notify and Admit on it.
	Bind(m *member.Member)
	// AddWork puts the participant into a state with work to checkpoint:
	// n new episodes, admitted through Member.Admit, live and at a boundary
	// as soon as a prepare asks. It returns them.
	AddWork(t testing.TB, n int) []events.Episode
	// Hold keeps ep from being at a boundary until release is called.
	Hold(ep events.Episode) (release func())
	// Live returns the capture keys of the work the participant holds,
	// sorted.
	Live() []string
	// PaceWrites makes every export call before(ctx, index) before it
	// yields record index (nil: no pacing), so that the suite can resume in
	// the middle of a commit's write; Pacer does it for an Exporter.
	// before may block until ctx is done. A Harness with NoRecords never
	// calls it.
	PaceWrites(before func(ctx context.Context, index int))
}

// Runner is implemented by a Subject that runs its Member itself, beside
// what else it runs (a sandbox daemon: its supervisor and its service).
// The suite still builds the Member and hands it over with Bind; then it
// calls Run instead of Member.Run. Run must run that Member until ctx
// ends, and return what its Run returned.
type Runner interface {
	Run(ctx context.Context) error
}

// Harness is what a participant package supplies to run the suite.
type Harness struct {
	// Kind is the member kind of the suite's members (default agent).
	Kind events.MemberKind
	// New returns a fresh participant for member name on env, holding no
	// work. The suite builds, runs and stops its Member.
	New func(t *testing.T, env *jstest.Env, name events.Member) Subject
	// Shared runs every member of the suite behind a member.Host, the one
	// consumer of a process that hosts many members.
	Shared bool
	// Ordered runs every member on an ordered consumer with a state file
	// (Config.StateFile), as sandbox daemons do; a restarted member of the
	// same name keeps its file.
	Ordered bool
	// NoRecords says the participant neither exports nor installs: its
	// state is somebody else's to checkpoint (a sandbox daemon: the
	// owner's snapshot and the agent's bookmark). The suite then checks
	// that its commits create a manifest of no records, that a restore
	// installs nothing, and, with no record to pace, that a resume racing
	// a commit never leaves a manifest behind the resume.
	NoRecords bool
	// Serial runs the subtests one after another instead of in parallel:
	// for a participant of which one process holds only one (a sandbox
	// daemon's supervisor treats every child of the process as its own).
	Serial bool
}

// suite is one subtest's world: a bus, a run, a bridge.
type suite struct {
	t      *testing.T
	h      Harness
	env    *jstest.Env
	run    string
	bridge *Bridge
	hosts  int
	dir    string
}

func newSuite(t *testing.T, h Harness) *suite {
	if !h.Serial {
		t.Parallel()
	}
	env := jstest.Start(t)
	return &suite{t: t, h: h, env: env, run: "run1", bridge: NewBridge(t, env, "run1")}
}

func (s *suite) name(n string) events.Member {
	kind := s.h.Kind
	if kind == "" {
		kind = events.KindAgent
	}
	m, err := events.NewMember(kind, n)
	if err != nil {
		s.t.Fatalf("membertest: %v", err)
	}
	return m
}

func (s *suite) start(name events.Member, opts Options) *Handle {
	s.t.Helper()
	if s.h.Ordered && opts.StateFile == "" {
		if s.dir == "" {
			s.dir = s.t.TempDir()
		}
		opts.StateFile = filepath.Join(s.dir, name.Name()+".position.json")
	}
	if s.h.Shared && opts.Host == nil {
		// Every start is a new process: a host of its own, since a host
		// lives as long as its process.
		s.hosts++
		opts.Host = StartHost(s.t, s.env, s.run, fmt.Sprintf("suite-%s-%d", name.Name(), s.hosts))
	}
	return StartMember(s.t, s.env, s.run, name, s.h.New(s.t, s.env, name), opts)
}

// phase publishes d and waits for m's ack.
func (s *suite) phase(m events.Member, d events.PhaseEvent) events.Ack {
	s.t.Helper()
	return s.bridge.Ack(s.bridge.Publish(d), d.Phase(), m)
}

func (s *suite) prepare(m events.Member, id string, in time.Duration) events.PrepareAck {
	s.t.Helper()
	return s.phase(m, events.Prepare{PhaseHeader: s.bridge.Header(id, in, m)}).(events.PrepareAck)
}

func (s *suite) commit(m events.Member, id string, scope []events.Episode, stop bool) events.CommitAck {
	s.t.Helper()
	return s.phase(m, events.Commit{PhaseHeader: s.bridge.Header(id, 10*time.Second, m), Scope: scope, Stop: stop}).(events.CommitAck)
}

func (s *suite) resume(m events.Member, id string) events.ResumeAck {
	s.t.Helper()
	return s.phase(m, events.Resume{PhaseHeader: s.bridge.Header(id, 10*time.Second, m)}).(events.ResumeAck)
}

// expect fails unless ack a has error code (""=ok) and state.
func (s *suite) expect(a events.Ack, code string, state events.State) {
	s.t.Helper()
	h := a.Header()
	if got := Code(a); got != code || h.State != state {
		detail := ""
		if h.Error != nil {
			detail = h.Error.Detail
		}
		s.t.Fatalf("%T seq %d: code %q (%s), state %s; want code %q, state %s", a, h.Seq, got, detail, h.State, code, state)
	}
}

// checkpoint prepares, commits (scope) and resumes id on m, and returns the
// commit's manifest.
func (s *suite) checkpoint(m events.Member, id string, scope []events.Episode) events.MemberManifest {
	s.t.Helper()
	s.expect(s.prepare(m, id, 10*time.Second), "", events.StatePrepared)
	c := s.commit(m, id, scope, false)
	s.expect(c, "", events.StateCommitted)
	s.expect(s.resume(m, id), "", events.StateIdle)
	return *c.Manifest
}

func keys(eps []events.Episode) []string {
	out := make([]string, 0, len(eps))
	for _, ep := range eps {
		out = append(out, ep.String())
	}
	slices.Sort(out)
	return out
}

func nextKeys(eps []events.Episode) []string {
	out := make([]string, 0, len(eps))
	for _, ep := range eps {
		out = append(out, ep.Next().String())
	}
	slices.Sort(out)
	return out
}

func (s *suite) info(m events.Member) (events.MemberInfo, bool) {
	s.t.Helper()
	e, err := s.env.Bus.Members.Get(s.t.Context(), events.MemberKey(s.run, m))
	if errors.Is(err, natsjs.ErrKeyNotFound) {
		return events.MemberInfo{}, false
	}
	if err != nil {
		s.t.Fatal(err)
	}
	var info events.MemberInfo
	if err := json.Unmarshal(e.Value(), &info); err != nil {
		s.t.Fatal(err)
	}
	return info, true
}

func (s *suite) lastMembership(m events.Member) events.Data {
	s.t.Helper()
	raw, err := s.env.Bus.Stream.GetLastMsgForSubject(s.t.Context(), events.MemberSubject(s.run, m))
	if err != nil {
		s.t.Fatalf("membership events of %s: %v", m, err)
	}
	_, d, err := events.Unmarshal(rawMsg(raw))
	if err != nil {
		s.t.Fatal(err)
	}
	return d
}

// Run runs the conformance suite against the participant h builds. Every
// subtest runs against a real embedded NATS server of its own; the suite
// plays the bridge. Subtest names cite the PROTOCOL section they check.
func Run(t *testing.T, h Harness) {
	if h.New == nil {
		t.Fatal("membertest: Harness.New is required")
	}
	t.Run("§3 registration: heartbeat, served flag, joined and left", func(t *testing.T) {
		s := newSuite(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{})
		info, ok := s.info(a)
		if !ok || info.Served || info.Run != s.run || info.Member != a {
			t.Fatalf("heartbeat %+v (present %v); want an unserved member", info, ok)
		}
		if j, ok := s.lastMembership(a).(events.MemberJoined); !ok || j.Member != a {
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
		if l, ok := s.lastMembership(a).(events.MemberLeft); !ok || l.Reason != "shutdown" {
			t.Fatalf("last membership event %#v, want MemberLeft{shutdown}", l)
		}
	})

	t.Run("§5 prepare, commit, resume: the manifest verifies", func(t *testing.T) {
		s := newSuite(t, h)
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
		man := *c.Manifest
		got, recs, err := member.ReadRecords(t.Context(), s.env.Bus.Manifests, s.env.Bus.Records, s.run, "c1", a, nil)
		if err != nil {
			t.Fatalf("ReadRecords: %v", err)
		}
		if !slices.Equal(got.Episodes, man.Episodes) || got.SHA256 != man.SHA256 || got.Count != len(recs) {
			t.Fatalf("stored manifest %+v, ack's %+v, %d records", got, man, len(recs))
		}
		if h.NoRecords {
			if man.Count != 0 || len(man.Episodes) != 0 {
				t.Fatalf("manifest %+v of a participant without records", man)
			}
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
		s := newSuite(t, h)
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
		if again := s.bridge.Ack(cd.Seq, events.PhaseCommit, a).(events.CommitAck); again.Manifest.SHA256 != c.Manifest.SHA256 {
			t.Fatalf("commit ack changed: %+v, was %+v", again.Manifest, c.Manifest)
		}
	})

	t.Run("§5 Idempotence: duplicate phases get the same reply, export once", func(t *testing.T) {
		s := newSuite(t, h)
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
		if c1.Manifest.SHA256 != c2.Manifest.SHA256 || c1.Manifest.Count != c2.Manifest.Count {
			t.Fatalf("second commit manifest %+v, first %+v: exported twice?", c2.Manifest, c1.Manifest)
		}
		if _, _, err := member.ReadRecords(t.Context(), s.env.Bus.Manifests, s.env.Bus.Records, s.run, "c1", a, nil); err != nil {
			t.Fatalf("ReadRecords after a duplicate commit: %v", err)
		}
		// A commit of another scope while this one is recorded is still the
		// recorded reply: the checkpoint was written once.
		s.expect(s.resume(a, "c1"), "", events.StateIdle)
		s.expect(s.resume(a, "c1"), "", events.StateIdle)
	})

	t.Run("§5 Fencing: stale_checkpoint after resume", func(t *testing.T) {
		s := newSuite(t, h)
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
		s := newSuite(t, h)
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
		s := newSuite(t, h)
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
		s := newSuite(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{})
		eps := hd.Subject.AddWork(t, 2)
		release := hd.Subject.Hold(eps[0])
		hdr := s.bridge.Header("c1", 800*time.Millisecond, a)
		seq := s.bridge.Publish(events.Prepare{PhaseHeader: hdr})
		p := s.bridge.Ack(seq, events.PhasePrepare, a).(events.PrepareAck)
		answered := time.Now()
		s.expect(p, "", events.StatePreparing)
		if p.Ready || p.BlockerCount != 1 || !slices.Equal(p.Blockers, []string{eps[0].String()}) {
			t.Fatalf("prepare ack %+v, want not ready with blocker %s", p, eps[0])
		}
		// The reply time is deadline − min(1 s, a tenth of the time left):
		// 80 ms before this deadline. Not at once, and not much later.
		if answered.Before(hdr.Deadline.Add(-300 * time.Millisecond)) {
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
		s := newSuite(t, h)
		a := s.name("c0")
		hd := s.start(a, Options{PollEvery: time.Hour})
		eps := hd.Subject.AddWork(t, 1)
		release := hd.Subject.Hold(eps[0])
		seq := s.bridge.Publish(events.Prepare{PhaseHeader: s.bridge.Header("c1", 30*time.Second, a)})
		// The first readiness check has happened once the member is
		// preparing (a conflicting prepare says so).
		poll(t, 10*time.Second, nil, func() bool {
			return s.prepare(a, "other", 10*time.Second).State == events.StatePreparing
		}, "the member to be preparing")
		start := time.Now()
		release()
		s.expect(s.bridge.Ack(seq, events.PhasePrepare, a), "", events.StatePrepared)
		if took := time.Since(start); took > 5*time.Second {
			t.Errorf("ready %s after Notify", took)
		}
	})

	t.Run("§5 resume while a prepare waits", func(t *testing.T) {
		s := newSuite(t, h)
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
		s := newSuite(t, h)
		a := s.name("c0")
		grace := 300 * time.Millisecond
		hd := s.start(a, Options{Grace: grace})
		hd.Subject.AddWork(t, 1)
		hdr := s.bridge.Header("c1", 400*time.Millisecond, a)
		s.expect(s.bridge.Ack(s.bridge.Publish(events.Prepare{PhaseHeader: hdr}), events.PhasePrepare, a), "", events.StatePrepared)
		lease := hdr.Deadline.Add(grace)
		probe := 0
		poll(t, 10*time.Second, nil, func() bool {
			probe++
			return Code(s.resume(a, fmt.Sprintf("probe-%d", probe))) == ""
		}, "the member to resume by itself")
		if now := time.Now(); now.Before(lease) {
			t.Fatalf("resumed by itself %s before the lease ran out", lease.Sub(now))
		}
		s.expect(s.prepare(a, "c1", 10*time.Second), events.CodeStaleCheckpoint, events.StateIdle)
	})

	t.Run("§5 Lease: renew extends the lease, never backwards", func(t *testing.T) {
		s := newSuite(t, h)
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

	t.Run("§5 a resume during a commit write: no manifest, ever", func(t *testing.T) {
		if h.NoRecords {
			resumeRacingCommit(t, h)
			return
		}
		s := newSuite(t, h)
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
		s.expect(s.bridge.Ack(cseq, events.PhaseCommit, a), events.CodeStaleCheckpoint, events.StateIdle)
		key := events.MemberManifestKey(s.run, "c1", a)
		if _, err := s.env.Bus.Manifests.Get(t.Context(), key); !errors.Is(err, natsjs.ErrKeyNotFound) {
			t.Fatalf("manifest %s after a resume during the write: %v, want none", key, err)
		}
		if has, err := member.HasObjects(t.Context(), s.env.Bus.Records, s.run, "c1", a); has || err != nil {
			t.Fatalf("records object after a stopped write: %v %v, want none", has, err)
		}
		hd.Subject.PaceWrites(nil)
		s.expect(s.commit(a, "c1", eps, false), events.CodeStaleCheckpoint, events.StateIdle)
		s.bridge.Barrier(a)
		if _, err := s.env.Bus.Manifests.Get(t.Context(), key); !errors.Is(err, natsjs.ErrKeyNotFound) {
			t.Fatalf("manifest %s appeared later: %v", key, err)
		}
	})

	t.Run("§5 restore: all or none, next attempts, only into a fresh member", func(t *testing.T) {
		s := newSuite(t, h)
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
		s.expect(r, member.CodeCorruptRecords, events.StateIdle)
		if live := fresh.Subject.Live(); len(live) != 0 {
			t.Fatalf("live %v after a failed restore, want nothing installed", live)
		}
		s.expect(s.resume(a, "r1"), "", events.StateIdle)

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
		s := newSuite(t, h)
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
		s := newSuite(t, h)
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
		if l, ok := s.lastMembership(a).(events.MemberLeft); !ok || l.Reason != "superseded" || l.Epoch != 0 {
			t.Fatalf("last membership event %#v, want MemberLeft{superseded, epoch 0}", l)
		}
	})

	t.Run("§5 Epochs: older epochs and phases for others are ignored", func(t *testing.T) {
		s := newSuite(t, h)
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

	t.Run("§4 a malformed event is refused and changes nothing", func(t *testing.T) {
		s := newSuite(t, h)
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
func resumeRacingCommit(t *testing.T, h Harness) {
	s := newSuite(t, h)
	a := s.name("c0")
	hd := s.start(a, Options{})
	eps := hd.Subject.AddWork(t, 2)
	s.expect(s.prepare(a, "c1", 10*time.Second), "", events.StatePrepared)
	cseq := s.bridge.Publish(events.Commit{PhaseHeader: s.bridge.Header("c1", 10*time.Second, a), Scope: eps})
	s.expect(s.resume(a, "c1"), "", events.StateIdle)
	c := s.bridge.Ack(cseq, events.PhaseCommit, a)
	key := events.MemberManifestKey(s.run, "c1", a)
	_, err := s.env.Bus.Manifests.Get(t.Context(), key)
	switch Code(c) {
	case "":
		t.Log("the commit was handled before the resume")
		s.expect(c, "", events.StateCommitted)
		if err != nil {
			t.Fatalf("manifest %s of an answered commit: %v", key, err)
		}
		return
	case events.CodeStaleCheckpoint:
		t.Log("the resume cut the commit short")
	default:
		s.expect(c, events.CodeStaleCheckpoint, events.StateIdle)
	}
	if !errors.Is(err, natsjs.ErrKeyNotFound) {
		t.Fatalf("manifest %s after a resume cut its commit short: %v, want none", key, err)
	}
	s.expect(s.commit(a, "c1", eps, false), events.CodeStaleCheckpoint, events.StateIdle)
	s.bridge.Barrier(a)
	if _, err := s.env.Bus.Manifests.Get(t.Context(), key); !errors.Is(err, natsjs.ErrKeyNotFound) {
		t.Fatalf("manifest %s appeared later: %v", key, err)
	}
}

func isSubset(sub, of []string) bool {
	for _, k := range sub {
		if !slices.Contains(of, k) {
			return false
		}
	}
	return true
}

func waitClosed(t testing.TB, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("membertest: timed out waiting for %s", what)
	}
}

// Pacer implements Subject.PaceWrites for a participant package's
// subject to embed: the subject's Export wraps its participant's records
// in Pace.
type Pacer struct {
	mu   sync.Mutex
	pace func(ctx context.Context, index int)
}

// PaceWrites implements Subject.
func (p *Pacer) PaceWrites(before func(ctx context.Context, index int)) {
	p.mu.Lock()
	p.pace = before
	p.mu.Unlock()
}

// Pace yields records, calling the pacing function (if any) before each
// and stopping with ctx's error once ctx is done.
func (p *Pacer) Pace(ctx context.Context, records iter.Seq2[events.Record, error]) iter.Seq2[events.Record, error] {
	p.mu.Lock()
	pace := p.pace
	p.mu.Unlock()
	return func(yield func(events.Record, error) bool) {
		i := 0
		for r, err := range records {
			if err == nil && pace != nil {
				pace(ctx, i)
			}
			if err == nil && ctx.Err() != nil {
				err = ctx.Err()
			}
			if !yield(r, err) || err != nil {
				return
			}
			i++
		}
	}
}
