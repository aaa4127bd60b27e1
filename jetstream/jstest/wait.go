package jstest

import (
	"testing"
	"time"
)

// WaitFor polls cond every 10 ms until it holds, and fails the test if it
// still does not after within, or if the test's context ends first; what
// names the awaited condition in the failure.
func WaitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		select {
		case <-t.Context().Done():
			t.Fatal(t.Context().Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}
