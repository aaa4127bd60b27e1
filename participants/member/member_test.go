package member_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

func TestMain(m *testing.M) {
	leak.VerifyTestMain(m, jstest.LeakOptions()...)
}

// TestConformance runs the conformance suite against the test participant.
func TestConformance(t *testing.T) {
	membertest.Run(t, membertest.Suite{
		New: func(t *testing.T, _ *jstest.Env, name events.Member) membertest.Subject {
			return membertest.NewParticipant(name.Name())
		},
	})
}

// TestConformanceCoreScoped runs the suite on the core feed of a sandbox
// daemon with a user of its own, whose catch-up reads the newest phase of
// each kind (PROTOCOL §3, Consumers).
func TestConformanceCoreScoped(t *testing.T) {
	membertest.Run(t, membertest.Suite{
		CoreFeed: true,
		NoPull:   true,
		New: func(t *testing.T, _ *jstest.Env, name events.Member) membertest.Subject {
			return membertest.NewParticipant(name.Name())
		},
	})
}

// TestConformanceCore runs the suite on the core feed, a sandbox daemon's
// default: a subscription of the run's phases with catch-up by direct get.
func TestConformanceCore(t *testing.T) {
	membertest.Run(t, membertest.Suite{
		CoreFeed: true,
		New: func(t *testing.T, _ *jstest.Env, name events.Member) membertest.Subject {
			return membertest.NewParticipant(name.Name())
		},
	})
}

// TestConformanceShared runs the suite with every member fed by a Host:
// one consumer per process, one decode per event.
func TestConformanceShared(t *testing.T) {
	membertest.Run(t, membertest.Suite{
		Shared: true,
		New: func(t *testing.T, _ *jstest.Env, name events.Member) membertest.Subject {
			return membertest.NewParticipant(name.Name())
		},
	})
}

// world is one test's bus, bridge and member with the test participant.
type world struct {
	env    *jstest.Env
	bridge *membertest.Bridge
	h      *membertest.Handle
	p      *membertest.Participant
	name   events.Member
}

func start(t *testing.T, opts membertest.Options) *world {
	t.Helper()
	env := jstest.Start(t)
	hs := membertest.StartMembers(t, env, "run1", 1, opts)
	return &world{env: env, bridge: membertest.NewBridge(t, env, "run1"), h: hs[0], p: hs[0].Participant, name: hs[0].Name}
}

func (w *world) phase(t *testing.T, d events.PhaseEvent) events.Ack {
	t.Helper()
	return w.bridge.Ack(w.bridge.Publish(d), d.Phase(), w.name)
}

func (w *world) prepare(t *testing.T, id string) events.Ack {
	t.Helper()
	return w.phase(t, events.Prepare{PhaseHeader: w.bridge.Header(id, 10*time.Second, w.name)})
}

func (w *world) commit(t *testing.T, id string, scope []events.Episode, stop bool) events.Ack {
	t.Helper()
	return w.phase(t, events.Commit{PhaseHeader: w.bridge.Header(id, 10*time.Second, w.name), Scope: scope, Stop: stop})
}

func (w *world) resume(t *testing.T, id string) events.Ack {
	t.Helper()
	return w.phase(t, events.Resume{PhaseHeader: w.bridge.Header(id, 10*time.Second, w.name)})
}

func want(t *testing.T, d events.Ack, code string, state events.State) {
	t.Helper()
	h := d.Header()
	if got := membertest.Code(d); got != code || h.State != state {
		t.Fatalf("%T: code %q (%+v), state %s; want %q, %s", d, got, h.Error, h.State, code, state)
	}
}

// §5 commit: a duplicate commit reuses the one export; Export runs once.
func TestCommitExportsOnce(t *testing.T) {
	w := start(t, membertest.Options{Episodes: 3})
	eps := []events.Episode{{Rollout: "t0-r0"}, {Rollout: "t0-r1"}, {Rollout: "t0-r2"}}
	want(t, w.prepare(t, "c1"), "", events.StatePrepared)
	c1 := w.commit(t, "c1", eps, false).(events.CommitAck)
	c2 := w.commit(t, "c1", eps, false).(events.CommitAck)
	if n := w.p.Count("export"); n != 1 {
		t.Fatalf("Export called %d times, want 1", n)
	}
	if c1.Manifest.Count != 3 || c1.Manifest.SHA256 != c2.Manifest.SHA256 {
		t.Fatalf("manifests %+v and %+v differ", c1.Manifest, c2.Manifest)
	}
}

// §5 commit: a failed export leaves the member prepared; the next commit
// exports again and succeeds.
func TestCommitExportFailureRetries(t *testing.T) {
	w := start(t, membertest.Options{Episodes: 1})
	want(t, w.prepare(t, "c1"), "", events.StatePrepared)
	w.p.FailExport(membertest.ErrInjected)
	want(t, w.commit(t, "c1", nil, false), events.CodeExportFailed, events.StatePrepared)
	w.p.FailExport(nil)
	want(t, w.commit(t, "c1", nil, false), "", events.StateCommitted)
	if n := w.p.Count("export"); n != 2 {
		t.Fatalf("Export called %d times, want 2 (one failed)", n)
	}
}

// §5 commit: a scope that names a restart of this member fails closed, and
// readiness that regressed since prepare refuses the commit.
func TestCommitRefusesRestartsAndRegressions(t *testing.T) {
	w := start(t, membertest.Options{Episodes: 2})
	eps := []events.Episode{{Rollout: "t0-r0"}, {Rollout: "t0-r1"}}
	w.p.SetRestarts("t0-r1")
	p := w.prepare(t, "c1").(events.PrepareAck)
	if !slices.Equal(p.Restarts, []string{"t0-r1"}) {
		t.Fatalf("prepare ack restarts %v", p.Restarts)
	}
	want(t, w.commit(t, "c1", eps, false), events.CodeRestartInScope, events.StatePrepared)
	w.p.Block(eps[0])
	want(t, w.commit(t, "c1", eps[:1], false), events.CodeInvalidPhase, events.StatePrepared)
	w.p.Unblock(eps[0])
	want(t, w.commit(t, "c1", eps[:1], false), "", events.StateCommitted)
	if n := w.p.Count("export"); n != 1 {
		t.Fatalf("Export called %d times, want 1", n)
	}
}

// §5 prepare: a Prepare that fails reopens admission; the id is not fenced.
func TestPrepareFailureReopens(t *testing.T) {
	w := start(t, membertest.Options{Episodes: 1})
	w.p.FailPrepare(membertest.ErrInjected)
	want(t, w.prepare(t, "c1"), events.CodeInternal, events.StateIdle)
	if n := w.p.Count("resume"); n != 1 {
		t.Fatalf("Resume called %d times, want 1", n)
	}
	w.p.FailPrepare(nil)
	want(t, w.prepare(t, "c1"), "", events.StatePrepared)
	if w.p.AdmissionOpen() {
		t.Fatal("admission open while prepared")
	}
}

