package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/agent"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// trajectoryFlags are the flags of `stillpoint trajectory`.
type trajectoryFlags struct {
	run, rollout, format, output string
}

func newTrajectoryCmd(g *globals) *cobra.Command {
	var f trajectoryFlags
	cmd := &cobra.Command{
		Use:   "trajectory",
		Short: "Print or export a run's trajectories: every model call of each rollout, with its tokens",
		Long: `Read the trajectories a run's agents stored (each agent with credentials of its own
in its own store, sp_trajectories_<run>_agent_<name>, the others and earlier runs in
the shared sp_trajectories; no release deletes them) and print them, one rollout
after another, or write one file per rollout into --output. A rollout stored more
than once (an attempt sent again to another agent) gives the newest.

--format jsonl (the default) is one line per rollout as a trainer reads it: the merged
chain of its calls (prompt_ids, response_ids, response_mask, response_logprobs), the
reward its grade gave, the check of its lineage, every sequence a rewrite or a token
break started, and the per-call records as the capture stored them. --format atif is
one JSON document per rollout in the shape of Harbor's ATIF v1.4 (steps, with the
token ids and logprobs in each agent step's metrics). docs/TRAJECTORIES.md documents
both.`,
		Example: `  stillpoint trajectory --run demo --format jsonl
  stillpoint trajectory --run train-7 --rollout r42 --format atif`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := events.ValidateRun(f.run); err != nil {
				return &exitError{code: ExitUsage, err: fmt.Errorf("--run: %w", err)}
			}
			if f.format != "jsonl" && f.format != "atif" {
				return &exitError{code: ExitUsage, err: fmt.Errorf("--format %q: want jsonl or atif", f.format)}
			}
			bus, _, closeBus, err := openBus(cmd.Context(), g, "stillpoint-trajectory", 1)
			if err != nil {
				return err
			}
			defer closeBus()
			return exportTrajectories(cmd.Context(), bus, f, g.stdout)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.run, "run", env("STILLPOINT_RUN"), "run id (env STILLPOINT_RUN)")
	fl.StringVar(&f.rollout, "rollout", "", "only this rollout")
	fl.StringVar(&f.format, "format", "jsonl", "jsonl (a trainer's line per rollout) or atif")
	fl.StringVar(&f.output, "output", "", "write <rollout>.jsonl (or .atif.json) per rollout into this directory instead of printing")
	return cmd
}

// RolloutTrajectory is one rollout's trajectory as `stillpoint trajectory
// --format jsonl` prints it.
type RolloutTrajectory struct {
	Run     string `json:"run"`
	Rollout string `json:"rollout"`
	Object  string `json:"object"`
	// Bucket is the store it was read from: an agent's own
	// (events.TrajectoriesBucket), or none for the shared sp_trajectories.
	Bucket string `json:"bucket,omitempty"`
	SHA256 string `json:"sha256"`
	Bytes  int64  `json:"bytes"`
	// ConversationBytes is what the last chain holds once
	// (trajectory.ConversationBytes): Bytes against it is the capture's
	// overhead.
	ConversationBytes int64 `json:"conversation_bytes"`
	// Reward is the verdict's reward, when its grade gave a number;
	// Verdict the whole verdict.
	Reward  *float64        `json:"reward"`
	Verdict json.RawMessage `json:"verdict,omitempty"`
	// The merged chain of the rollout's last call (trajectory.Sequence).
	PromptIDs        []int     `json:"prompt_ids"`
	ResponseIDs      []int     `json:"response_ids"`
	ResponseMask     []int     `json:"response_mask"`
	ResponseLogprobs []float64 `json:"response_logprobs"`
	// Sequences are every chain (more than one when a rewrite or a token
	// break started another); Check is the lineage's check; Calls the
	// records as the capture stored them (each a delta against its
	// parent).
	Sequences []trajectory.Sequence `json:"sequences"`
	Check     trajectory.Report     `json:"check"`
	Calls     []*trajectory.Call    `json:"calls"`
}

