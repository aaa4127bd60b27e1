package cli

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/client"
)

func newBranchCmd(g *globals) *cobra.Command {
	var f ctlFlags
	var req bridgeapi.BranchRequest
	var timeout time.Duration
	var output string
	cmd := &cobra.Command{
		Use:   "branch [--checkpoint C] [-n N] [--first K] [--seed S] ROLLOUT...",
		Short: "Fork rollouts of a checkpoint (LATEST by default) into N branches each",
		Long: `Branch rollouts that a committed checkpoint holds: each becomes N new rollouts
<rollout>.b<k>, forked from its state there, that continue beside the fleet (no
restore, no new epoch). Each branch gets a seed derived from the base seed, the
rollout and k, which its model calls carry. It prints one line per branch
(rollout, parent, seed, agent), and exits 0 when every branch was installed, 1
when the operation failed (its branches are then retired everywhere), 2 on a
bad request.`,
		Args: cobra.MinimumNArgs(1),
	}
	f.add(cmd)
	fl := cmd.Flags()
	fl.StringVar(&req.Source, "checkpoint", "", "checkpoint to branch from (default: LATEST)")
	fl.IntVarP(&req.N, "n", "n", 1, "branches of each rollout")
	fl.IntVar(&req.First, "first", 1, "number of the first branch (to add branches to a rollout branched before)")
	fl.Uint64Var(&req.Seed, "seed", 0, "base seed (default: drawn at random)")
	fl.StringVar(&req.ID, "id", "", "operation id (default: branch-<seq>)")
	fl.DurationVar(&timeout, "timeout", 0, "deadline of the branch phase (default: the bridge's)")
	fl.StringVar(&output, "output", "text", "text or json (json: as --json)")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		switch output {
		case "text":
		case "json":
			f.json = true
		default:
			return &exitError{code: ExitUsage, err: fmt.Errorf("--output %q: want text or json", output)}
		}
		req.Rollouts, req.TimeoutMS = args, timeout.Milliseconds()
		return ctl(g, &f, func(ctx context.Context, c *client.Client) (any, error) { return c.Branch(ctx, req) })(cmd, args)
	}
	return cmd
}

// printBranch prints a branch result: a line of its status, then one line
// per branch.
func printBranch(w io.Writer, r *bridgeapi.BranchResult) {
	fmt.Fprintf(w, "branch %s of checkpoint %s: %s (%d branches, base seed %d)\n", r.OpID, r.Source, r.Status, len(r.Branches), r.Seed)
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "  ROLLOUT\tPARENT\tSEED\tAGENT")
	for _, b := range r.Branches {
		agent := string(r.Agents[b.Episode.Rollout])
		if agent == "" {
			agent = "-"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\n", b.Episode.Rollout, b.Parent, b.Seed, agent)
	}
	_ = tw.Flush()
	if r.Status == bridgeapi.StatusFailed {
		fmt.Fprintf(w, "  retired everywhere: %v\n", r.Retired)
	}
	printFailure(w, r.Failure)
}