// §5 commit with stop: the participant parks the exported records once
// the outcome names this member; a park failure is only logged.
func TestStopCommitParks(t *testing.T) {
	w := start(t, membertest.Options{Episodes: 2})
	want(t, w.prepare(t, "c1"), "", events.StatePrepared)
	want(t, w.commit(t, "c1", nil, true), "", events.StateCommitted)
	if n := w.p.Count("park"); n != 0 {
		t.Fatalf("parked before the outcome")
	}
	outcome := events.CheckpointCommitted{OutcomeHeader: events.OutcomeHeader{Run: "run1", CheckpointID: "c1"},
		Continued: []string{"t0-r0", "t0-r1"}, Members: []events.Member{"agent.other"}, Stop: true}
	w.bridge.PublishOutcome(outcome)
	w.bridge.Barrier(w.name)
	if n := w.p.Count("park"); n != 0 {
		t.Fatalf("parked on an outcome that does not name the member")
	}
	w.p.FailPark(membertest.ErrInjected)
	outcome.Members = []events.Member{w.name}
	w.bridge.PublishOutcome(outcome)
	w.bridge.PublishOutcome(outcome)
	poll.Wait(t, 10*time.Second, "Park", func() bool { return w.p.Count("park") > 0 })
	w.bridge.Barrier(w.name)
	if n := w.p.Count("park"); n != 1 {
		t.Fatalf("Park called %d times, want 1", n)
	}
	calls := w.p.Calls()
	var park membertest.Call
	for _, c := range calls {
		if c.Method == "park" {
			park = c
		}
	}
	if !slices.Equal(park.Keys, []string{"t0-r0", "t0-r1"}) {
		t.Fatalf("parked %v", park.Keys)
	}
}

// §3, Consumers, with an agent's own user: its durable consumer reads the
// run's phases alone, its one filter, which its create subject names (an
// earlier build's, with the committed outcomes as a second filter, takes
// that filter when the member starts, and carries on from where it was);
// the outcome a stop commit parks on comes on a core subscription, and one
// published while its connection was cut is read, once it is back, by a
// direct get whose subject names it (§5, commit). No permissions violation.
func TestDurableOfOneFilterAsItsOwnUser(t *testing.T) {
	env := jstest.Start(t, jstest.WithAuthority("run1"))
	bridge := membertest.NewBridge(t, env, "run1")
	name := events.Member("agent.a1")
	cname := member.ConsumerName("run1", name)
	old := member.DurableConfig("run1", cname, "an earlier build's")
	old.FilterSubject, old.FilterSubjects = "", []string{events.PhaseFilter("run1"), events.OutcomeSubject("run1", events.TypeCheckpointCommitted)}
	if _, err := env.Bus.Stream.CreateConsumer(t.Context(), old); err != nil {
		t.Fatal(err)
	}
	px := startProxy(t, env.URL)
	through := *env.WithCreds(env.MemberCreds(t, "run1", name))
	through.URL = px.url
	p := membertest.NewParticipant("a1", events.Episode{Rollout: "a1-r0"})
	membertest.StartMember(t, &through, "run1", name, p, membertest.Options{})
	ci, err := env.Bus.Stream.Consumer(t.Context(), cname)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := ci.CachedInfo().Config; cfg.FilterSubject != events.PhaseFilter("run1") || len(cfg.FilterSubjects) != 0 || cfg.Description != old.Description {
		t.Fatalf("the durable consumer: filter %q %q, description %q; want the earlier one with the run's phases alone",
			cfg.FilterSubject, cfg.FilterSubjects, cfg.Description)
	}
	header := func(id string) events.PhaseHeader { return bridge.Header(id, 10*time.Second, name) }
	want(t, bridge.Ack(bridge.Publish(events.Prepare{PhaseHeader: header("c1")}), events.PhasePrepare, name), "", events.StatePrepared)
	want(t, bridge.Ack(bridge.Publish(events.Commit{PhaseHeader: header("c1"), Scope: []events.Episode{{Rollout: "a1-r0"}}, Stop: true}),
		events.PhaseCommit, name), "", events.StateCommitted)

	px.cut(t)
	bridge.PublishOutcome(events.CheckpointCommitted{OutcomeHeader: events.OutcomeHeader{Run: "run1", CheckpointID: "c1"},
		Continued: []string{"a1-r0"}, Members: []events.Member{name}, Stop: true})
	if n := p.Count("park"); n != 0 {
		t.Fatalf("parked through a cut connection")
	}
	px.restore(t)
	poll.Wait(t, 10*time.Second, "Park after the reconnect", func() bool { return p.Count("park") == 1 })
}

// §5 restore: an install that fails installs nothing and reopens admission.
func TestRestoreInstallFailure(t *testing.T) {
	env, b, a := committedK1(t, 2)
	p := membertest.NewParticipant("t0")
	p.FailInstall(membertest.ErrInjected)
	membertest.StartMember(t, env, "run1", a, p, membertest.Options{})
	b.Epoch = 1
	scope := []events.Episode{{Rollout: "t0-r0"}, {Rollout: "t0-r1"}}
	r := b.Ack(b.Publish(events.Restore{PhaseHeader: b.Header("r1", 10*time.Second, a), Source: "k1", Scope: scope}), events.PhaseRestore, a)
	want(t, r, events.CodeInstallFailed, events.StateIdle)
	if live := p.Live(); len(live) != 0 {
		t.Fatalf("live %v after a failed install", live)
	}
	if !p.AdmissionOpen() || p.Count("resume") != 1 {
		t.Fatalf("admission open %v, resumes %d; want reopened once", p.AdmissionOpen(), p.Count("resume"))
	}
	p.FailInstall(nil)
	r = b.Ack(b.Publish(events.Restore{PhaseHeader: b.Header("r2", 10*time.Second, a), Source: "k1", Scope: scope[:1]}), events.PhaseRestore, a)
	want(t, r, "", events.StateRestored)
	if got := r.(events.RestoreAck).Restored; !slices.Equal(got, []string{"t0-r0-a1"}) {
		t.Fatalf("restored %v", got)
	}
	var installed []string
	for _, c := range p.Calls() {
		if c.Method == "install" && c.Err == nil {
			installed = c.Keys
		}
	}
	if !slices.Equal(installed, []string{"t0-r0"}) {
		t.Fatalf("install got records %v, want only the scope's t0-r0", installed)
	}
}

// §5 restore: a member that exported nothing to the source (its member
// manifest is in neither the source nor a carried source) installs
// nothing; it does not call Install, so a participant that cannot fork
// does not fail the restore of the rest.
func TestRestoreOfAMemberWithNothingInstallsNothing(t *testing.T) {
	env, b, a := committedK1(t, 0)
	p := membertest.NewParticipant("t0")
	p.FailInstall(membertest.ErrInjected)
	membertest.StartMember(t, env, "run1", a, p, membertest.Options{})
	b.Epoch = 1
	r := b.Ack(b.Publish(events.Restore{PhaseHeader: b.Header("r1", 10*time.Second, a), Source: "k1"}), events.PhaseRestore, a)
	want(t, r, "", events.StateRestored)
	if n := p.Count("install"); n != 0 {
		t.Fatalf("%d installs of a member with nothing in the source, want 0", n)
	}
}

