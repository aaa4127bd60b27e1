package membertest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
)

// Options configure members started by StartMember and StartMembers. The
// zero value is usable.
type Options struct {
	// Kind is the member kind of StartMembers' names (default agent).
	Kind events.MemberKind
	// Prefix starts StartMembers' member names, <kind>.<prefix><i>
	// (default "t").
	Prefix string
	// Episodes is how many live episodes each test participant of
	// StartMembers starts with (attempt 0, rollouts <prefix><i>-r<j>).
	Episodes int
	// Grace is the lease grace (default 30 s: long enough not to expire in
	// a test that does not want it to).
	Grace time.Duration
	// PollEvery is the prepare poll interval (default 100 ms).
	PollEvery time.Duration
	// Logger receives the members' logs (default: the test's log).
	Logger *zerolog.Logger
	// Host, when set, feeds the members from one shared consumer
	// (StartHost, member.Config.Source) instead of one consumer each.
	Host *Host
	// StateFile, when set, runs the member on the core feed, keeping its
	// position there (member.Config.StateFile), as sandbox daemons run.
	StateFile string
	// NoPull, with StateFile, makes the member one whose user makes no
	// consumer and reads no stream info (member.Config.NoPull), as a
	// sandbox with a user of its own: its catch-up reads the newest phase
	// of each kind. With an Env of such a user's credentials
	// (jstest.Env.WithCreds) it opens no bus, which that user cannot.
	NoPull bool
}

func (o Options) withDefaults(t testing.TB) Options {
	if o.Kind == "" {
		o.Kind = events.KindAgent
	}
	if o.Prefix == "" {
		o.Prefix = "t"
	}
	if o.Grace == 0 {
		o.Grace = 30 * time.Second
	}
	if o.PollEvery == 0 {
		o.PollEvery = 100 * time.Millisecond
	}
	if o.Logger == nil {
		l := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel).With().Timestamp().Logger()
		o.Logger = &l
	}
	return o
}

// Handle is one member running in-process.
type Handle struct {
	// Name is the member's name.
	Name events.Member
	// Member is the runtime.
	Member *member.Member
	// Subject is its participant.
	Subject Subject
	// Participant is its participant when it is a test Participant.
	Participant *Participant

	cancel context.CancelFunc
	done   chan struct{}
	err    error
	once   sync.Once
}

// Done is closed when the member's Run has returned.
func (h *Handle) Done() <-chan struct{} { return h.done }

// Err returns what Run returned; valid once Done is closed.
func (h *Handle) Err() error {
	<-h.done
	return h.err
}

// Stop stops the member (a clean stop) and waits for Run to return; it
// returns Run's error. It is idempotent, and runs in the test's cleanup.
func (h *Handle) Stop() error {
	h.once.Do(h.cancel)
	<-h.done
	return h.err
}

// StartMember starts a member named name of run with participant s, on a
// connection of its own to env, and waits until it has registered: from
// then on it hears every phase published. The test's cleanup stops it.
func StartMember(t testing.TB, env *jstest.Env, run string, name events.Member, s Subject, opts Options) *Handle {
	t.Helper()
	opts = opts.withDefaults(t)
	var (
		js  natsjs.JetStream
		bus *jetstream.Bus
	)
	if opts.Host != nil {
		// Members of one process share its connection as they share its
		// consumer.
		js, bus = opts.Host.JetStream(), opts.Host.Bus()
	} else {
		_, js = env.Connect(t)
		if !opts.NoPull || env.ConnConfig("").CredsFile == "" {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			var err error
			if bus, err = jetstream.Open(ctx, js); err != nil {
				t.Fatalf("membertest: open bus: %v", err)
			}
		}
	}
	cfg := member.Config{
		Run: run, Member: name, JS: js, Bus: bus, Participant: s,
		Logger: *opts.Logger, Grace: opts.Grace, PollEvery: opts.PollEvery, StateFile: opts.StateFile, NoPull: opts.NoPull,
	}
	if opts.Host != nil {
		cfg.Source = opts.Host
	}
	m, err := member.New(cfg)
	if err != nil {
		t.Fatalf("membertest: %v", err)
	}
	s.Bind(m)
	runMember := m.Run
	if r, ok := s.(Runner); ok {
		runMember = r.Run
	}
	rctx, rcancel := context.WithCancel(context.WithoutCancel(t.Context()))
	h := &Handle{Name: name, Member: m, Subject: s, cancel: rcancel, done: make(chan struct{})}
	h.Participant, _ = s.(*Participant)
	go func() {
		defer close(h.done)
		h.err = runMember(rctx)
	}()
	t.Cleanup(func() {
		if err := h.Stop(); err != nil && !errors.Is(err, member.ErrSuperseded) && !errors.Is(err, member.ErrReplaced) {
			t.Errorf("membertest: %s: Run: %v", name, err)
		}
	})
	WaitRegistered(t, env, run, name, h.done)
	return h
}

// WaitRegistered waits until member name of run has its heartbeat key, or
// done is closed (the member stopped first), or 10 s pass.
func WaitRegistered(t testing.TB, env *jstest.Env, run string, name events.Member, done <-chan struct{}) events.MemberInfo {
	t.Helper()
	var info events.MemberInfo
	poll.Wait(t, 10*time.Second, fmt.Sprintf("member %s to register", name), func() bool {
		e, err := env.Bus.Heartbeats(name.Kind()).Get(t.Context(), events.MemberKey(run, name))
		if errors.Is(err, natsjs.ErrKeyNotFound) {
			select {
			case <-done:
				t.Fatalf("membertest: member %s stopped before it registered", name)
			default:
			}
			return false
		}
		if err != nil {
			t.Fatalf("membertest: read heartbeat of %s: %v", name, err)
		}
		if err := json.Unmarshal(e.Value(), &info); err != nil {
			t.Fatalf("membertest: heartbeat of %s: %v", name, err)
		}
		return true
	})
	return info
}

// StartMembers starts n test-participant members of run in-process, named
// <kind>.<prefix><i> (agent.t0, agent.t1, ... by default), each on its own
// connection, each holding opts.Episodes live episodes. It returns when all
// have registered; the test's cleanup stops them. A bridge test controls
// them through the handles: Participant.Block and Unblock for readiness,
// FailInstall and friends for failures, Stop to stop one.
func StartMembers(t testing.TB, env *jstest.Env, run string, n int, opts Options) []*Handle {
	t.Helper()
	opts = opts.withDefaults(t)
	hs := make([]*Handle, 0, n)
	for i := range n {
		prefix := fmt.Sprintf("%s%d", opts.Prefix, i)
		name, err := events.NewMember(opts.Kind, prefix)
		if err != nil {
			t.Fatalf("membertest: %v", err)
		}
		p := NewParticipant(prefix)
		for j := range opts.Episodes {
			p.Add(events.Episode{Rollout: fmt.Sprintf("%s-r%d", prefix, j)})
		}
		hs = append(hs, StartMember(t, env, run, name, p, opts))
	}
	return hs
}

// StartHost runs a Host named name for run on a connection of its own
// until the test ends; pass it in Options.Host.
func StartHost(t testing.TB, env *jstest.Env, run, name string) *Host {
	t.Helper()
	_, js := env.Connect(t)
	bus, err := jetstream.Open(t.Context(), js)
	if err != nil {
		t.Fatalf("membertest: open bus: %v", err)
	}
	h, err := NewHost(HostConfig{Run: run, Name: name, JS: js, Bus: bus,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)})
	if err != nil {
		t.Fatalf("membertest: %v", err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- h.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("membertest: host %s: %v", name, err)
		}
	})
	return h
}
