package e2e

import (
	"cmp"
	"context"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/testcpu"
)

// cpuQuarters is what the package's tests may keep busy at once, in
// quarters of a core: the two cores of the machine make test is sized for.
const cpuQuarters = 8

// gather is how long the scheduler waits after the first test asks before
// it hands out any CPU: go test releases the parallel tests together, and
// within it every one has asked, so the longest go first.
const gather = 200 * time.Millisecond

// scheduler hands the package's CPU to its parallel tests, longest first
// (the longest ones started last would leave the machine idle at the end
// while they ran alone), each as it fits in what is free.
type scheduler struct {
	mu      sync.Mutex
	free    int64
	open    bool // gather has passed since the first ask
	started bool
	waiting []*waiter // longest first, then in the order they asked
}

type waiter struct {
	quarters int64
	took     time.Duration
	granted  chan struct{}
}

// cpu is the package's one scheduler.
var cpu = &scheduler{free: cpuQuarters}

// acquire waits until quarters of a core are t's, or ctx ends.
func (s *scheduler) acquire(ctx context.Context, quarters int64, took time.Duration) error {
	w := &waiter{quarters: quarters, took: took, granted: make(chan struct{})}
	s.mu.Lock()
	i, _ := slices.BinarySearchFunc(s.waiting, w, func(a, b *waiter) int {
		if c := cmp.Compare(b.took, a.took); c != 0 {
			return c
		}
		return -1 // after every waiter of the same length
	})
	s.waiting = slices.Insert(s.waiting, i, w)
	if !s.started {
		s.started = true
		time.AfterFunc(gather, func() {
			s.mu.Lock()
			s.open = true
			s.dispatch()
			s.mu.Unlock()
		})
	}
	s.dispatch()
	s.mu.Unlock()
	select {
	case <-w.granted:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		defer s.mu.Unlock()
		if i := slices.Index(s.waiting, w); i >= 0 {
			s.waiting = slices.Delete(s.waiting, i, i+1)
			s.dispatch()
			return ctx.Err()
		}
		s.free += quarters // granted meanwhile
		s.dispatch()
		return ctx.Err()
	}
}

// release gives quarters back.
func (s *scheduler) release(quarters int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.free += quarters
	s.dispatch()
}

// dispatch grants the longest waiters in turn while they fit; it stops at
// the first that does not, so that a long one is never passed over.
func (s *scheduler) dispatch() {
	for s.open && len(s.waiting) > 0 && s.waiting[0].quarters <= s.free {
		w := s.waiting[0]
		s.waiting = s.waiting[1:]
		s.free -= w.quarters
		close(w.granted)
	}
}

// parallel runs t beside the package's other end-to-end tests (go test's
// -parallel bounds how many; make test sets it high, as the scheduler
// does the bounding): each has its own server, directories, ports, cgroups
// and run, so none can see another's. cores is how much CPU t keeps busy on
// average and took how long it runs, both measured alone on the 2-core
// machine (docs/BENCHMARKS.md, "The test suite"): most tests wait on their
// processes and need a quarter of a core, a fleet of OpenCode processes
// more than one. t waits until the scheduler gives it that much of the
// machine's two cores, the longest tests first, and then until the
// machine's other test processes leave it that much (testcpu); it gives
// both back when it ends.
func parallel(t *testing.T, cores float64, took time.Duration) {
	t.Helper()
	t.Parallel()
	q := min(max(int64(math.Ceil(cores*4)), 1), cpuQuarters)
	if err := cpu.acquire(t.Context(), q, took); err != nil {
		t.Fatalf("waiting for %.2f cores: %v", cores, err)
	}
	t.Cleanup(func() { cpu.release(q) })
	// The same share of the machine, beside the other packages' tests.
	testcpu.Take(t, cores)
}