// committedK1 starts a member with episodes rollouts, has it prepare,
// commit and resume checkpoint k1, and stops it: what is left is k1, to
// restore into a new process of its name, a.
func committedK1(t *testing.T, episodes int) (*jstest.Env, *membertest.Bridge, events.Member) {
	t.Helper()
	env := jstest.Start(t)
	b := membertest.NewBridge(t, env, "run1")
	hs := membertest.StartMembers(t, env, "run1", 1, membertest.Options{Episodes: episodes})
	a := hs[0].Name
	for _, d := range []events.PhaseEvent{
		events.Prepare{PhaseHeader: b.Header("k1", 10*time.Second, a)},
		events.Commit{PhaseHeader: b.Header("k1", 10*time.Second, a)},
		events.Resume{PhaseHeader: b.Header("k1", 10*time.Second, a)},
	} {
		if c := membertest.Code(b.Ack(b.Publish(d), d.Phase(), a)); c != "" {
			t.Fatalf("%s: %s", d.Phase(), c)
		}
	}
	if err := hs[0].Stop(); err != nil {
		t.Fatal(err)
	}
	return env, b, a
}

// §5 Lease: expiry calls Resumer and fences the id, with no ack.
func TestLeaseExpiryResumes(t *testing.T) {
	w := start(t, membertest.Options{Episodes: 1, Grace: 200 * time.Millisecond})
	hdr := w.bridge.Header("c1", 300*time.Millisecond, w.name)
	want(t, w.bridge.Ack(w.bridge.Publish(events.Prepare{PhaseHeader: hdr}), events.PhasePrepare, w.name), "", events.StatePrepared)
	poll.Wait(t, 10*time.Second, "the lease to expire", func() bool { return w.p.Count("resume") == 1 })
	if now := time.Now(); now.Before(hdr.Deadline.Add(200 * time.Millisecond)) {
		t.Fatalf("resumed %s early", hdr.Deadline.Add(200*time.Millisecond).Sub(now))
	}
	if !w.p.AdmissionOpen() {
		t.Fatal("admission still closed")
	}
	want(t, w.prepare(t, "c1"), events.CodeStaleCheckpoint, events.StateIdle)
}

// §5 Lease: a lease that runs out after a commit with stop whose outcome
// never came (the bridge died in between) parks the export and does not
// resume it: the checkpoint may be committed, and a restore would run that
// work again.
func TestLeaseExpiryAfterAStopCommitParks(t *testing.T) {
	w := start(t, membertest.Options{Episodes: 1, Grace: 200 * time.Millisecond})
	eps := []events.Episode{{Rollout: "t0-r0"}}
	want(t, w.phase(t, events.Prepare{PhaseHeader: w.bridge.Header("c1", 300*time.Millisecond, w.name)}), "", events.StatePrepared)
	want(t, w.phase(t, events.Commit{PhaseHeader: w.bridge.Header("c1", 300*time.Millisecond, w.name), Scope: eps, Stop: true}),
		"", events.StateCommitted)
	poll.Wait(t, 10*time.Second, "the export to be parked", func() bool { return w.p.Count("park") == 1 })
	poll.Holds(t, 500*time.Millisecond, func() error {
		if n := w.p.Count("resume"); n != 0 {
			return fmt.Errorf("the export was resumed %d times after the lease ran out", n)
		}
		if w.p.AdmissionOpen() {
			return errors.New("admission reopened")
		}
		return nil
	})
}

// §3, Consumers: a restarted process of the same member resumes its consumer; events
// older than the process that were already answered are not handled again.
func TestOldEventsAlreadyAnswered(t *testing.T) {
	env := jstest.Start(t)
	b := membertest.NewBridge(t, env, "run1")
	hs := membertest.StartMembers(t, env, "run1", 1, membertest.Options{Episodes: 1})
	a := hs[0].Name
	seq := b.Publish(events.Prepare{PhaseHeader: b.Header("c1", 10*time.Second, a)})
	b.Ack(seq, events.PhasePrepare, a)
	if err := hs[0].Stop(); err != nil {
		t.Fatal(err)
	}
	// Rewind the member's consumer to the start of the stream, as a server
	// that lost the consumer's memory state would.
	name := member.ConsumerName("run1", a)
	if err := env.Bus.Stream.DeleteConsumer(t.Context(), name); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Bus.Stream.CreateConsumer(t.Context(), natsjs.ConsumerConfig{
		Durable: name, FilterSubjects: []string{events.PhaseFilter("run1")}, AckPolicy: natsjs.AckExplicitPolicy, MemoryStorage: true,
	}); err != nil {
		t.Fatal(err)
	}
	p := membertest.NewParticipant("t0")
	membertest.StartMember(t, env, "run1", a, p, membertest.Options{})
	b.Barrier(a)
	if n := p.Count("prepare"); n != 0 {
		t.Fatalf("the new process handled the old prepare (%d prepares)", n)
	}
	if n := b.AckCount(seq, events.PhasePrepare, a); n != 1 {
		t.Fatalf("%d acks of the old prepare", n)
	}
}

// §5 Restarted members: a prepare published while the member's process was
// down addressed the process before; the new one refuses it (restarted),
// its participant never asked, and its heartbeat says it has served
// nothing, so that a restore can still go into it. A prepare published
// after it started, it prepares.
func TestRestartedMemberRefusesThePrepareOfTheProcessBefore(t *testing.T) {
	env := jstest.Start(t)
	b := membertest.NewBridge(t, env, "run1")
	a := events.Member("agent.a")
	old := membertest.StartMember(t, env, "run1", a, membertest.NewParticipant("a"), membertest.Options{})
	membertest.WaitRegistered(t, env, "run1", a, nil)
	if err := old.Stop(); err != nil {
		t.Fatal(err)
	}
	seq := b.Publish(events.Prepare{PhaseHeader: b.Header("c1", 10*time.Second, a)})
	p := membertest.NewParticipant("a")
	membertest.StartMember(t, env, "run1", a, p, membertest.Options{})
	if got := membertest.Code(b.Ack(seq, events.PhasePrepare, a)); got != events.CodeRestarted {
		t.Fatalf("the old prepare was answered %q, want %q", got, events.CodeRestarted)
	}
	if n := p.Count("prepare"); n != 0 {
		t.Fatalf("the new process's participant was asked to prepare %d times", n)
	}
	b.Barrier(a)
	if info := membertest.WaitRegistered(t, env, "run1", a, nil); info.Served {
		t.Fatalf("the heartbeat says the new process served: %+v", info)
	}
	seq = b.Publish(events.Prepare{PhaseHeader: b.Header("c2", 10*time.Second, a)})
	if ack := b.Ack(seq, events.PhasePrepare, a); !ack.Header().OK {
		t.Fatalf("a prepare published after the start was refused: %+v", ack.Header().Error)
	}
}

// §5 Readiness: Report fields a participant gets wrong fail its prepare.
func TestPrepareRefusesBadReport(t *testing.T) {
	env := jstest.Start(t)
	b := membertest.NewBridge(t, env, "run1")
	h := events.Member("agent.x")
	membertest.StartMember(t, env, "run1", h, reportParticipant{report: member.Report{Ready: true, Restarts: []string{"bad key with spaces"}}}, membertest.Options{})
	want(t, b.Ack(b.Publish(events.Prepare{PhaseHeader: b.Header("c1", 10*time.Second, h)}), events.PhasePrepare, h), events.CodeInternal, events.StateIdle)
}

