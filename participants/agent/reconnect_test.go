package agent

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// A request whose answer a server restart lost is asked again once the
// connection is back, instead of waiting out its timeout: the first
// request here is never answered (as one in flight when the server went
// away), the server restarts, and the second is.
func TestAcrossReconnectsAsksAgain(t *testing.T) {
	env := jstest.Start(t)
	callee, _ := env.Connect(t)
	caller, _ := env.Connect(t)
	var asked atomic.Int32
	if _, err := callee.Subscribe("grade", func(m *nats.Msg) {
		if asked.Add(1) > 1 {
			_ = m.Respond([]byte("graded"))
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := callee.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	type answer struct {
		got string
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		got, err := acrossReconnects(ctx, caller, func(ctx context.Context) (string, error) {
			m, err := caller.RequestWithContext(ctx, "grade", nil)
			if err != nil {
				return "", err
			}
			return string(m.Data), nil
		})
		answered <- answer{got, err}
	}()
	poll.Wait(t, 10*time.Second, "the first request", func() bool { return asked.Load() > 0 })
	env.Restart(t)
	if a := <-answered; a.err != nil || a.got != "graded" {
		t.Fatalf("acrossReconnects = %q, %v; want the second request's answer", a.got, a.err)
	}
	if n := asked.Load(); n < 2 {
		t.Fatalf("the callee was asked %d times, want a second request after the reconnect", n)
	}
}

// Without a reconnect the request's own outcome is returned: a deadline
// is not retried.
func TestAcrossReconnectsKeepsTheOutcome(t *testing.T) {
	env := jstest.Start(t)
	nc, _ := env.Connect(t)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	calls := 0
	_, err := acrossReconnects(ctx, nc, func(ctx context.Context) (string, error) {
		calls++
		<-ctx.Done()
		return "", ctx.Err()
	})
	if err != context.DeadlineExceeded || calls != 1 {
		t.Fatalf("err %v after %d calls, want the deadline after 1", err, calls)
	}
}
