package collect

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Counts are the collection's live tallies.
type Counts struct {
	Done, Running, Paused, Queued, Failed, Total int
}

// Counts returns the live tallies.
func (c *Collector) Counts() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := Counts{Done: len(c.done), Running: len(c.inflight), Queued: len(c.queue), Total: len(c.byID)}
	for _, r := range c.done {
		if !r.OK {
			n.Failed++
		}
	}
	if c.ckptOpen {
		n.Paused, n.Running = n.Running, 0
	}
	return n
}

// progress redraws a status line on cfg.Progress (a terminal) until the
// returned stop is called.
func (c *Collector) progress(ctx context.Context) (stop func()) {
	if c.cfg.Progress == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := c.tick
		if tick == 0 {
			tick = 250 * time.Millisecond
		}
		t := time.NewTicker(tick)
		defer t.Stop()
		for {
			c.drawLine()
			select {
			case <-ctx.Done():
				c.drawLine()
				fmt.Fprintln(c.cfg.Progress)
				return
			case <-t.C:
			case <-c.redrawNow:
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }
}

// redraw asks for the live line to be drawn now; it never blocks.
func (c *Collector) redraw() {
	select {
	case c.redrawNow <- struct{}{}:
	default:
	}
}

func (c *Collector) drawLine() {
	n := c.Counts()
	c.mu.Lock()
	var committed int
	var last CheckpointStat
	for _, s := range c.sum.Checkpoints {
		if s.Status == "committed" {
			committed++
			last = s
		}
	}
	open, event := c.ckptOpen, c.lastEvent
	c.mu.Unlock()
	line := fmt.Sprintf("%d/%d done  %d running  %d paused  %d queued  %d failed  |  %d checkpoints",
		n.Done, n.Total, n.Running, n.Paused, n.Queued, n.Failed, committed)
	if committed > 0 {
		line += fmt.Sprintf(" (last: prepare %d ms, commit %d ms)", last.PrepareMS, last.CommitMS)
	}
	if open {
		line += "  checkpointing…"
	}
	if event != "" {
		line += "  |  " + event
	}
	fmt.Fprintf(c.cfg.Progress, "\r\033[K%s", line)
}

// WriteSummary writes the summary table of a collection.
func WriteSummary(w io.Writer, s Summary) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "rollouts\t%d\n", s.Rollouts)
	fmt.Fprintf(tw, "results\t%d (%d graded, %d failed, %d infra_failed)\n", s.Results, s.Results-s.Failed, s.Failed-s.InfraFailed, s.InfraFailed)
	if s.InfraRetried > 0 {
		fmt.Fprintf(tw, "attempts an infrastructure fault ended\t%d (each sent again)\n", s.InfraRetried)
	}
	fmt.Fprintf(tw, "continued in place\t%d\n", s.ContinuedInPlace)
	fmt.Fprintf(tw, "relaunched on a saved session\t%d\n", s.Relaunched)
	fmt.Fprintf(tw, "restored from a checkpoint\t%d\n", s.Restored)
	if len(s.Rebinds) > 0 {
		fmt.Fprintf(tw, "restored launches re-bound\t%s\n", rebindLine(s.Rebinds))
	}
	rejoins := ""
	if len(s.Rejoins) > 0 {
		rejoins = fmt.Sprintf("; rejoins: %v", s.Rejoins)
	}
	fmt.Fprintf(tw, "recoveries\t%d (restores: %v%s; attempts retired: %d)\n", s.Recoveries, s.Restores, rejoins, s.Retired)
	fmt.Fprintf(tw, "elapsed\t%s\n", s.Elapsed.Round(time.Millisecond))
	_ = tw.Flush()
	writeBranches(w, s)
	if len(s.Checkpoints) == 0 {
		return
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "checkpoint\tstatus\tprepare ms\tcommit ms\tcontinued\tnote")
	for _, c := range s.Checkpoints {
		note := c.Reason
		if c.Carried+c.Retired > 0 {
			note = strings.TrimSpace(fmt.Sprintf("%d carried, %d retired %s", c.Carried, c.Retired, note))
		}
		if c.Stop {
			note = "stop " + note
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\n", c.ID, c.Status, c.PrepareMS, c.CommitMS, c.Continued, note)
	}
	_ = tw.Flush()
	if cs := s.Committed(); len(cs) > 0 {
		prep := make([]int64, 0, len(cs))
		commit := make([]int64, 0, len(cs))
		for _, c := range cs {
			prep, commit = append(prep, c.PrepareMS), append(commit, c.CommitMS)
		}
		fmt.Fprintf(w, "prepare p50 %d ms, max %d ms; commit p50 %d ms, max %d ms\n", p50(prep), slices.Max(prep), p50(commit), slices.Max(commit))
	}
}

// writeBranches writes the branches a collection adopted, each with its
// parent, seed, outcome and reward.
func writeBranches(w io.Writer, s Summary) {
	if len(s.Branches) == 0 && s.BranchesFailed == 0 {
		return
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "branch\tof\tfrom\tseed\toutcome\treward")
	for _, b := range s.Branches {
		reward := "-"
		if b.Reward != nil {
			reward = strconv.FormatFloat(*b.Reward, 'g', -1, 64)
		}
		outcome := b.Outcome
		if outcome == "" {
			outcome = "running"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", b.RolloutID, b.BranchOf, b.Source, b.Seed, outcome, reward)
	}
	_ = tw.Flush()
	if s.BranchesFailed > 0 {
		fmt.Fprintf(w, "branches of failed branch operations: %d (retired; their parents went on)\n", s.BranchesFailed)
	}
}

func p50(v []int64) int64 {
	s := slices.Clone(v)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// rebindLine writes the re-bind outcomes, sorted by name: "resumed_in_place
// 3, relay_gone 1".
func rebindLine(m map[string]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}