// reportParticipant reports what it is told; it is a Subject with nothing
// else.
type reportParticipant struct{ report member.Report }

func (r reportParticipant) Prepare(context.Context, member.Checkpoint) (member.Report, error) {
	return r.report, nil
}
func (reportParticipant) Bind(*member.Member)                             {}
func (reportParticipant) AddWork(testing.TB, int) []events.Episode        { return nil }
func (reportParticipant) Hold(events.Episode) func()                      { return func() {} }
func (reportParticipant) Live() []string                                  { return nil }
func (reportParticipant) PaceWrites(func(ctx context.Context, index int)) {}

// A participant with Prepare only (PrepareFunc) still commits: zero
// records, an empty object and a manifest.
func TestPrepareFuncOnly(t *testing.T) {
	env := jstest.Start(t)
	b := membertest.NewBridge(t, env, "run1")
	a := events.Member("owner.min")
	m, err := member.New(member.Config{Run: "run1", Member: a, JS: env.JS, Bus: env.Bus,
		Participant: member.PrepareFunc(func(context.Context, member.Checkpoint) (member.Report, error) {
			return member.Report{Ready: true}, nil
		}), PollEvery: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	membertest.WaitRegistered(t, env, "run1", a, nil)
	want(t, b.Ack(b.Publish(events.Prepare{PhaseHeader: b.Header("c1", 10*time.Second, a)}), events.PhasePrepare, a), "", events.StatePrepared)
	c := b.Ack(b.Publish(events.Commit{PhaseHeader: b.Header("c1", 10*time.Second, a)}), events.PhaseCommit, a).(events.CommitAck)
	want(t, c, "", events.StateCommitted)
	// PROTOCOL §5, commit: nothing exported, no manifest anywhere.
	if c.Manifest != nil {
		t.Fatalf("manifest %+v, want none for zero records", c.Manifest)
	}
	if _, recs, err := member.ReadRecordsAt(t.Context(), env.Bus, "run1", "c1", a, c.Seq, nil); !errors.Is(err, member.ErrNoManifest) || len(recs) != 0 {
		t.Fatalf("ReadRecordsAt: %v, %d records, want ErrNoManifest", err, len(recs))
	}
}

func TestConfigValidate(t *testing.T) {
	env := jstest.Start(t)
	_, err := member.New(member.Config{Run: "bad run", Member: "bridge.b", Grace: -1, Capabilities: []string{"Bad Cap"}})
	if !errors.Is(err, member.ErrInvalidConfig) {
		t.Fatalf("New: %v, want ErrInvalidConfig", err)
	}
	for _, f := range []string{"Config.Run", "Config.Member", "Config.JS", "Config.Bus", "Config.Participant", "Config.Grace"} {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("error %q does not name %s", err, f)
		}
	}
	other, _ := env.Connect(t)
	_, err = member.New(member.Config{Run: "run1", Member: "agent.a", JS: env.JS, Conn: other, Bus: env.Bus,
		Participant: member.PrepareFunc(nil), Capabilities: []string{"Bad Cap"}})
	for _, f := range []string{"Config.Conn", "Config.Capabilities"} {
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("error %v does not name %s", err, f)
		}
	}
	_, err = member.New(member.Config{Run: "run1", Member: "agent.a", JS: env.JS, Bus: env.Bus, Participant: member.PrepareFunc(nil),
		Source: membertest.StartHost(t, env, "run1", "h"), StateFile: filepath.Join(t.TempDir(), "position.json")})
	if err == nil || !strings.Contains(err.Error(), "Config.StateFile") {
		t.Errorf("a Source and a StateFile: %v, want an error naming Config.StateFile", err)
	}
	m, err := member.New(member.Config{Run: "run1", Member: "agent.a", JS: env.JS, Bus: env.Bus, Participant: member.PrepareFunc(nil)})
	if err != nil || m.Name() != "agent.a" {
		t.Fatalf("New: %v", err)
	}
}

func TestConsumerName(t *testing.T) {
	cases := map[string][2]string{
		"sp_run1_agent_a0":        {"run1", "agent.a0"},
		"sp_r__agent_agent_x":     {"r_agent", "agent.x"},
		"sp_r_agent_agent__x":     {"r", "agent.agent_x"},
		"sp_run-2_sandbox_s__1__": {"run-2", "sandbox.s_1_"},
	}
	seen := map[string]bool{}
	for want, in := range cases {
		got := member.ConsumerName(in[0], events.Member(in[1]))
		if got != want {
			t.Errorf("ConsumerName(%s, %s) = %s, want %s", in[0], in[1], got, want)
		}
		if seen[got] || strings.ContainsAny(got, ".*> ") {
			t.Errorf("name %s repeated or invalid", got)
		}
		seen[got] = true
	}
}

// §5 commit: the commit ack recorded first is the manifest's one record.
// Another process of the member that commits other records is refused by
// the server (the subject is written once), and the member names how its
// manifest differs from the recorded one, as a second create of a schema-1
// member key did. (A retry with another scope after a failed commit is a
// conflict: TestMachineExportOnce.)
func TestCommitNeverOverwrites(t *testing.T) {
	var logs lockedBuffer
	l := zerolog.New(&logs)
	w := start(t, membertest.Options{Episodes: 2, Logger: &l})
	eps := []events.Episode{{Rollout: "t0-r0"}, {Rollout: "t0-r1"}}
	want(t, w.prepare(t, "c1"), "", events.StatePrepared)
	// The next commit's ack, sent first by "another process": no records.
	h := w.bridge.Header("c1", 10*time.Second, w.name)
	first := events.CommitAck{AckHeader: events.AckHeader{Run: "run1", Member: w.name, Seq: h.Seq, CheckpointID: "c1", OK: true,
		State: events.StateCommitted}}
	msg, err := events.Marshal(w.name, first)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jetstream.PublishOnce(t.Context(), w.env.JS, msg); err != nil {
		t.Fatal(err)
	}
	w.bridge.Publish(events.Commit{PhaseHeader: h, Scope: eps})
	poll.Wait(t, 20*time.Second, "the member to name the manifest recorded first", func() bool {
		return strings.Contains(logs.String(), member.ErrManifestExists.Error())
	})
	if n := w.bridge.AckCount(h.Seq, events.PhaseCommit, w.name); n != 1 {
		t.Fatalf("%d commit acks, want the one recorded first", n)
	}
	if got := w.bridge.Ack(h.Seq, events.PhaseCommit, w.name).(events.CommitAck); got.Manifest != nil {
		t.Fatalf("the recorded ack changed: %+v", got.Manifest)
	}
	if _, err := member.FindManifest(t.Context(), w.env.Bus, "run1", "c1", w.name, h.Seq); !errors.Is(err, member.ErrNoManifest) {
		t.Fatalf("FindManifest: %v, want the recorded ack's (none)", err)
	}
	if n := w.p.Count("export"); n != 1 {
		t.Fatalf("Export called %d times, want 1", n)
	}
}

