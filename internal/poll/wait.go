package poll

import (
	"context"
	"time"
)

// T is what Wait needs of a test: testing.TB has it. (So that this package
// does not import package testing, which production code must not.)
type T interface {
	Helper()
	Fatalf(format string, args ...any)
}

// testInterval is how often Wait looks: at once, then after 1 ms, doubling
// up to 20 ms, so that something that happens at once is seen at once and
// a long wait costs at most 50 looks a second.
var testInterval = Backoff(time.Millisecond, 20*time.Millisecond)

// Wait calls cond (at once, then after 1 ms, doubling up to every 20 ms)
// until it holds, and fails the test if it still does not after within;
// what names the awaited condition in the failure ("poll: timed out after
// 10s waiting for <what>"). cond may itself fail the test (t.Fatalf) to
// stop at once, for a condition that can no longer come true. Wait does
// not look at the test's context: it also works in a cleanup function,
// where that context has ended.
func Wait(t T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if err := Until(ctx, testInterval, func() (bool, error) { return cond(), nil }); err != nil {
		t.Fatalf("poll: timed out after %s waiting for %s", within, what)
	}
}

// Holds calls check (every 20 ms, at least twice) for d and fails the test
// at the first error it returns: how a test observes that something stays
// as it is for a while (nothing of a paused process runs or writes, say).
// Unlike Wait, it always takes d.
func Holds(t T, d time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		if err := check(); err != nil {
			t.Fatalf("%v", err)
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(min(holdsInterval, time.Until(deadline)+time.Millisecond))
	}
}

// holdsInterval is how often Holds looks.
const holdsInterval = 20 * time.Millisecond
