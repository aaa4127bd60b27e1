package chaos

import (
	"fmt"
	"io"
	"time"
)

// chaosTable is what the rounds did, for the table at the end.
type chaosTable struct {
	rounds     int
	injected   map[string]int // by kind
	missed     map[string]int // drawn, but the round ended first
	committed  int
	aborted    int
	restores   int
	rollouts   int
	finished   int
	violations []string // "round k: n. name: detail"
	// lastMissed names the faults of the last round that missed their
	// point ("kind@point"); retried lists the rounds run again for them,
	// neverLanded the faults that missed on every try.
	lastMissed  []string
	retried     []string
	neverLanded []string
}

// write prints the table.
func (t *chaosTable) write(w io.Writer, f chaosFlags, took time.Duration) {
	per := fmt.Sprintf("%d faults a round", f.perRound)
	if f.plan != "" {
		per = "the faults of --plan"
	}
	fmt.Fprintf(w, "chaos: seed %d, %s, %d rounds of %d rollouts, %s\n", f.seed, took.Round(time.Second), t.rounds, f.rollouts, per)
	fmt.Fprintf(w, "  %-26s %8s %8s\n", "fault", "injected", "missed")
	total := 0
	for _, k := range Faults {
		if t.injected[k] == 0 && t.missed[k] == 0 {
			continue
		}
		fmt.Fprintf(w, "  %-26s %8d %8d\n", k, t.injected[k], t.missed[k])
		total += t.injected[k]
	}
	fmt.Fprintf(w, "  %-26s %8d\n", "faults injected", total)
	for _, r := range t.retried {
		fmt.Fprintf(w, "    retried: %s\n", r)
	}
	for _, n := range t.neverLanded {
		fmt.Fprintf(w, "    never landed: %s\n", n)
	}
	fmt.Fprintf(w, "  %-26s %8d\n", "checkpoints committed", t.committed)
	fmt.Fprintf(w, "  %-26s %8d\n", "checkpoints aborted", t.aborted)
	fmt.Fprintf(w, "  %-26s %8d\n", "restores", t.restores)
	fmt.Fprintf(w, "  %-26s %8d of %d\n", "rollouts finished", t.finished, t.rollouts)
	fmt.Fprintf(w, "  %-26s %8d\n", "invariant violations", len(t.violations))
	for _, v := range t.violations {
		fmt.Fprintf(w, "    %s\n", v)
	}
}