// TestCheckRecorded: the recorded commit ack against the manifest a
// repeat would carry: the same is no conflict, another names each
// difference, records against none is a conflict too.
func TestCheckRecorded(t *testing.T) {
	env := jstest.Start(t)
	self := events.Member("agent.a0")
	recs := []events.Record{{Key: "r1", Data: []byte(`{}`)}}
	man, err := member.Digest("run1", "c1", self, recs)
	if err != nil {
		t.Fatal(err)
	}
	ack := events.CommitAck{AckHeader: events.AckHeader{Run: "run1", Member: self, Seq: 7, CheckpointID: "c1", OK: true,
		State: events.StateCommitted}, Manifest: &man}
	msg, err := events.Marshal(self, ack)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jetstream.PublishOnce(t.Context(), env.JS, msg); err != nil {
		t.Fatal(err)
	}
	subject := events.AckSubject("run1", 7, events.PhaseCommit, self)
	if err := member.CheckRecorded(t.Context(), env.Bus.Stream, subject, &man); err != nil {
		t.Fatalf("the same manifest: %v", err)
	}
	other, _ := member.Digest("run1", "c1", self, append(recs, events.Record{Key: "r2", Data: []byte(`{}`)}))
	if err := member.CheckRecorded(t.Context(), env.Bus.Stream, subject, &other); !errors.Is(err, member.ErrManifestExists) || !strings.Contains(err.Error(), "count 1, want 2") {
		t.Fatalf("another manifest: %v, want ErrManifestExists naming the count", err)
	}
	if err := member.CheckRecorded(t.Context(), env.Bus.Stream, subject, nil); !errors.Is(err, member.ErrManifestExists) {
		t.Fatalf("no manifest against a recorded one: %v, want ErrManifestExists", err)
	}
	if err := member.CheckRecorded(t.Context(), env.Bus.Stream, events.AckSubject("run1", 8, events.PhaseCommit, self), &man); err != nil {
		t.Fatalf("nothing recorded: %v", err)
	}
}

// lockedBuffer is a log sink that tests read while members write to it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// §5 Epochs fence zombies: superseded in the middle of a commit write, a
// member stops without an ack, a manifest or a records object.
func TestSupersededMidWrite(t *testing.T) {
	w := start(t, membertest.Options{Episodes: 3})
	reached := make(chan struct{})
	w.p.SetWriteHook(func(ctx context.Context, _ string, i int) {
		if i == 1 {
			close(reached)
			<-ctx.Done()
		}
	})
	want(t, w.prepare(t, "c1"), "", events.StatePrepared)
	cseq := w.bridge.Publish(events.Commit{PhaseHeader: w.bridge.Header("c1", 10*time.Second, w.name)})
	select {
	case <-reached:
	case <-time.After(10 * time.Second):
		t.Fatal("the write never reached record 1")
	}
	w.bridge.Epoch = 1
	w.bridge.Publish(events.Resume{PhaseHeader: w.bridge.Header("c1", 10*time.Second, w.name)})
	if err := w.h.Err(); !errors.Is(err, member.ErrSuperseded) {
		t.Fatalf("Run: %v, want ErrSuperseded", err)
	}
	if _, ok := w.bridge.Lookup(cseq, events.PhaseCommit, w.name); ok {
		t.Fatal("a superseded member answered its commit")
	}
	if _, err := w.env.Bus.Manifests.Get(t.Context(), events.MemberManifestKey("run1", "c1", w.name)); !errors.Is(err, natsjs.ErrKeyNotFound) {
		t.Fatalf("manifest: %v, want none", err)
	}
	if has, err := member.HasObjects(t.Context(), w.env.Bus.Records, "run1", "c1", w.name); has || err != nil {
		t.Fatalf("records object: %v %v, want none", has, err)
	}
	if n := w.p.Count("resume"); n != 0 {
		t.Fatalf("a superseded member reopened admission %d times", n)
	}
}

// PROTOCOL §3: a sandbox daemon reads on the core feed (Config.StateFile)
// and keeps its position in a state file. Stopped and started again, it
// resumes after the last event it handled, catching up from the stream
// after it (by the newest of its run's phases for a sandbox's own user):
// it answers what was published while it was down, and never answers
// twice what it had answered.
func TestMemberResumesFromItsStateFile(t *testing.T) {
	for _, feed := range []string{"core", "core scoped"} {
		t.Run(feed, func(t *testing.T) { resumesFromItsStateFile(t, feed == "core scoped") })
	}
}

func resumesFromItsStateFile(t *testing.T, scoped bool) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, "run1")
	state := filepath.Join(t.TempDir(), "position.json")
	name := events.Member("sandbox.sb1")
	startOne := func() *membertest.Handle {
		return membertest.StartMember(t, env, "run1", name, membertest.NewParticipant("sb1"), membertest.Options{StateFile: state, NoPull: scoped})
	}
	h := startOne()
	prep := events.Prepare{PhaseHeader: bridge.Header("c1", 10*time.Second, name)}
	seq1 := bridge.Publish(prep)
	want(t, bridge.Ack(seq1, events.PhasePrepare, name), "", events.StatePrepared)
	seq2 := bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c1", 10*time.Second, name)})
	want(t, bridge.Ack(seq2, events.PhaseResume, name), "", events.StateIdle)
	if err := h.Stop(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(state)
	if err != nil || !strings.Contains(string(b), `"stream_seq"`) {
		t.Fatalf("state file: %s, %v", b, err)
	}

	// While it is down, a retire is published; a new process of the member
	// answers it from the saved position, and only it.
	seq3 := bridge.Publish(events.Retire{PhaseHeader: bridge.Header("retire-3", 10*time.Second, name),
		Episodes: []events.Episode{{Rollout: "r9", Attempt: 2}}})
	h2 := startOne()
	want(t, bridge.Ack(seq3, events.PhaseRetire, name), "", events.StateIdle)
	if err := h2.Member.Admit(events.Episode{Rollout: "r9", Attempt: 2}); err == nil {
		t.Error("the retire published while the member was down was not applied")
	}
	for _, s := range []struct {
		seq uint64
		p   events.Phase
	}{{seq1, events.PhasePrepare}, {seq2, events.PhaseResume}, {seq3, events.PhaseRetire}} {
		if n := bridge.AckCount(s.seq, s.p, name); n != 1 {
			t.Errorf("%s seq %d has %d acks, want exactly 1", s.p, s.seq, n)
		}
	}
}

// pausing is a participant that pauses something at prepare and continues
// it at resume, reporting both, as a sandbox daemon does.
type pausing struct {
	*membertest.Participant
	seq int
}

func (p *pausing) Prepare(ctx context.Context, cp member.Checkpoint) (member.Report, error) {
	rep, err := p.Participant.Prepare(ctx, cp)
	p.seq++
	rep.Pause = &events.PauseReport{Mode: "freeze", PauseSeq: p.seq, Identity: "1:2", PIDCount: 3}
	return rep, err
}

func (p *pausing) Continue(ctx context.Context, id string) (*events.PauseReport, error) {
	return &events.PauseReport{Mode: "freeze", PauseSeq: p.seq, Identity: "1:2", PIDCount: 3}, p.Participant.Resume(ctx, id)
}

