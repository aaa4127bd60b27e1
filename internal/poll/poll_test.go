package poll_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/internal/poll"
)

func TestMain(m *testing.M) { leak.VerifyTestMain(m) }

func TestUntilHoldsAtOnce(t *testing.T) {
	calls := 0
	err := poll.Until(t.Context(), poll.Every(time.Hour), func() (bool, error) { calls++; return true, nil })
	if err != nil || calls != 1 {
		t.Fatalf("Until: %v after %d calls, want nil after 1", err, calls)
	}
}

func TestUntilLooksAgainUntilItHolds(t *testing.T) {
	calls := 0
	err := poll.Until(t.Context(), poll.Backoff(time.Microsecond, time.Millisecond), func() (bool, error) {
		calls++
		return calls == 5, nil
	})
	if err != nil || calls != 5 {
		t.Fatalf("Until: %v after %d calls, want nil after 5", err, calls)
	}
}

func TestUntilStopsAtTheConditionsError(t *testing.T) {
	boom := errors.New("boom")
	calls := 0
	err := poll.Until(t.Context(), poll.Every(time.Millisecond), func() (bool, error) { calls++; return false, boom })
	if !errors.Is(err, boom) || calls != 1 {
		t.Fatalf("Until: %v after %d calls, want boom after 1", err, calls)
	}
}

// The context's end is the deadline: Until returns its cause, after one
// last look.
func TestUntilReturnsTheContextsCause(t *testing.T) {
	ctx, cancel := context.WithTimeoutCause(t.Context(), 20*time.Millisecond, os.ErrDeadlineExceeded)
	defer cancel()
	var calls atomic.Int32
	err := poll.Until(ctx, poll.Every(time.Millisecond), func() (bool, error) { calls.Add(1); return false, nil })
	if !errors.Is(err, os.ErrDeadlineExceeded) || calls.Load() < 2 {
		t.Fatalf("Until: %v after %d calls, want os.ErrDeadlineExceeded after several", err, calls.Load())
	}

	canceled, cancel := context.WithCancel(t.Context())
	cancel()
	if err := poll.Until(canceled, poll.Every(time.Hour), func() (bool, error) { return false, nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Until on a canceled context: %v, want context.Canceled", err)
	}
}

// A condition that comes true while the last interval runs out counts.
func TestUntilLooksOnceMoreAtTheDeadline(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	calls := 0
	err := poll.Until(ctx, poll.Every(time.Hour), func() (bool, error) {
		calls++
		if calls == 1 {
			cancel() // the deadline passes during the first interval
			return false, nil
		}
		return true, nil
	})
	if err != nil || calls != 2 {
		t.Fatalf("Until: %v after %d calls, want nil after 2", err, calls)
	}
}

func TestBackoffDoubles(t *testing.T) {
	var gaps []time.Duration
	last := time.Now()
	_ = poll.Until(t.Context(), poll.Backoff(2*time.Millisecond, 8*time.Millisecond), func() (bool, error) {
		now := time.Now()
		gaps = append(gaps, now.Sub(last))
		last = now
		return len(gaps) == 6, nil
	})
	// Sleeps of 2, 4, 8, 8, 8 ms: each at least that (a loaded machine
	// only makes them longer).
	for i, want := range []time.Duration{2, 4, 8, 8, 8} {
		if got := gaps[i+1]; got < want*time.Millisecond {
			t.Errorf("sleep %d: %s, want at least %s", i+1, got, want*time.Millisecond)
		}
	}
}

// fakeT records a failure instead of failing.
type fakeT struct{ failed string }

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	panic(f) // stands for runtime.Goexit: Fatalf does not return
}

func (f *fakeT) wait(within time.Duration, what string, cond func() bool) {
	defer func() {
		if r := recover(); r != nil && r != f {
			panic(r)
		}
	}()
	poll.Wait(f, within, what, cond)
}

func TestWait(t *testing.T) {
	var f fakeT
	n := 0
	f.wait(time.Minute, "three looks", func() bool { n++; return n == 3 })
	if f.failed != "" || n != 3 {
		t.Fatalf("Wait failed %q after %d looks", f.failed, n)
	}

	f.wait(30*time.Millisecond, "something that never happens", func() bool { return false })
	if want := "poll: timed out after 30ms waiting for something that never happens"; f.failed != want {
		t.Fatalf("Wait failed with %q, want %q", f.failed, want)
	}
}

// Wait works in a cleanup, where the test's context has ended.
func TestWaitInACleanup(t *testing.T) {
	t.Run("sub", func(t *testing.T) {
		t.Cleanup(func() {
			n := 0
			poll.Wait(t, time.Minute, "two looks", func() bool { n++; return n == 2 })
		})
	})
}

// TestNoTestingOrNATSDependency keeps the package usable by production
// code (no package testing) and by every test (no nats-server).
func TestNoTestingOrNATSDependency(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("this test runs `go list`; put the go command on PATH: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for dep := range strings.FieldsSeq(string(out)) {
		if dep == "testing" || strings.HasPrefix(dep, "github.com/nats-io/") {
			t.Errorf("package poll depends on %s", dep)
		}
	}
}

func TestHolds(t *testing.T) {
	n := 0
	start := time.Now()
	poll.Holds(t, 50*time.Millisecond, func() error { n++; return nil })
	if took := time.Since(start); took < 50*time.Millisecond || n < 2 {
		t.Fatalf("Holds took %s with %d looks, want at least 50ms and 2", took, n)
	}

	var f fakeT
	func() {
		defer func() { _ = recover() }()
		poll.Holds(&f, time.Minute, func() error { return errors.New("it moved") })
	}()
	if f.failed != "it moved" {
		t.Fatalf("Holds failed with %q, want the check's error", f.failed)
	}
}

func TestUntilWokenLooksAgainAtOnce(t *testing.T) {
	wake := make(chan struct{}, 1)
	calls := 0
	start := time.Now()
	err := poll.UntilWoken(t.Context(), poll.Every(time.Hour), func() <-chan struct{} { return wake }, func() (bool, error) {
		calls++
		if calls < 3 {
			wake <- struct{}{} // announced: a look again at once, not in an hour
		}
		return calls == 3, nil
	})
	if err != nil || calls != 3 || time.Since(start) > time.Minute {
		t.Fatalf("UntilWoken: %v after %d calls in %s, want nil after 3 at once", err, calls, time.Since(start))
	}
}

func TestUntilWokenLooksAgainUnannounced(t *testing.T) {
	calls := 0
	err := poll.UntilWoken(t.Context(), poll.Every(time.Millisecond), func() <-chan struct{} { return make(chan struct{}) }, func() (bool, error) {
		calls++
		return calls == 3, nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("UntilWoken: %v after %d calls, want nil after 3", err, calls)
	}
}
