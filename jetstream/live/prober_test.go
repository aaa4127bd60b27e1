package live_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/jetstream/live"
)

const run = "run1"

// PROTOCOL §3, Liveness: requests that find no responder for
// events.AliveUnanswered, asked again in between, find the member gone;
// one that times out proves nothing; an answer starts the count again.
func TestSilenceRule(t *testing.T) {
	if live.SilenceLimit != events.AliveUnanswered {
		t.Fatalf("SilenceLimit %s, want events.AliveUnanswered %s", live.SilenceLimit, events.AliveUnanswered)
	}
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	var s live.Silence
	steps := []struct {
		at   time.Duration
		err  error
		gone bool
	}{
		{0, nats.ErrNoResponders, false},                              // the silence starts
		{events.AliveUnanswered / 2, context.DeadlineExceeded, false}, // a timeout: nothing
		{events.AliveUnanswered - time.Millisecond, nats.ErrNoResponders, false},
		{events.AliveUnanswered, context.DeadlineExceeded, false}, // only no responder says gone
		{events.AliveUnanswered, nats.ErrNoResponders, true},
		{events.AliveUnanswered + time.Second, nil, false}, // it answered: back
		{2 * events.AliveUnanswered, nats.ErrNoResponders, false},
		{3*events.AliveUnanswered - time.Millisecond, nats.ErrNoResponders, false},
		{3 * events.AliveUnanswered, nats.ErrNoResponders, true},
	}
	for i, st := range steps {
		if got := s.Heard(st.err, at(st.at)); got != st.gone {
			t.Fatalf("step %d (%v at %s): gone %v, want %v", i, st.err, st.at, got, st.gone)
		}
	}
	if !s.Gone(at(3 * events.AliveUnanswered)) {
		t.Fatal("Gone: false after the silence rule found it gone")
	}
	s.Reset()
	if s.Gone(at(10 * events.AliveUnanswered)) {
		t.Fatal("Gone after Reset")
	}
}

// answer makes a responder on m's alive subject that answers every request
// with its instance, and counts the requests that named a phase.
func answer(t *testing.T, env *jstest.Env, m events.Member, queries *atomic.Int32) *nats.Subscription {
	t.Helper()
	nc, _ := env.Connect(t)
	sub, err := nc.Subscribe(events.AliveSubject(run, m), func(msg *nats.Msg) {
		var q events.AliveQuery
		if len(msg.Data) > 0 && json.Unmarshal(msg.Data, &q) == nil && q.Seq > 0 && queries != nil {
			queries.Add(1)
		}
		_ = msg.Respond([]byte("i1"))
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return sub
}

// Ask names the phase asked about only when there is one (an empty body
// asks nothing more), on the member's alive subject.
func TestProberAsk(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	m := events.Member("sandbox.sb-1")
	p := &live.Prober{Conn: env.Conn, Run: run}
	if _, err := p.Ask(t.Context(), m, events.AliveQuery{}); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("Ask with no one there: %v, want no responders", err)
	}
	var queries atomic.Int32
	answer(t, env, m, &queries)
	if reply, err := p.Ask(t.Context(), m, events.AliveQuery{}); err != nil || string(reply.Data) != "i1" {
		t.Fatalf("Ask: %v %v", reply, err)
	}
	if _, err := p.Ask(t.Context(), m, events.AliveQuery{Seq: 4, Phase: events.PhasePrepare}); err != nil {
		t.Fatal(err)
	}
	if n := queries.Load(); n != 1 {
		t.Fatalf("%d requests named a phase, want 1", n)
	}
	if _, err := (&live.Prober{Run: run}).Ask(t.Context(), m, events.AliveQuery{}); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Fatalf("Ask without a connection: %v", err)
	}
}

// Answers finds a member that is there at once, one that never is gone
// once the silence rule has it (no sooner), and proves nothing once its
// ctx ends; Gone says the same the other way round.
func TestProberAnswers(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	p := &live.Prober{Conn: env.Conn, Run: run, Every: 100 * time.Millisecond}
	up, down := events.Member("sandbox.up"), events.Member("sandbox.down")
	answer(t, env, up, nil)
	var answers int
	if !p.Answers(t.Context(), up, events.AliveQuery{}, func(*nats.Msg) { answers++ }) || answers != 1 {
		t.Fatalf("a member that answers: not found there, or %d answers given", answers)
	}
	start := time.Now()
	if p.Answers(t.Context(), down, events.AliveQuery{}, nil) {
		t.Fatal("a member that never answers is not found gone")
	}
	if took := time.Since(start); took < live.SilenceLimit {
		t.Fatalf("found gone after %s, sooner than %s", took, live.SilenceLimit)
	}
	ctx, cancel := context.WithTimeout(t.Context(), live.SilenceLimit/5)
	defer cancel()
	if !p.Answers(ctx, down, events.AliveQuery{}, nil) {
		t.Fatal("Answers cut short by its ctx found a member gone")
	}
	if p.Gone(ctx, down) || p.Gone(t.Context(), up) {
		t.Fatal("Gone: a member found gone with its ctx ended, or one that answers")
	}
	if !p.Gone(t.Context(), down) {
		t.Fatal("Gone: a member that never answers is not found gone")
	}
}

// PROTOCOL §3, Liveness: a watched member away for less than the silence
// limit (it reconnected) is not gone; one gone for good is found gone, no
// sooner than the limit after it left.
func TestProberWatchWaitsOutAReconnect(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	m := events.Member("sandbox.sb-1")
	p := &live.Prober{Conn: env.Conn, Run: run, Rounds: time.Second}
	start := time.Now()
	dead, stop := p.Watch(t.Context(), m, events.AliveQuery{}, nil)
	defer stop()

	// Away for about half of the limit, then back: not gone.
	time.Sleep(live.SilenceLimit / 2)
	sub := answer(t, env, m, nil)
	select {
	case <-dead:
		t.Fatalf("taken for gone %s in, on a member away for less than %s", time.Since(start), live.SilenceLimit)
	case <-time.After(live.SilenceLimit):
	}
	// Gone for good: found gone, no sooner than the limit after.
	_ = sub.Unsubscribe()
	gone := time.Now()
	select {
	case <-dead:
		if took := time.Since(gone); took < live.SilenceLimit {
			t.Errorf("taken for gone %s after it left, sooner than %s", took, live.SilenceLimit)
		}
	case <-time.After(4 * live.SilenceLimit):
		t.Fatalf("a member gone for %s is not found gone", 4*live.SilenceLimit)
	}
}

// Watch gives each answer to answered, with the phase named in the
// request, and stop ends it.
func TestProberWatchAsksWithThePhase(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	m := events.Member("sandbox.sb-1")
	var queries atomic.Int32
	answer(t, env, m, &queries)
	p := &live.Prober{Conn: env.Conn, Run: run, Every: 20 * time.Millisecond, Rounds: 20 * time.Millisecond}
	answered := make(chan struct{}, 100)
	dead, stop := p.Watch(t.Context(), m, events.AliveQuery{Seq: 3, Phase: events.PhasePrepare}, func(*nats.Msg) {
		select {
		case answered <- struct{}{}:
		default:
		}
	})
	for range 3 {
		select {
		case <-answered:
		case <-time.After(10 * time.Second):
			t.Fatal("no answer given")
		}
	}
	stop()
	select {
	case <-dead:
		t.Fatal("a member that answers was found gone")
	default:
	}
	if queries.Load() < 3 {
		t.Fatalf("%d requests named the phase, want every one", queries.Load())
	}
}
