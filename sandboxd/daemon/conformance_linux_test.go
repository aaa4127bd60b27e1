package daemon

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// TestConformance runs the member conformance suite against sandboxd:
// each member is a Daemon with a real Supervisor (freeze mode where cgroup
// v2 allows it) whose work is real launches. A sandbox daemon exports and
// installs nothing (NoRecords) and reads on the core feed with a state
// file (CoreFeed), as in production. The subtests run in
// parallel: several supervisors share the test process, each taking only
// the processes it has positive evidence for.
func TestConformance(t *testing.T) {
	membertest.Run(t, membertest.Suite{
		Kind:      events.KindSandbox,
		CoreFeed:  true,
		NoRecords: true,
		New: func(t *testing.T, env *jstest.Env, name events.Member) membertest.Subject {
			log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
			sup, err := sandboxd.New(sandboxd.Config{StateDir: t.TempDir(), Logger: log, Grace: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			d, err := newDaemon(Config{Run: "run1", SandboxID: name.Name(), JS: env.JS, Bus: env.Bus, Supervisor: sup, Logger: log})
			if err != nil {
				t.Fatal(err)
			}
			g := &gate{Supervisor: sup, held: map[string]*holdOf{}}
			d.launches = g
			return &subject{Daemon: d, gate: g, prefix: fmt.Sprintf("%s-%d-%d", name.Name(), os.Getpid(), subjects.Add(1)),
				ids: map[events.Episode]string{}}
		},
	})
}

// subjects numbers the subjects of the test process: their launch ids
// name cgroups that every test process on the host shares.
var subjects atomic.Int64

// subject is the daemon as the conformance suite drives it: its work is
// launches that sleep, each for an episode; the suite builds its member
// (Bind), and the daemon runs it beside its supervisor and service (Run).
type subject struct {
	*Daemon
	gate     *gate
	prefix   string
	prepares atomic.Int32 // the prepares the member asked

	mu  sync.Mutex
	n   int
	ids map[events.Episode]string
}

// Prepare counts the member's prepares.
func (s *subject) Prepare(ctx context.Context, cp member.Checkpoint) (member.Report, error) {
	s.prepares.Add(1)
	return s.Daemon.Prepare(ctx, cp)
}

var _ membertest.Runner = (*subject)(nil)

func (s *subject) Bind(m *member.Member) { s.member = m }

// Run runs the daemon, and with it the member the suite bound.
func (s *subject) Run(ctx context.Context) error { return s.Daemon.Run(ctx) }

func (s *subject) AddWork(t testing.TB, n int) []events.Episode {
	t.Helper()
	var eps []events.Episode
	for range n {
		s.mu.Lock()
		s.n++
		ep := events.Episode{Rollout: fmt.Sprintf("%s-w%d", s.name.Name(), s.n)}
		id := fmt.Sprintf("%s-w%d", s.prefix, s.n)
		s.ids[ep] = id
		s.mu.Unlock()
		if _, err := s.launch(t.Context(), ep.String(), false, nil, nil, sandboxd.Spec{ID: id, Command: "sleep 600"}); err != nil {
			t.Fatalf("launch %s for %s: %v", id, ep, err)
		}
		eps = append(eps, ep)
	}
	return eps
}

// Hold keeps the pause of ep's launch from starting until release: the
// launch runs on, and the daemon reports it as still pausing.
func (s *subject) Hold(ep events.Episode) func() {
	s.mu.Lock()
	id := s.ids[ep]
	s.mu.Unlock()
	return s.gate.hold(id)
}

// Live returns the episodes of the launches that have not ended.
func (s *subject) Live() []string {
	keys := map[string]bool{}
	for _, rec := range s.sup.List() {
		if rec.State == sandboxapi.StateEnded {
			continue
		}
		s.Daemon.mu.Lock()
		if k := s.core.Episode(rec.ID); k != "" {
			keys[k] = true
		}
		s.Daemon.mu.Unlock()
	}
	return slices.Sorted(maps.Keys(keys))
}

// PaceWrites is never called: a sandbox daemon exports nothing.
func (s *subject) PaceWrites(func(ctx context.Context, index int)) {}

// gate is the real supervisor, with the pauses of held launches kept from
// starting until they are released (or the pause is cut short).
type gate struct {
	*sandboxd.Supervisor
	pauses atomic.Int32 // the pauses asked for

	mu   sync.Mutex
	held map[string]*holdOf
}

// holdOf is one held launch. A stubborn hold ignores a cut: it notes it
// (cut is closed) and still waits for the release, then pauses, as a
// pause that was under way when the resume came completes anyway.
type holdOf struct {
	release  chan struct{}
	stubborn bool
	cut      chan struct{}
	once     sync.Once
}

func (g *gate) hold(id string) (release func()) {
	h := g.add(id, false)
	return func() { g.release(id, h) }
}

func (g *gate) holdStubborn(id string) (cut <-chan struct{}, release func()) {
	h := g.add(id, true)
	return h.cut, func() { g.release(id, h) }
}

func (g *gate) add(id string, stubborn bool) *holdOf {
	h := &holdOf{release: make(chan struct{}), stubborn: stubborn, cut: make(chan struct{})}
	g.mu.Lock()
	g.held[id] = h
	g.mu.Unlock()
	return h
}

func (g *gate) release(id string, h *holdOf) {
	h.once.Do(func() {
		g.mu.Lock()
		if g.held[id] == h {
			delete(g.held, id)
		}
		g.mu.Unlock()
		close(h.release)
	})
}

// Pause waits while id is held, then pauses it.
func (g *gate) Pause(ctx context.Context, id string, mode sandboxapi.Mode) (sandboxapi.PauseResult, error) {
	g.pauses.Add(1)
	g.mu.Lock()
	h := g.held[id]
	g.mu.Unlock()
	if h != nil {
		select {
		case <-h.release:
		case <-ctx.Done():
			if !h.stubborn {
				return sandboxapi.PauseResult{}, ctx.Err()
			}
			close(h.cut)
			<-h.release
			ctx = context.WithoutCancel(ctx)
		}
	}
	return g.Supervisor.Pause(ctx, id, mode)
}

// PROTOCOL §5 resume: a pause that a resume cut short may still complete;
// the resume then continues it. The prepare reports the launch still
// pausing; the resume comes, the pause completes after it was cut, and the
// resume waits for it and continues the launch.
func TestResumeContinuesAPauseItCutShort(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, "run1")
	s := newSubject(t, env, time.Second)
	hd := membertest.StartMember(t, env, "run1", "sandbox.sb1", s, membertest.Options{StateFile: filepath.Join(t.TempDir(), "position.json")})
	eps := s.AddWork(t, 1)
	id := s.ids[eps[0]]
	cut, release := s.gate.holdStubborn(id)
	defer release()

	pseq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 30*time.Second, hd.Name)})
	poll.Wait(t, 10*time.Second, "the pause to be under way", func() bool {
		s.Daemon.mu.Lock()
		defer s.Daemon.mu.Unlock()
		return s.core.Pausing(id)
	})
	rseq := bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c1", 30*time.Second, hd.Name)})
	select {
	case <-cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the resume did not cut the pause short")
	}
	release() // the pause completes after all
	ra := bridge.Ack(rseq, events.PhaseResume, hd.Name).(events.ResumeAck)
	if !ra.OK || ra.Pause == nil || ra.Pause.PauseSeq != 1 {
		t.Fatalf("resume ack %+v, pause %+v: want the late pause continued", ra.AckHeader, ra.Pause)
	}
	if pa := bridge.Ack(pseq, events.PhasePrepare, hd.Name); membertest.Code(pa) != events.CodeStaleCheckpoint {
		t.Fatalf("prepare ack %+v, want stale_checkpoint", pa.Header())
	}
	rec, err := s.sup.Status(id)
	if err != nil || rec.State != sandboxapi.StateRunning || rec.Pauses.Seq != 1 {
		t.Fatalf("launch after the resume: %+v, %v; want running after one pause", rec, err)
	}
}