// exportTrajectories writes the trajectories of f.run (one rollout's with
// f.rollout) in f.format, to out or one file per rollout in f.output. They
// are in the shared store and in the run's agents' own
// (jetstream.TrajectoryStores); of a rollout stored in more than one (an
// attempt sent again to another agent), the newest is taken, as the later
// attempt's rewrite of the shared store's object was.
func exportTrajectories(ctx context.Context, bus *jetstream.Bus, f trajectoryFlags, out io.Writer) error {
	own, err := jetstream.TrajectoryStores(ctx, bus.JS, f.run)
	if err != nil {
		return err
	}
	type stored struct {
		store natsjs.ObjectStore
		info  *natsjs.ObjectInfo
	}
	newest := map[string]stored{}
	prefix := f.run + "/"
	for _, store := range append([]natsjs.ObjectStore{bus.Trajectories}, own...) {
		infos, err := store.List(ctx)
		if errors.Is(err, natsjs.ErrNoObjectsFound) {
			infos, err = nil, nil
		}
		if err != nil {
			return fmt.Errorf("list the trajectories: %w", err)
		}
		for _, info := range infos {
			if info.Deleted || !strings.HasPrefix(info.Name, prefix) {
				continue
			}
			if f.rollout != "" && info.Name != agent.TrajectoryObject(f.run, f.rollout) {
				continue
			}
			if have, ok := newest[info.Name]; !ok || info.ModTime.After(have.info.ModTime) {
				newest[info.Name] = stored{store, info}
			}
		}
	}
	names := slices.Sorted(maps.Keys(newest))
	if len(names) == 0 {
		what := "run " + f.run
		if f.rollout != "" {
			what = "rollout " + f.rollout + " of " + what
		}
		return &exitError{code: 1, err: fmt.Errorf("no trajectory of %s", what)}
	}
	if f.output != "" {
		if err := os.MkdirAll(f.output, 0o755); err != nil {
			return err
		}
	}
	for _, name := range names {
		st := newest[name]
		rt, x, err := readTrajectory(ctx, st.store, f.run, name)
		if err != nil {
			return err
		}
		if b := st.info.Bucket; b != jetstream.BucketTrajectories {
			rt.Bucket = b
		}
		var b []byte
		ext := ".jsonl"
		if f.format == "atif" {
			b, err = json.MarshalIndent(atif(rt, x), "", "  ")
			ext = ".atif.json"
		} else {
			b, err = json.Marshal(rt)
		}
		if err != nil {
			return err
		}
		b = append(b, '\n')
		if f.output == "" {
			if _, err := out.Write(b); err != nil {
				return err
			}
			continue
		}
		if err := os.WriteFile(filepath.Join(f.output, rt.Rollout+ext), b, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// readTrajectory reads object name and builds its RolloutTrajectory.
func readTrajectory(ctx context.Context, store natsjs.ObjectStore, run, name string) (RolloutTrajectory, *trajectory.Index, error) {
	res, err := store.Get(ctx, name)
	if err != nil {
		return RolloutTrajectory{}, nil, fmt.Errorf("read %s: %w", name, err)
	}
	defer res.Close()
	data, err := io.ReadAll(res)
	if err != nil {
		return RolloutTrajectory{}, nil, fmt.Errorf("read %s: %w", name, err)
	}
	info, _ := res.Info()
	x, err := trajectory.Read(bytes.NewReader(data))
	if err != nil {
		return RolloutTrajectory{}, nil, fmt.Errorf("%s: %w", name, err)
	}
	rt := RolloutTrajectory{Run: run, Rollout: strings.TrimSuffix(strings.TrimPrefix(name, run+"/"), ".jsonl"), Object: name, Bytes: int64(len(data))}
	sum := sha256.Sum256(data)
	rt.SHA256 = hex.EncodeToString(sum[:])
	if info != nil {
		// The agent names the bytes it stored (as the rollout's result
		// does): others are not its trajectory.
		if want := info.Metadata["sha256"]; want != rt.SHA256 {
			return RolloutTrajectory{}, nil, fmt.Errorf("%s: sha256 %s, but the agent stored %q: not the rollout's trajectory", name, rt.SHA256, want)
		}
		if v := info.Metadata["verdict"]; v != "" && json.Valid([]byte(v)) {
			rt.Verdict = json.RawMessage(v)
			var r struct {
				Reward *float64 `json:"reward"`
			}
			if json.Unmarshal(rt.Verdict, &r) == nil {
				rt.Reward = r.Reward
			}
		}
	}
	calls := x.Calls()
	rt.Check = trajectory.Check(calls)
	rt.Sequences = trajectory.Chains(calls)
	if n := len(rt.Sequences); n > 0 {
		last := rt.Sequences[n-1]
		rt.PromptIDs, rt.ResponseIDs, rt.ResponseMask, rt.ResponseLogprobs = last.PromptIDs, last.ResponseIDs, last.ResponseMask, last.ResponseLogprobs
	}
	rt.ConversationBytes = trajectory.ConversationBytes(calls, rt.Sequences)
	for _, c := range calls {
		rt.Calls = append(rt.Calls, c.Call)
	}
	return rt, x, nil
}

// atif returns rt in the shape of an ATIF v1.4 trajectory: a step per
// message the final chain's calls added, the model's replies as agent
// steps with their token ids and logprobs in metrics.
func atif(rt RolloutTrajectory, x *trajectory.Index) map[string]any {
	calls := x.Calls()
	byID := map[string]trajectory.Whole{}
	for _, c := range calls {
		byID[c.ID] = c
	}
	var chain []string
	if n := len(rt.Sequences); n > 0 {
		chain = rt.Sequences[n-1].Calls
	}
	var steps []map[string]any
	seen := 0
	for _, id := range chain {
		c := byID[id]
		for _, m := range c.AllMessages[min(seen, len(c.AllMessages)):] {
			var msg map[string]any
			_ = json.Unmarshal(m, &msg)
			source := "user"
			switch msg["role"] {
			case "system", "developer":
				source = "system"
			case "assistant":
				continue // the reply's own step holds it
			case "tool":
				source = "environment"
			}
			steps = append(steps, map[string]any{"step_id": len(steps) + 1, "source": source, "message": msg["content"]})
		}
		var reply map[string]any
		_ = json.Unmarshal(c.Reply, &reply)
		step := map[string]any{"step_id": len(steps) + 1, "source": "agent", "message": reply["content"], "model_name": c.Model,
			"extra": map[string]any{"call_id": c.ID, "parent": c.Parent, "link": c.Link}}
		if tc, ok := reply["tool_calls"]; ok {
			step["tool_calls"] = tc
		}
		if c.Tokens {
			step["metrics"] = map[string]any{"prompt_token_ids": c.AllPromptIDs, "completion_token_ids": c.CompletionIDs, "logprobs": c.Logprobs}
		}
		steps = append(steps, step)
		seen = len(c.AllMessages) + 1
	}
	out := map[string]any{"schema_version": "ATIF-v1.4", "session_id": rt.Rollout, "agent": map[string]any{"name": "stillpoint"}, "steps": steps}
	if rt.Reward != nil {
		out["final_metrics"] = map[string]any{"reward": *rt.Reward}
	}
	return out
}
