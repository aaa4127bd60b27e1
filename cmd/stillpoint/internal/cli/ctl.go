package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/client"
)

// ctlFlags are the flags of the commands that call a bridge.
type ctlFlags struct {
	url       string
	tokenFile string
	json      bool
	timeout   time.Duration
}

func (f *ctlFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.url, "bridge", envOr("STILLPOINT_BRIDGE_URL", "http://127.0.0.1:7070"), "bridge API URL (env STILLPOINT_BRIDGE_URL)")
	cmd.Flags().StringVar(&f.tokenFile, "token-file", "", "file holding the API bearer token (else env STILLPOINT_BRIDGE_TOKEN)")
	cmd.Flags().BoolVar(&f.json, "json", false, "print the bridge's JSON answer")
	cmd.Flags().DurationVar(&f.timeout, "wait", 10*time.Minute, "give up waiting for the bridge after this long")
}

func (f *ctlFlags) client() (*client.Client, error) {
	token, err := bridgeToken(f.tokenFile)
	if err != nil {
		return nil, err
	}
	return client.New(f.url, token)
}

// ctl runs one call against the bridge and prints its result; failed
// results exit 1.
func ctl(g *globals, f *ctlFlags, call func(ctx context.Context, c *client.Client) (any, error)) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, _ []string) error {
		c, err := f.client()
		if err != nil {
			return &exitError{code: ExitUsage, err: err}
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), f.timeout)
		defer cancel()
		res, err := call(ctx, c)
		if err != nil {
			var ce *client.Error
			if errors.As(err, &ce) && ce.Status == 400 {
				return &exitError{code: ExitUsage, err: err}
			}
			return err
		}
		if f.json {
			enc := json.NewEncoder(g.stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(res)
		} else {
			printResult(g.stdout, res)
		}
		if failed(res) {
			return &exitError{code: ExitFailure}
		}
		return nil
	}
}

func failed(res any) bool {
	switch r := res.(type) {
	case *bridgeapi.CheckpointResult:
		return r.Status == bridgeapi.StatusFailed
	case *bridgeapi.RestoreResult:
		return r.Status == bridgeapi.StatusFailed
	case *bridgeapi.OpResult:
		return r.Status == bridgeapi.StatusFailed
	case *bridgeapi.BranchResult:
		return r.Status == bridgeapi.StatusFailed
	}
	return false
}

func printFailure(w io.Writer, f *bridgeapi.Failure) {
	if f == nil {
		return
	}
	fmt.Fprintf(w, "  failed in %s: %s\n", f.Phase, f.Reason)
	for _, e := range f.Errors {
		fmt.Fprintf(w, "  - %s: %s %s\n", e.Member, e.Code, e.Detail)
		if bs := f.Blockers[e.Member]; len(bs) > 0 {
			fmt.Fprintf(w, "      blockers (%d): %s\n", f.BlockerCount[e.Member], strings.Join(bs, ", "))
		}
	}
}