// PROTOCOL §6: every pause and continue ack carries the report of what the
// participant did.
func TestPauseReportsReachTheAcks(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, "run1")
	name := events.Member("sandbox.sb1")
	p := &pausing{Participant: membertest.NewParticipant("sb1")}
	membertest.StartMember(t, env, "run1", name, p, membertest.Options{})
	seq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 10*time.Second, name)})
	pa := bridge.Ack(seq, events.PhasePrepare, name).(events.PrepareAck)
	if pa.Pause == nil || pa.Pause.Mode != "freeze" || pa.Pause.PauseSeq != 1 {
		t.Fatalf("prepare ack pause %+v", pa.Pause)
	}
	seq = bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c1", 10*time.Second, name)})
	ra := bridge.Ack(seq, events.PhaseResume, name).(events.ResumeAck)
	if ra.Pause == nil || ra.Pause.PauseSeq != 1 || !p.AdmissionOpen() {
		t.Fatalf("resume ack pause %+v, admission open %v", ra.Pause, p.AdmissionOpen())
	}
}

// A process presumed dead whose name a new process took (a restore into a
// fresh fleet of the same names) stops at its next heartbeat instead of
// writing over the new one's: the heartbeat key carries an instance, and
// later beats only update what the process itself wrote.
func TestReplacedMemberStops(t *testing.T) {
	env := jstest.Start(t, jstest.WithTopology(jetstream.Topology{MemberTTL: 1500 * time.Millisecond}))
	name := events.Member("agent.a")
	old := membertest.StartMember(t, env, "run1", name, membertest.NewParticipant("a"), membertest.Options{})
	first := membertest.WaitRegistered(t, env, "run1", name, nil)
	fresh := membertest.StartMember(t, env, "run1", name, membertest.NewParticipant("a"), membertest.Options{})
	select {
	case <-old.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the replaced process is still running")
	}
	if err := old.Err(); !errors.Is(err, member.ErrReplaced) {
		t.Fatalf("the replaced process returned %v, want ErrReplaced", err)
	}
	info := membertest.WaitRegistered(t, env, "run1", name, nil)
	if info.Instance == first.Instance || info.Instance == "" {
		t.Fatalf("heartbeat instance %q, the first was %q", info.Instance, first.Instance)
	}
	select {
	case <-fresh.Done():
		t.Fatalf("the new process stopped: %v", fresh.Err())
	default:
	}
}

// A heartbeat key written over with a value that names no process (a
// write of another client, garbage) is written again by the member,
// which goes on: only another process of its name replaces it.
func TestForeignHeartbeatValueIsWrittenOver(t *testing.T) {
	env := jstest.Start(t, jstest.WithTopology(jetstream.Topology{MemberTTL: 1500 * time.Millisecond}))
	name := events.Member("agent.a")
	h := membertest.StartMember(t, env, "run1", name, membertest.NewParticipant("a"), membertest.Options{})
	first := membertest.WaitRegistered(t, env, "run1", name, nil)
	if _, err := env.Bus.Members.Put(t.Context(), events.MemberKey("run1", name), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 10*time.Second, "the member to write its heartbeat again", func() bool {
		e, err := env.Bus.Members.Get(t.Context(), events.MemberKey("run1", name))
		if err != nil {
			return false
		}
		var info events.MemberInfo
		return json.Unmarshal(e.Value(), &info) == nil && info.Instance == first.Instance
	})
	select {
	case <-h.Done():
		t.Fatalf("the member stopped: %v", h.Err())
	default:
	}
}

// §3, Consumers: a member whose consumer disappears (deleted, or lost with
// its server) makes it again and carries on from the stream: a phase
// published while it was gone is answered, once, and nothing answered
// before is answered again. Run does not return.
func TestLostConsumerIsMadeAgain(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, "run1")
	name := events.Member("agent.a1")
	h := membertest.StartMember(t, env, "run1", name, membertest.NewParticipant("t0"), membertest.Options{})
	seq1 := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 10*time.Second, name)})
	want(t, bridge.Ack(seq1, events.PhasePrepare, name), "", events.StatePrepared)

	var deleted []string
	for info := range env.Bus.Stream.ListConsumers(t.Context()).Info() {
		if info.Config.FilterSubject == events.PhaseFilter("run1") || slices.Contains(info.Config.FilterSubjects, events.PhaseFilter("run1")) {
			if err := env.Bus.Stream.DeleteConsumer(t.Context(), info.Name); err != nil {
				t.Fatal(err)
			}
			deleted = append(deleted, info.Name)
		}
	}
	if len(deleted) != 1 {
		t.Fatalf("deleted consumers %v, want the member's one", deleted)
	}
	seq2 := bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c1", 10*time.Second, name)})
	want(t, bridge.Ack(seq2, events.PhaseResume, name), "", events.StateIdle)
	seq3 := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c2", 10*time.Second, name)})
	want(t, bridge.Ack(seq3, events.PhasePrepare, name), "", events.StatePrepared)
	select {
	case <-h.Done():
		t.Fatalf("Run returned: %v", h.Err())
	default:
	}
	bridge.Barrier(name)
	for _, s := range []struct {
		seq uint64
		p   events.Phase
	}{{seq1, events.PhasePrepare}, {seq2, events.PhaseResume}, {seq3, events.PhasePrepare}} {
		if n := bridge.AckCount(s.seq, s.p, name); n != 1 {
			t.Errorf("%s seq %d has %d acks, want exactly 1", s.p, s.seq, n)
		}
	}
	if err := h.Stop(); err != nil {
		t.Errorf("Run: %v, want nil after a clean stop", err)
	}
}

// §3, Consumers: a pull that finds no responders while the member's
// consumer is there (one just made on a cluster, before its leader serves
// it) is lost, and
// nats.go would pull again only after two missed heartbeats, 30 s. The
// member pulls again at its retry and answers the next phases once each.
func TestPullWithNoRespondersIsSentAgain(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, "run1")
	name := events.Member("agent.a1")
	h := membertest.StartMember(t, env, "run1", name, membertest.NewParticipant("t0"), membertest.Options{})
	header := func(id string) events.PhaseHeader { return bridge.Header(id, 10*time.Second, name) }
	seqs := []uint64{bridge.Publish(events.Prepare{PhaseHeader: header("c1")})}
	want(t, bridge.Ack(seqs[0], events.PhasePrepare, name), "", events.StatePrepared)

	member.ConsumeError(h.Member, nats.ErrNoResponders)
	poll.Wait(t, 10*time.Second, "the member to pull again", func() bool { return member.Repulls(h.Member) == 1 })

	seqs = append(seqs, bridge.Publish(events.Resume{PhaseHeader: header("c1")}))
	want(t, bridge.Ack(seqs[1], events.PhaseResume, name), "", events.StateIdle)
	seqs = append(seqs, bridge.Publish(events.Prepare{PhaseHeader: header("c2")}))
	want(t, bridge.Ack(seqs[2], events.PhasePrepare, name), "", events.StatePrepared)
	bridge.Barrier(name)
	for i, p := range []events.Phase{events.PhasePrepare, events.PhaseResume, events.PhasePrepare} {
		if n := bridge.AckCount(seqs[i], p, name); n != 1 {
			t.Errorf("%s seq %d has %d acks, want exactly 1", p, seqs[i], n)
		}
	}
	if err := h.Stop(); err != nil {
		t.Errorf("Run: %v, want nil after a clean stop", err)
	}
}

