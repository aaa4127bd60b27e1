package agent

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// PROTOCOL §3, Liveness: the agent asks a silent daemon whether it is
// there, and takes it for gone only once its alive subject has found no
// responder for events.AliveUnanswered; a daemon that answers again in
// between (it reconnected) is not gone.
func TestAckBookProbeWaitsOutAReconnect(t *testing.T) {
	env := jstest.Start(t)
	b := newAckBook(testRun, nil)
	if err := b.subscribe(env.Conn); err != nil {
		t.Fatal(err)
	}
	defer b.close()
	daemon := events.Member("sandbox.sb-1")
	answer := func() *nats.Subscription {
		t.Helper()
		nc, _ := env.Connect(t)
		sub, err := nc.Subscribe(events.AliveSubject(testRun, daemon), func(m *nats.Msg) { _ = m.Respond([]byte("i1")) })
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		return sub
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	start := time.Now()
	dead := b.probe(ctx, daemon.Name())

	// Away for about half of AliveUnanswered, then back: not gone.
	time.Sleep(events.AliveUnanswered / 2)
	sub := answer()
	select {
	case <-dead:
		t.Fatalf("taken for gone %s in, on a daemon away for less than %s", time.Since(start), events.AliveUnanswered)
	case <-time.After(events.AliveUnanswered):
	}
	// Gone for good: found gone, no sooner than AliveUnanswered after.
	_ = sub.Unsubscribe()
	gone := time.Now()
	select {
	case <-dead:
		if took := time.Since(gone); took < events.AliveUnanswered {
			t.Errorf("taken for gone %s after it left, sooner than %s", took, events.AliveUnanswered)
		}
	case <-time.After(4 * events.AliveUnanswered):
		t.Fatalf("a daemon gone for %s is not found gone", 4*events.AliveUnanswered)
	}
}
