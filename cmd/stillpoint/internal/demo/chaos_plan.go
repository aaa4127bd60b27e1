package demo

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// plannedTries is how many times a planned round is run when one of its
// faults misses its point (the round ended first, or found no process to
// kill there): a matrix row fails for a fault only when it never landed.
const plannedTries = 3

// plannedRound runs the k-th round of --plan: its entry (after the
// entries before it, each with its tries), run again, with a slow tool
// call twice as long each time, while one of its faults missed its point
// and tries remain. A try whose invariants failed is not run again: what
// landed broke them.
func (w *chaosWorld) plannedRound(ctx context.Context, k int, planned [][]plannedFault, pick uint64, t *chaosTable) error {
	plan := planned[k-1]
	defer func() { w.tool = 0 }()
	for try := 1; ; try++ {
		w.tool = w.f.tool * time.Duration(1<<(try-1))
		before := len(t.violations)
		if err := w.round(ctx, k, plan, pick+uint64(try-1), t); err != nil {
			return err
		}
		missed := t.lastMissed
		if len(missed) == 0 || len(t.violations) > before {
			return nil
		}
		if try == plannedTries {
			t.neverLanded = append(t.neverLanded, fmt.Sprintf("round %d: %s (%d tries)", k, strings.Join(missed, ", "), try))
			return nil
		}
		// Not missed yet: the next try may land it.
		for _, m := range missed {
			kind, _, _ := strings.Cut(m, "@")
			t.missed[kind]--
		}
		t.retried = append(t.retried, fmt.Sprintf("round %d, try %d: %s missed its point; run again with the slow tool call at %s",
			k, try, strings.Join(missed, ", "), w.f.tool*time.Duration(1<<try)))
		fmt.Fprintf(w.env.Stdout, "chaos: round %d: %s missed its point; running it again (try %d of %d)\n", k, strings.Join(missed, ", "), try+1, plannedTries)
	}
}