// PROTOCOL §3, Consumers, and PROTOCOL-HISTORY §31: a member's durable
// consumer keeps its state in memory, so a NATS server restarted on its
// store comes back without it.
// The member sees its pulls go unanswered, finds the consumer gone, makes
// it again from the first event it had not handled, and commits the next
// checkpoint; the sandbox daemon's core feed carries on too. Every phase
// is answered once, and Run does not return.
func TestMemberCarriesOnAfterItsServerRestarts(t *testing.T) {
	for _, feed := range []string{"durable", "core", "core scoped"} {
		t.Run(feed, func(t *testing.T) {
			env := jstest.Start(t)
			bridge := membertest.NewBridge(t, env, "run1")
			name := events.Member("agent.a1")
			opts := membertest.Options{Episodes: 1}
			if feed != "durable" {
				name, opts.StateFile, opts.NoPull = "sandbox.sb1", filepath.Join(t.TempDir(), "position.json"), feed == "core scoped"
			}
			h := membertest.StartMember(t, env, "run1", name, membertest.NewParticipant("t0"), opts)
			eps := []events.Episode{{Rollout: "t0-r0"}}
			type sent struct {
				seq uint64
				p   events.Phase
			}
			var all []sent
			phase := func(d events.PhaseEvent, state events.State) {
				t.Helper()
				seq := bridge.Publish(d)
				want(t, bridge.Ack(seq, d.Phase(), name), "", state)
				all = append(all, sent{seq, d.Phase()})
			}
			header := func(id string) events.PhaseHeader { return bridge.Header(id, 10*time.Second, name) }
			phase(events.Prepare{PhaseHeader: header("c1")}, events.StatePrepared)
			phase(events.Resume{PhaseHeader: header("c1")}, events.StateIdle)

			env.Restart(t)
			poll.Wait(t, 30*time.Second, "the restarted server's stream", func() bool {
				_, err := env.Bus.Stream.Info(t.Context())
				return err == nil
			})
			if feed == "durable" {
				poll.Wait(t, 30*time.Second, "the member's consumer made again", func() bool {
					_, err := env.Bus.Stream.Consumer(t.Context(), member.ConsumerName("run1", name))
					return err == nil
				})
			}

			phase(events.Prepare{PhaseHeader: header("c2")}, events.StatePrepared)
			phase(events.Commit{PhaseHeader: header("c2"), Scope: eps}, events.StateCommitted)
			phase(events.Resume{PhaseHeader: header("c2")}, events.StateIdle)
			select {
			case <-h.Done():
				t.Fatalf("Run returned: %v", h.Err())
			default:
			}
			bridge.Barrier(name)
			for _, s := range all {
				if n := bridge.AckCount(s.seq, s.p, name); n != 1 {
					t.Errorf("%s seq %d has %d acks, want exactly 1", s.p, s.seq, n)
				}
			}
			if err := h.Stop(); err != nil {
				t.Errorf("Run: %v, want nil after a clean stop", err)
			}
		})
	}
}

// §3, Consumers: phases are numbered one by one and a member reads them
// all, so one whose consumer skipped a phase (a delivery lost while the
// stream elected a leader, which the server redelivers only after AckWait,
// behind the phases after it) sees the gap, reads the stream again from
// after the last phase it saw, and answers the skipped phase before the
// next, so that a lost resume does not have the member refuse the next
// checkpoint and the release. Here the consumer the member finds under its name
// never delivers resumes.
func TestSkippedPhaseIsReadAgain(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, "run1")
	name := events.Member("agent.a1")
	cfg := member.DurableConfig("run1", member.ConsumerName("run1", name), "skips resumes")
	cfg.FilterSubject, cfg.FilterSubjects = "", []string{events.PhaseSubject("run1", events.PhasePrepare), events.PhaseSubject("run1", events.PhaseCommit)}
	if _, err := env.Bus.Stream.CreateConsumer(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	h := membertest.StartMember(t, env, "run1", name, membertest.NewParticipant("t0"), membertest.Options{Episodes: 1})
	eps := []events.Episode{{Rollout: "t0-r0"}}
	header := func(id string) events.PhaseHeader { return bridge.Header(id, 10*time.Second, name) }
	type sent struct {
		seq   uint64
		p     events.Phase
		state events.State
	}
	var all []sent
	publish := func(e events.PhaseEvent, state events.State) sent {
		s := sent{bridge.Publish(e), e.Phase(), state}
		all = append(all, s)
		return s
	}
	answered := func(s sent) {
		t.Helper()
		want(t, bridge.Ack(s.seq, s.p, name), "", s.state)
	}
	answered(publish(events.Prepare{PhaseHeader: header("c1")}, events.StatePrepared))
	answered(publish(events.Commit{PhaseHeader: header("c1"), Scope: eps}, events.StateCommitted))
	resume := publish(events.Resume{PhaseHeader: header("c1")}, events.StateIdle) // that consumer never delivers it
	next := publish(events.Prepare{PhaseHeader: header("c2")}, events.StatePrepared)
	answered(resume)
	answered(next)
	answered(publish(events.Commit{PhaseHeader: header("c2"), Scope: eps}, events.StateCommitted))
	select {
	case <-h.Done():
		t.Fatalf("Run returned: %v", h.Err())
	default:
	}
	for _, s := range all {
		if n := bridge.AckCount(s.seq, s.p, name); n != 1 {
			t.Errorf("%s seq %d has %d acks, want exactly 1", s.p, s.seq, n)
		}
	}
	if err := h.Stop(); err != nil {
		t.Errorf("Run: %v, want nil after a clean stop", err)
	}
}

