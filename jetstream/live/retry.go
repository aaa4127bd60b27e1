package live

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/internal/poll"
)

// Policy says how Retry asks again.
type Policy struct {
	// Interval is the pause between two asks (default
	// poll.Backoff(20ms, 1s)).
	Interval poll.Interval
	// Within bounds how long Retry asks again: the last ask is the first
	// that ends once Within has passed (0: until ctx ends).
	Within time.Duration
	// Tries bounds how many times Retry asks (0: no bound).
	Tries int
	// Timeout bounds one ask, through the context it is given (0: only
	// ctx bounds it).
	Timeout time.Duration
	// Again tells an answer to ask again for, from its error (default
	// NoResponders).
	Again func(error) bool
}

// NoResponders tells a request that reached no one: nothing listens on its
// subject (the member is starting, restarting, or gone). Asking it again is
// safe.
func NoResponders(err error) bool { return errors.Is(err, nats.ErrNoResponders) }

// Retry calls ask until its answer is not one to ask again for (p.Again),
// pausing p.Interval between two calls, and returns the last call's
// answer: once it is one to keep, once p.Within or p.Tries is spent, or
// once ctx ends (then ask is not called again, and its last answer, made
// under the ended ctx or before it, is returned as it was). ask is always
// called once, even under an ended ctx.
func Retry[T any](ctx context.Context, p Policy, ask func(context.Context) (T, error)) (T, error) {
	again := p.Again
	if again == nil {
		again = NoResponders
	}
	iv := p.Interval
	if iv.First <= 0 {
		iv = poll.Backoff(20*time.Millisecond, time.Second)
	}
	until := ctx
	if p.Within > 0 {
		var cancel context.CancelFunc
		until, cancel = context.WithTimeout(ctx, p.Within)
		defer cancel()
	}
	var (
		v     T
		err   error
		asked int
	)
	_ = poll.Until(until, iv, func() (bool, error) {
		if asked > 0 && ctx.Err() != nil {
			return true, nil
		}
		asked++
		actx, cancel := ctx, context.CancelFunc(func() {})
		if p.Timeout > 0 {
			actx, cancel = context.WithTimeout(ctx, p.Timeout)
		}
		v, err = ask(actx)
		cancel()
		return !again(err) || (p.Tries > 0 && asked >= p.Tries) || until.Err() != nil, nil
	})
	return v, err
}