// useRelay gives the subject's daemon a model relay, as Config.Relay
// does.
func (s *subject) useRelay(r Relay) {
	s.Daemon.cfg.Relay = r
	s.Daemon.core.relay = true
}

// newSubject is a daemon for sandbox sb1 whose supervisor has grace, as
// the conformance suite builds it.
func newSubject(t *testing.T, env *jstest.Env, grace time.Duration) *subject {
	t.Helper()
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	sup, err := sandboxd.New(sandboxd.Config{StateDir: t.TempDir(), Logger: log, Grace: grace})
	if err != nil {
		t.Fatal(err)
	}
	d, err := newDaemon(Config{Run: "run1", SandboxID: "sb1", JS: env.JS, Bus: env.Bus, Supervisor: sup, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{Supervisor: sup, held: map[string]*holdOf{}}
	d.launches = g
	return &subject{Daemon: d, gate: g, prefix: fmt.Sprintf("sb1-%d-%d", os.Getpid(), subjects.Add(1)), ids: map[events.Episode]string{}}
}

// A launch being stopped blocks a prepare until it has ended, without a
// pause: one would fail at once (it is stopping), and asking again would
// spin for the whole grace. Its end wakes the prepare.
func TestPrepareWaitsForAStoppingLaunchWithoutPausingIt(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, "run1")
	s := newSubject(t, env, time.Minute)
	hd := membertest.StartMember(t, env, "run1", "sandbox.sb1", s, membertest.Options{PollEvery: time.Hour,
		StateFile: filepath.Join(t.TempDir(), "position.json")})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ep := events.Episode{Rollout: "r1"}
	id := s.prefix + "-stubborn"
	// SIGINT is ignored (by the shell and the sleeps it starts): the stop
	// waits out its grace.
	if _, err := s.launch(ctx, ep.String(), false, nil, nil, sandboxd.Spec{ID: id, Command: "trap '' INT; while :; do sleep 0.05; done"}); err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	var stopErr error
	go func() {
		defer close(stopped)
		_, stopErr = s.sup.Stop(ctx, id)
	}()
	t.Cleanup(func() {
		// Not the grace, if the test fails first.
		_, _ = s.sup.Cancel(context.WithoutCancel(ctx), id)
		<-stopped
	})
	poll.Wait(t, 10*time.Second, "the launch to be stopping", func() bool {
		rec, err := s.sup.Status(id)
		return err == nil && rec.State == sandboxapi.StateStopping
	})

	before := s.prepares.Load()
	seq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 30*time.Second, hd.Name)})
	poll.Wait(t, 10*time.Second, "the member to ask a prepare", func() bool { return s.prepares.Load() > before })
	poll.Holds(t, 300*time.Millisecond, func() error {
		if n := s.gate.pauses.Load(); n != 0 {
			return fmt.Errorf("%d pauses of a launch being stopped (%d prepares)", n, s.prepares.Load()-before)
		}
		return nil
	})
	if _, err := s.sup.Cancel(ctx, id); err != nil {
		t.Fatal(err)
	}
	pa := bridge.Ack(seq, events.PhasePrepare, hd.Name).(events.PrepareAck)
	if !pa.Ready {
		t.Fatalf("prepare ack %+v after the launch ended, want ready", pa)
	}
	<-stopped
	if stopErr != nil {
		t.Fatalf("stop: %v", stopErr)
	}
	if n := s.gate.pauses.Load(); n != 0 {
		t.Fatalf("%d pauses of a launch that was stopping, want none", n)
	}
	bridge.Ack(bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c1", 10*time.Second, hd.Name)}), events.PhaseResume, hd.Name)
}
