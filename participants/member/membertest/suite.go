package membertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
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
	// before may block until ctx is done. A Suite with NoRecords never
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

// Suite is what a participant package supplies to run the conformance
// suite: how to build its participant, and how its members run.
type Suite struct {
	// Kind is the member kind of the suite's members (default agent).
	Kind events.MemberKind
	// New returns a fresh participant for member name on env, holding no
	// work. The suite builds, runs and stops its Member.
	New func(t *testing.T, env *jstest.Env, name events.Member) Subject
	// Shared runs every member of the suite behind a Host
	// (member.Config.Source), the one consumer of a process that hosts
	// many members.
	Shared bool
	// CoreFeed runs every member on the core feed with a state file
	// (member.Config.StateFile), as sandbox daemons do: a core-NATS
	// subscription with catch-up by direct get. A restarted member of the
	// same name keeps its file.
	CoreFeed bool
	// NoPull, with CoreFeed, runs them as sandbox daemons with users of
	// their own (Config.NoPull): their catch-up reads the newest phase of
	// each kind.
	NoPull bool
	// NoRecords says the participant neither exports nor installs: its
	// state is somebody else's to checkpoint (a sandbox daemon: the
	// owner's snapshot and the agent's bookmark). The suite then checks
	// that its commits carry no manifest, that a restore reads none and
	// installs nothing, and, with no record to pace, that a resume racing
	// a commit never leaves a manifest behind the resume.
	NoRecords bool
}

// world is one subtest's world: a bus, a run, a bridge.
type world struct {
	t      *testing.T
	h      Suite
	env    *jstest.Env
	run    string
	bridge *Bridge
	hosts  int
	dir    string
}

func newWorld(t *testing.T, h Suite) *world {
	t.Parallel()
	env := jstest.Start(t)
	bridge := NewBridge(t, env, "run1")
	bridge.LiveEvery = h.CoreFeed
	return &world{t: t, h: h, env: env, run: "run1", bridge: bridge}
}

func (s *world) name(n string) events.Member {
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

func (s *world) start(name events.Member, opts Options) *Handle {
	s.t.Helper()
	if s.h.CoreFeed && opts.StateFile == "" {
		if s.dir == "" {
			s.dir = s.t.TempDir()
		}
		opts.StateFile = filepath.Join(s.dir, name.Name()+".position.json")
		opts.NoPull = s.h.NoPull
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
func (s *world) phase(m events.Member, d events.PhaseEvent) events.Ack {
	s.t.Helper()
	return s.bridge.Ack(s.bridge.Publish(d), d.Phase(), m)
}

func (s *world) prepare(m events.Member, id string, in time.Duration) events.PrepareAck {
	s.t.Helper()
	return s.phase(m, events.Prepare{PhaseHeader: s.bridge.Header(id, in, m)}).(events.PrepareAck)
}

func (s *world) commit(m events.Member, id string, scope []events.Episode, stop bool) events.CommitAck {
	s.t.Helper()
	return s.phase(m, events.Commit{PhaseHeader: s.bridge.Header(id, 10*time.Second, m), Scope: scope, Stop: stop}).(events.CommitAck)
}

func (s *world) resume(m events.Member, id string) events.ResumeAck {
	s.t.Helper()
	return s.phase(m, events.Resume{PhaseHeader: s.bridge.Header(id, 10*time.Second, m)}).(events.ResumeAck)
}

// expect fails unless ack a has error code (""=ok) and state.
func (s *world) expect(a events.Ack, code string, state events.State) {
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
// commit's manifest: that of no records when its ack carries none (it
// exported nothing).
func (s *world) checkpoint(m events.Member, id string, scope []events.Episode) events.MemberManifest {
	s.t.Helper()
	s.expect(s.prepare(m, id, 10*time.Second), "", events.StatePrepared)
	c := s.commit(m, id, scope, false)
	s.expect(c, "", events.StateCommitted)
	s.expect(s.resume(m, id), "", events.StateIdle)
	if c.Manifest == nil {
		man, err := member.Digest(s.run, id, m, nil)
		if err != nil {
			s.t.Fatal(err)
		}
		return man
	}
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

func (s *world) info(m events.Member) (events.MemberInfo, bool) {
	s.t.Helper()
	e, err := s.env.Bus.Heartbeats(m.Kind()).Get(s.t.Context(), events.MemberKey(s.run, m))
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

// lastMembership returns the last membership event of m, nil for a sandbox
// daemon: it announces none (PROTOCOL §3, membership), and must have
// published none.
func (s *world) lastMembership(m events.Member) events.Data {
	s.t.Helper()
	raw, err := s.env.Bus.Stream.GetLastMsgForSubject(s.t.Context(), events.MemberSubject(s.run, m))
	if m.Kind() == events.KindSandbox {
		if !errors.Is(err, natsjs.ErrMsgNotFound) {
			s.t.Fatalf("membership events of sandbox daemon %s: %v, want none", m, err)
		}
		return nil
	}
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
func Run(t *testing.T, h Suite) {
	if h.New == nil {
		t.Fatal("membertest: Suite.New is required")
	}
	checkpointRules(t, h)
	fencingRules(t, h)
	restoreRules(t, h)
	branchRules(t, h)
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
