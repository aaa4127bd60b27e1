package poll

import (
	"context"
	"time"
)

// Interval is how long Until and Wait sleep between two looks at their
// condition: First after the first look, twice as long after each further
// one, up to Max. Every(d) is a fixed interval.
type Interval struct {
	// First is the sleep after the first look; at least a nanosecond.
	First time.Duration
	// Max bounds the sleep; below First it is taken as First.
	Max time.Duration
}

// Every returns the fixed interval d.
func Every(d time.Duration) Interval { return Interval{First: d, Max: d} }

// Backoff returns the interval that starts at first and doubles up to max.
func Backoff(first, max time.Duration) Interval { return Interval{First: first, Max: max} }

// next returns the sleep after cur.
func (iv Interval) next(cur time.Duration) time.Duration {
	return max(min(2*cur, iv.Max), iv.First)
}

// Until calls cond until it reports true, and returns nil then. It returns
// cond's error at once when cond returns one, and context.Cause(ctx) when
// ctx ends first (ctx.Err() unless a cause was given, as with
// context.WithTimeoutCause), after one last look at cond. It always looks
// at least once, even if ctx has already ended.
func Until(ctx context.Context, iv Interval, cond func() (bool, error)) error {
	return UntilWoken(ctx, iv, nil, cond)
}

// UntilWoken is Until for a condition whose changes are announced: wake,
// called before each look at cond, returns a channel that is closed (or
// receives) once cond may hold; a wake-up looks again at once, and the
// interval only guards against a change that was not announced. A nil
// wake is Until.
func UntilWoken(ctx context.Context, iv Interval, wake func() <-chan struct{}, cond func() (bool, error)) error {
	wait := max(iv.First, time.Nanosecond)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		var woken <-chan struct{}
		if wake != nil {
			woken = wake()
		}
		if ok, err := cond(); ok || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			if ok, err := cond(); ok || err != nil {
				return err
			}
			return context.Cause(ctx)
		case <-woken:
			timer.Reset(wait)
			continue
		case <-timer.C:
		}
		wait = iv.next(wait)
		timer.Reset(wait)
	}
}
