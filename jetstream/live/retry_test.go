package live_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/jetstream/live"
)

// A request that finds no responder is asked again until one answers: a
// service that comes up late is waited for.
func TestRetryWaitsForAResponder(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	svc, _ := env.Connect(t)
	var asks atomic.Int32
	ask := func(ctx context.Context) (*nats.Msg, error) {
		if asks.Add(1) == 3 {
			// The service comes up between the second and the third ask.
			if _, err := svc.Subscribe("svc.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
				t.Error(err)
			}
			if err := svc.Flush(); err != nil {
				t.Error(err)
			}
		}
		return env.Conn.RequestWithContext(ctx, "svc.echo", []byte("hi"))
	}
	got, err := live.Retry(t.Context(), live.Policy{Interval: poll.Every(10 * time.Millisecond), Timeout: 5 * time.Second}, ask)
	if err != nil || string(got.Data) != "hi" || asks.Load() != 3 {
		t.Fatalf("Retry: %v %v after %d asks, want the answer after 3", got, err, asks.Load())
	}
}

// An answer that is not one to ask again for (here a timeout: a request
// that may have reached someone) ends Retry at once, as does an error
// Again does not take.
func TestRetryKeepsOtherAnswers(t *testing.T) {
	var asks int
	timedOut := func(context.Context) (int, error) { asks++; return 0, context.DeadlineExceeded }
	if _, err := live.Retry(t.Context(), live.Policy{}, timedOut); !errors.Is(err, context.DeadlineExceeded) || asks != 1 {
		t.Fatalf("Retry: %v after %d asks, want the timeout after 1", err, asks)
	}
	asks = 0
	boom := errors.New("boom")
	again := func(err error) bool { return errors.Is(err, boom) }
	v, err := live.Retry(t.Context(), live.Policy{Interval: poll.Every(time.Millisecond), Again: again}, func(context.Context) (int, error) {
		asks++
		if asks < 4 {
			return 0, boom
		}
		return 7, nil
	})
	if v != 7 || err != nil || asks != 4 {
		t.Fatalf("Retry with Again: %d %v after %d asks, want 7 after 4", v, err, asks)
	}
}

// Tries and Within bound the asking; the last answer is returned.
func TestRetryBounds(t *testing.T) {
	var asks int
	unanswered := func(context.Context) (int, error) { asks++; return asks, nats.ErrNoResponders }
	v, err := live.Retry(t.Context(), live.Policy{Interval: poll.Every(time.Millisecond), Tries: 5}, unanswered)
	if v != 5 || !errors.Is(err, nats.ErrNoResponders) || asks != 5 {
		t.Fatalf("Tries 5: %d %v after %d asks, want the fifth answer", v, err, asks)
	}
	asks = 0
	start := time.Now()
	_, err = live.Retry(t.Context(), live.Policy{Interval: poll.Every(20 * time.Millisecond), Within: 200 * time.Millisecond}, unanswered)
	if took := time.Since(start); !errors.Is(err, nats.ErrNoResponders) || took < 200*time.Millisecond || took > 5*time.Second {
		t.Fatalf("Within 200ms: %v after %s (%d asks), want no responders after 200ms", err, took, asks)
	}
	if asks < 2 {
		t.Fatalf("Within 200ms asked %d times, want several", asks)
	}
}

// Once ctx ends Retry asks no more and returns the last answer as it was;
// it asks once even under an ended ctx.
func TestRetryStopsWithItsContext(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	var asks int
	_, err := live.Retry(ctx, live.Policy{Interval: poll.Every(time.Hour)}, func(context.Context) (int, error) {
		asks++
		cancel()
		return 0, nats.ErrNoResponders
	})
	if !errors.Is(err, nats.ErrNoResponders) || asks != 1 {
		t.Fatalf("Retry: %v after %d asks, want the last answer after 1", err, asks)
	}
	asks = 0
	if _, err := live.Retry(ctx, live.Policy{}, func(ctx context.Context) (int, error) { asks++; return 0, ctx.Err() }); !errors.Is(err, context.Canceled) || asks != 1 {
		t.Fatalf("Retry under an ended ctx: %v after %d asks, want one ask", err, asks)
	}
}

// Timeout bounds each ask, not the asking.
func TestRetryTimeoutBoundsOneAsk(t *testing.T) {
	var asks int
	_, err := live.Retry(t.Context(), live.Policy{Interval: poll.Every(time.Millisecond), Timeout: 20 * time.Millisecond},
		func(ctx context.Context) (int, error) {
			asks++
			if asks < 3 {
				<-ctx.Done() // longer than the timeout, shorter than the test
				return 0, nats.ErrNoResponders
			}
			return 0, nil
		})
	if err != nil || asks != 3 {
		t.Fatalf("Retry: %v after %d asks, want nil after 3", err, asks)
	}
}
