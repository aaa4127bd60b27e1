package chaos

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/events"
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

// plannedFault is one fault of a round: its kind, the phase it waits for
// after its delay (the bridge's: its failpoint), and whom it hits.
type plannedFault struct {
	kind      string
	phase     events.Phase
	after     time.Duration
	failpoint string
}

// parsePlan parses --plan: nil when it is empty.
func parsePlan(plan string) ([][]plannedFault, error) {
	if strings.TrimSpace(plan) == "" {
		return nil, nil
	}
	var out [][]plannedFault
	for r := range strings.SplitSeq(plan, ",") {
		var round []plannedFault
		for f := range strings.SplitSeq(strings.TrimSpace(r), "+") {
			kind, at, ok := strings.Cut(f, "@")
			switch {
			case !ok || !slices.Contains(Faults, kind):
				return nil, fmt.Errorf("%w: --plan: %q: want kind@phase or bridge@<failpoint>, kind one of %s", ErrUsage, f, strings.Join(Faults, ","))
			case kind == FaultBridge && !slices.Contains(BridgeFailpoints, "bridge/"+at):
				return nil, fmt.Errorf("%w: --plan: %q: the bridge's failpoints are %s", ErrUsage, f, strings.Join(BridgeFailpoints, ", "))
			case kind != FaultBridge && !slices.Contains(chaosPhases, events.Phase(at)):
				return nil, fmt.Errorf("%w: --plan: %q: the phases are %v", ErrUsage, f, chaosPhases)
			}
			p := plannedFault{kind: kind, phase: events.Phase(at)}
			if kind == FaultBridge {
				p.phase, p.failpoint = "", "bridge/"+at
			}
			round = append(round, p)
		}
		if err := checkPreempts(round); err != nil {
			return nil, fmt.Errorf("%w: --plan: %v", ErrUsage, err)
		}
		out = append(out, round)
	}
	return out, nil
}

func (p plannedFault) String() string {
	if p.kind == FaultBridge {
		return p.kind + "@" + strings.TrimPrefix(p.failpoint, "bridge/")
	}
	return fmt.Sprintf("%s@%s", p.kind, p.phase)
}