func printResult(w io.Writer, res any) {
	switch r := res.(type) {
	case *bridgeapi.CheckpointResult:
		fmt.Fprintf(w, "checkpoint %s of run %s: %s (epoch %d, %d members, prepare %d ms, commit %d ms)\n",
			r.CheckpointID, r.Run, r.Status, r.Epoch, len(r.Members), r.PrepareMS, r.CommitMS)
		if r.Status == bridgeapi.StatusCommitted {
			fmt.Fprintf(w, "  %d episodes continue, %d restart from their input", len(r.Continued), len(r.Restarted))
			if r.Stop {
				fmt.Fprint(w, "; the fleet is parked")
			}
			fmt.Fprintln(w)
		}
		printFailure(w, r.Failure)
	case *bridgeapi.RestoreResult:
		what := "restore"
		if r.Rejoin {
			what = "rejoin"
		}
		fmt.Fprintf(w, "%s %s of checkpoint %s: %s (epoch %d, %d members)\n", what, r.RestoreID, r.Source, r.Status, r.Epoch, len(r.Members))
		if r.Status == bridgeapi.StatusCompleted {
			fmt.Fprintf(w, "  %d episodes restored as their next attempt\n", len(r.Restored))
		} else {
			fmt.Fprintf(w, "  %d next attempts retired; those rollouts restart from their input\n", len(r.Retired))
		}
		printFailure(w, r.Failure)
	case *bridgeapi.OpResult:
		fmt.Fprintf(w, "%s %s: %s (%d members)\n", r.Phase, r.OpID, r.Status, len(r.Members))
		if r.Phase == "release" {
			fmt.Fprintf(w, "  kept %v, deleted %v\n", r.Keep, r.Deleted)
			for m, d := range r.MemberDeleted {
				fmt.Fprintf(w, "  %s deleted %d: %s\n", m, len(d), strings.Join(d, ", "))
			}
		}
		printFailure(w, r.Failure)
	case *bridgeapi.BranchResult:
		printBranch(w, r)
	case *bridgeapi.Status:
		fmt.Fprintf(w, "run %s: epoch %d, last phase %s of %s (seq %d)\n", r.Run, r.Epoch, r.LastPhase, r.LastCheckpoint, r.Seq)
		if r.Open != "" {
			fmt.Fprintf(w, "  open: %s\n", r.Open)
		}
		if r.Held != "" {
			fmt.Fprintf(w, "  held prepared: %s\n", r.Held)
		}
		if r.Latest != nil {
			fmt.Fprintf(w, "  LATEST: %s (epoch %d)\n", r.Latest.CheckpointID, r.Latest.Epoch)
		}
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "  CHECKPOINT\tEPOCH\tCREATED\tSTATE\tCONTINUED\tRESTARTED\tMEMBERS")
		for _, c := range r.Checkpoints {
			state := "committed"
			if c.Aborted {
				state = "aborted: " + c.Reason
			} else if c.Stop {
				state = "committed (stop)"
			}
			fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%d\t%d\t%d\n", c.CheckpointID, c.Epoch, c.Created.Format(time.RFC3339), state, c.Continued, c.Restarted, c.Members)
		}
		_ = tw.Flush()
		fmt.Fprintf(w, "  %d live members\n", len(r.Members))
		for _, m := range r.Members {
			fmt.Fprintf(w, "  - %s epoch %d served %v caps %v\n", m.Member, m.Epoch, m.Served, m.Capabilities)
		}
	}
}

func newCheckpointCmd(g *globals) *cobra.Command {
	var f ctlFlags
	var req bridgeapi.CheckpointRequest
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "checkpoint",
		Short: "Take a checkpoint of the run (through its bridge)",
		Long: `Ask the run's bridge for a checkpoint: prepare, commit, manifest, LATEST, resume.
It prints the result and exits 0 when the checkpoint committed, 1 when it failed
(naming every blocker and member), 2 on a bad request.`,
		Args: cobra.NoArgs,
		RunE: ctl(g, &f, func(ctx context.Context, c *client.Client) (any, error) {
			req.TimeoutMS = timeout.Milliseconds()
			return c.Checkpoint(ctx, req)
		}),
	}
	f.add(cmd)
	cmd.Flags().StringVar(&req.ID, "id", "", "checkpoint id (default: c-<UTC time>)")
	cmd.Flags().BoolVar(&req.Stop, "stop", false, "park the fleet once the checkpoint is durable and do not resume it")
	cmd.Flags().BoolVar(&req.Hold, "hold", false, "stop after prepare and keep the fleet parked until `commit-held` or `abort`")
	cmd.Flags().StringSliceVar(&req.Episodes, "episode", nil, "the controller's episodes (repeatable); default: all the members hold")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "deadline of each phase (default: the bridge's)")
	return cmd
}

