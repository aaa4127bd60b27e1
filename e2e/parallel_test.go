package e2e

import (
	"math"
	"testing"

	"golang.org/x/sync/semaphore"
)

// cpuQuarters is what the package's tests may keep busy at once, in
// quarters of a core: the two cores of the machine make test is sized for.
// The rest of make test's packages run beside them (go test -p), so the
// package alone never asks for more than the machine has.
const cpuQuarters = 8

// cpuSlots is where a parallel test takes its share of the CPU.
var cpuSlots = semaphore.NewWeighted(cpuQuarters)

// parallel runs t beside the package's other end-to-end tests (go test's
// -parallel bounds how many; make test sets it): each has its own server,
// directories, ports, cgroups and run, so none can see another's. cores is
// how much CPU t keeps busy on average, measured alone (docs/BENCHMARKS.md,
// "The test suite"): most tests wait on their processes and need a quarter
// of a core, a fleet of OpenCode processes more than one. t first takes
// that from cpuSlots, so that the tests running at once keep no more than
// the machine busy, and gives it back when it ends.
func parallel(t *testing.T, cores float64) {
	t.Helper()
	t.Parallel()
	q := min(max(int64(math.Ceil(cores*4)), 1), cpuQuarters)
	if err := cpuSlots.Acquire(t.Context(), q); err != nil {
		t.Fatalf("waiting for %.2f cores: %v", cores, err)
	}
	t.Cleanup(func() { cpuSlots.Release(q) })
}