// PROTOCOL §3, acks: a sandbox daemon's prepare ack travels on core NATS,
// once: not into the stream, and not again for the same prepare delivered
// twice. Asked on its alive subject with the prepare named
// (events.AliveQuery), the daemon says the same ack again, for an asker
// that missed it; a query of a phase it did not answer says nothing more.
// An agent's prepare ack is stored in the stream.
func TestDaemonSaysItsPrepareAckAgainWhenAsked(t *testing.T) {
	env := jstest.Start(t)
	b := membertest.NewBridge(t, env, "run1")
	daemon := membertest.StartMembers(t, env, "run1", 1, membertest.Options{Kind: events.KindSandbox})[0].Name
	agent := membertest.StartMembers(t, env, "run1", 1, membertest.Options{})[0].Name
	h := b.Header("c1", 10*time.Second, daemon, agent)
	seq := b.Publish(events.Prepare{PhaseHeader: h})
	if code := membertest.Code(b.Ack(seq, events.PhasePrepare, daemon)); code != "" {
		t.Fatalf("the daemon's prepare ack: %s", code)
	}
	b.Ack(seq, events.PhasePrepare, agent)
	if _, err := env.Bus.Stream.GetLastMsgForSubject(t.Context(), events.AckSubject("run1", seq, events.PhasePrepare, daemon)); err == nil {
		t.Errorf("the daemon's prepare ack is in the stream")
	}
	if _, err := env.Bus.Stream.GetLastMsgForSubject(t.Context(), events.AckSubject("run1", seq, events.PhasePrepare, agent)); err != nil {
		t.Errorf("the agent's prepare ack is not in the stream: %v", err)
	}

	// The same prepare again, stored again under another id: answered from
	// the answer recorded, not said again.
	b.PublishWithID(events.Prepare{PhaseHeader: h}, "again")
	b.Barrier(daemon)
	if n := b.AckCount(seq, events.PhasePrepare, daemon); n != 1 {
		t.Fatalf("%d prepare acks of the daemon heard after a repeated prepare, want 1", n)
	}

	ask := func(q events.AliveQuery) *nats.Msg {
		t.Helper()
		body, _ := json.Marshal(q)
		reply, err := env.Conn.Request(events.AliveSubject("run1", daemon), body, 5*time.Second)
		if err != nil || len(reply.Data) == 0 {
			t.Fatalf("alive query %+v: %v %v", q, reply, err)
		}
		return reply
	}
	for _, q := range []events.AliveQuery{{Seq: seq + 100, Phase: events.PhasePrepare}, {Seq: seq, Phase: events.PhaseCommit}} {
		if r := ask(q); len(r.Header) != 0 {
			t.Errorf("the answer to %+v, which names no ack the daemon sent, carries headers %v", q, r.Header)
		}
	}
	// The answer to the query of the prepare carries the ack itself, on
	// the asker's inbox (whatever floods the ack's subject).
	answer := ask(events.AliveQuery{Seq: seq, Phase: events.PhasePrepare})
	carried := &nats.Msg{Subject: events.LiveAckSubject("run1", seq, events.PhasePrepare, daemon), Header: answer.Header, Data: answer.Data}
	if _, d, err := events.Unmarshal(carried); err != nil {
		t.Errorf("the answer does not carry the prepare ack: %v", err)
	} else if a, ok := d.(events.PrepareAck); !ok || a.Seq != seq || a.Member != daemon {
		t.Errorf("the answer carries %+v, want the daemon's prepare ack", d)
	}
	poll.Wait(t, 5*time.Second, "the prepare ack said again", func() bool { return b.AckCount(seq, events.PhasePrepare, daemon) == 2 })
	// What else the queries asked comes, if at all, before the one they
	// named: only that ack was said again, the same bytes.
	if err := env.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	first, again := b.Heard(seq, events.PhasePrepare, daemon)[0], b.Heard(seq, events.PhasePrepare, daemon)[1]
	if !bytes.Equal(first.Data, again.Data) || first.Header.Get(events.HeaderMsgID) != again.Header.Get(events.HeaderMsgID) {
		t.Errorf("said again:\n%s\nfirst:\n%s", again.Data, first.Data)
	}
	if n := b.AckCount(seq, events.PhasePrepare, daemon); n != 2 {
		t.Errorf("%d prepare acks heard, want the first and the one said again", n)
	}
}

// PROTOCOL §4: no one can publish a member's ack id first. An intruder
// that read every id on the stream publishes, on a subject of another
// run, the ids that a scheme derived from run, sequence, phase and member
// would give the acks to come; every ack of the next checkpoint still
// lands on its subject, the member's own.
func TestAckIDsCannotBeClaimedFirst(t *testing.T) {
	env := jstest.Start(t)
	b := membertest.NewBridge(t, env, "run1")
	hs := membertest.StartMembers(t, env, "run1", 2, membertest.Options{Episodes: 1})
	var names []events.Member
	for _, h := range hs {
		names = append(names, h.Name)
	}
	// checkpoint runs a checkpoint through every member and returns its
	// phases whose acks are stored (a resume's are not).
	type phase struct {
		seq uint64
		p   events.Phase
	}
	checkpoint := func(id string) []phase {
		t.Helper()
		var stored []phase
		for _, d := range []events.PhaseEvent{
			events.Prepare{PhaseHeader: b.Header(id, 10*time.Second, names...)},
			events.Commit{PhaseHeader: b.Header(id, 10*time.Second, names...)},
			events.Resume{PhaseHeader: b.Header(id, 10*time.Second, names...)},
		} {
			seq := b.Publish(d)
			for _, m := range names {
				if a := b.Ack(seq, d.Phase(), m); !a.Header().OK {
					t.Fatalf("%s's %s ack of %s: %+v", m, d.Phase(), id, a.Header().Error)
				}
			}
			if d.Phase() != events.PhaseResume {
				stored = append(stored, phase{seq, d.Phase()})
			}
		}
		return stored
	}
	first := checkpoint("c1")

	in := membertest.NewIntruder(t, env)
	seen := in.Seen()
	guesses := membertest.Guesses("run1", seen, 6, []string{"c1"}, "c2")
	// What a derived id would have been: the guesses hold it.
	for _, m := range names {
		if derived := fmt.Sprintf("run1.%d.prepare.%s", first[len(first)-1].seq+2, m); !guesses[derived] {
			t.Fatalf("the guesses from %d ids miss %s", len(seen), derived)
		}
	}
	if n := in.Claim(guesses); n != len(guesses) {
		t.Fatalf("the stream stored %d of %d guesses", n, len(guesses))
	}

	for _, ph := range checkpoint("c2") {
		for _, m := range names {
			raw, err := env.Bus.Stream.GetLastMsgForSubject(t.Context(), events.AckSubject("run1", ph.seq, ph.p, m))
			if err != nil {
				t.Fatalf("%s's %s ack to %d: %v", m, ph.p, ph.seq, err)
			}
			if id := raw.Header.Get(events.HeaderMsgID); guesses[id] {
				t.Fatalf("%s's %s ack to %d has the id %s, which the intruder guessed", m, ph.p, ph.seq, id)
			}
		}
	}
}

// PROTOCOL §4: an ack this process publishes again carries the id of the
// first, so the server takes it for a duplicate of it; another process of
// the member draws another.
func TestAckPublishedAgainHasItsID(t *testing.T) {
	env := jstest.Start(t)
	b := membertest.NewBridge(t, env, "run1")
	h := membertest.StartMembers(t, env, "run1", 1, membertest.Options{})[0]
	seq := b.Publish(events.Prepare{PhaseHeader: b.Header("c1", 10*time.Second, h.Name)})
	b.Ack(seq, events.PhasePrepare, h.Name)
	raw, err := env.Bus.Stream.GetLastMsgForSubject(t.Context(), events.AckSubject("run1", seq, events.PhasePrepare, h.Name))
	if err != nil {
		t.Fatal(err)
	}
	id := raw.Header.Get(events.HeaderMsgID)
	if again := member.AckID(h.Member, seq, events.PhasePrepare); again != id {
		t.Fatalf("the ack published again would have the id %q, the first %q", again, id)
	}
	if err := h.Stop(); err != nil {
		t.Fatal(err)
	}
	restarted := membertest.StartMember(t, env, "run1", h.Name, membertest.NewParticipant("t0"), membertest.Options{})
	if other := member.AckID(restarted.Member, seq, events.PhasePrepare); other == id {
		t.Fatalf("another process of the member draws the id %q again", id)
	}
}