func newRestoreCmd(g *globals) *cobra.Command {
	var f ctlFlags
	var req bridgeapi.RestoreRequest
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "restore",
		Short: "Restore a checkpoint (LATEST by default) into the run's fresh members",
		Long: `Restore a committed checkpoint into the members of the run that have not served yet
(a fresh fleet), as the next epoch. All or none: if any member fails, the next
attempts are retired everywhere and those rollouts restart from their input.
With --rejoin, restore LATEST into the agents and owners that came back fresh
while the rest of the fleet served on (a node that was down), in the run's
epoch: only what LATEST holds by those members alone, the rest left running.
Exits 0 when the restore completed, 1 when it failed.`,
		Args: cobra.NoArgs,
		RunE: ctl(g, &f, func(ctx context.Context, c *client.Client) (any, error) {
			req.TimeoutMS = timeout.Milliseconds()
			return c.Restore(ctx, req)
		}),
	}
	f.add(cmd)
	cmd.Flags().StringVar(&req.Source, "source", "", "checkpoint to restore (default: LATEST)")
	cmd.Flags().StringVar(&req.ID, "id", "", "restore operation id (default: restore-e<epoch>)")
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "deadline of the restore phase")
	cmd.Flags().BoolVar(&req.Rejoin, "rejoin", false, "restore LATEST into the members that came back only, keeping the epoch (id default: rejoin-<seq>)")
	cmd.Flags().StringSliceVar(&req.Episodes, "episodes", nil, "with --rejoin: only these episodes")
	return cmd
}

func newRetireCmd(g *globals) *cobra.Command {
	var f ctlFlags
	cmd := &cobra.Command{
		Use:   "retire EPISODE...",
		Short: "Refuse attempts (and earlier ones) on every member from now on",
		Args:  cobra.MinimumNArgs(1),
	}
	f.add(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return ctl(g, &f, func(ctx context.Context, c *client.Client) (any, error) { return c.Retire(ctx, args) })(cmd, args)
	}
	return cmd
}

func newForgetCmd(g *globals) *cobra.Command {
	var f ctlFlags
	cmd := &cobra.Command{
		Use:   "forget ROLLOUT...",
		Short: "Drop the refusal marks of rollouts finished for good",
		Args:  cobra.MinimumNArgs(1),
	}
	f.add(cmd)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return ctl(g, &f, func(ctx context.Context, c *client.Client) (any, error) { return c.Forget(ctx, args) })(cmd, args)
	}
	return cmd
}

func newReleaseCmd(g *globals) *cobra.Command {
	var f ctlFlags
	var req bridgeapi.ReleaseRequest
	cmd := &cobra.Command{
		Use:   "release",
		Short: "Delete snapshots, records and manifests that no kept checkpoint names",
		Long: `Release every checkpoint not kept: members delete the snapshots no kept checkpoint
names, and the bridge deletes the manifests and records. With neither --keep nor
--keep-latest it is the final release and leaves nothing of the run.`,
		Args: cobra.NoArgs,
		RunE: ctl(g, &f, func(ctx context.Context, c *client.Client) (any, error) { return c.Release(ctx, req) }),
	}
	f.add(cmd)
	cmd.Flags().StringSliceVar(&req.Keep, "keep", nil, "checkpoint to keep (repeatable)")
	cmd.Flags().IntVar(&req.KeepLatest, "keep-latest", 0, "also keep the newest N committed checkpoints")
	return cmd
}

func newCommitHeldCmd(g *globals) *cobra.Command {
	var f ctlFlags
	var stop, abort bool
	cmd := &cobra.Command{
		Use:   "commit-held CHECKPOINT",
		Short: "Commit (or with --abort, abandon) a checkpoint held prepared with --hold",
		Args:  cobra.ExactArgs(1),
	}
	f.add(cmd)
	cmd.Flags().BoolVar(&stop, "stop", false, "park the fleet once durable")
	cmd.Flags().BoolVar(&abort, "abort", false, "abandon the checkpoint and resume the fleet instead")
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		return ctl(g, &f, func(ctx context.Context, c *client.Client) (any, error) {
			if abort {
				return c.Abort(ctx, args[0])
			}
			return c.Commit(ctx, args[0], stop)
		})(cmd, args)
	}
	return cmd
}

func newStatusCmd(g *globals) *cobra.Command {
	var f ctlFlags
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the run as its bus records it: epoch, checkpoints, LATEST, members",
		Args:  cobra.NoArgs,
		RunE:  ctl(g, &f, func(ctx context.Context, c *client.Client) (any, error) { return c.Status(ctx) }),
	}
	f.add(cmd)
	return cmd
}
