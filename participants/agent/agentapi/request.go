package agentapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// Request asks for one rollout.
type Request struct {
	RolloutID string          `json:"rollout_id"`
	Attempt   int             `json:"attempt"`
	Task      json.RawMessage `json:"task"`
	// SentTo, on a request asked again, is the instance of the agent
	// process the attempt was sent to before. Another process of the
	// agent's name that holds nothing of the attempt (no restore installed
	// it) refuses it with CodeAttemptLost: its predecessor may have made
	// model calls that a run from the task would make again.
	SentTo string `json:"sent_to,omitempty"`
}

// Validate checks the request's ids and task; the errors, joined, wrap
// events.ErrInvalid.
func (r Request) Validate() error {
	var errs []error
	if err := events.ValidateRollout("rollout_id", r.RolloutID); err != nil {
		errs = append(errs, err)
	}
	if r.Attempt < 0 {
		errs = append(errs, fmt.Errorf("%w: attempt %d is negative", events.ErrInvalid, r.Attempt))
	}
	if t := bytes.TrimSpace(r.Task); len(t) == 0 || bytes.Equal(t, []byte("null")) || !json.Valid(t) {
		errs = append(errs, fmt.Errorf("%w: task: required, a JSON value", events.ErrInvalid))
	}
	return errors.Join(errs...)
}

// Result is a verified rollout.
type Result struct {
	RolloutID string `json:"rollout_id"`
	Attempt   int    `json:"attempt"`
	// Episode is the episode key, <rollout> or <rollout>-a<attempt>.
	Episode string `json:"episode"`
	// Adapter names the harness adapter.
	Adapter string `json:"adapter"`
	// Answer is what the harness answered; Verdict the owner's grade.
	Answer  json.RawMessage `json:"answer,omitempty"`
	Verdict json.RawMessage `json:"verdict,omitempty"`
	// Restart tells a rollout nothing could save (restarted from its input
	// after a crash); Restored one that continued from a checkpoint.
	Restart  bool `json:"restart,omitempty"`
	Restored bool `json:"restored,omitempty"`
	// Launches is the launch log.
	Launches []LaunchRecord `json:"launches"`
	// Trajectory names the rollout's trajectory, every model call it made
	// (docs/TRAJECTORIES.md); nil when it has none, and NoTrajectory says
	// why (the owner runs no relay, so the harness called the model
	// directly).
	Trajectory   *TrajectoryRef `json:"trajectory,omitempty"`
	NoTrajectory string         `json:"no_trajectory,omitempty"`
}

// TrajectoryRef names a rollout's trajectory in a trajectories store: the
// capture file of its sandbox as it was when the rollout ended.
type TrajectoryRef struct {
	// Object is its name in the store, <run>/<rollout>.jsonl.
	Object string `json:"object"`
	// Bucket is the store that holds Object: the own store of the agent
	// that stored it (events.TrajectoriesBucket of its run), for an agent
	// with credentials of its own; "" for the shared
	// jetstream.BucketTrajectories (an agent without, and every result
	// written before agents had stores of their own).
	Bucket string `json:"bucket,omitempty"`
	// SHA256 and Bytes are the file's; Calls counts its records.
	SHA256 string `json:"sha256"`
	Bytes  int64  `json:"bytes"`
	Calls  int    `json:"calls"`
	// Check is what trajectory.Check found in it.
	Check trajectory.Report `json:"check"`
	// Branch, for a branch's trajectory, names its branch point: the file
	// is the fork's capture, the parent's calls up to the snapshot (the
	// first At calls), then the branch's own.
	Branch *TrajectoryBranch `json:"branch,omitempty"`
}

// TrajectoryBranch is the branch header of a branch's trajectory.
type TrajectoryBranch struct {
	// Parent is the parent's rollout id; ParentEpisode its capture key.
	Parent        string `json:"parent"`
	ParentEpisode string `json:"parent_episode"`
	// K is the branch's number and Seed its sampling seed.
	K    int    `json:"k"`
	Seed uint64 `json:"seed"`
	// Source is the checkpoint the branch was forked from.
	Source string `json:"source_checkpoint_id"`
	// At is the number of calls the branch inherited: the parent's calls
	// at the head of the file, before the branch's first.
	At int `json:"at"`
}

// clone returns a copy of t that shares no slice with it (nil for nil).
func (t *TrajectoryRef) clone() *TrajectoryRef {
	if t == nil {
		return nil
	}
	c := *t
	c.Check.Problems = slices.Clone(t.Check.Problems)
	if t.Branch != nil {
		b := *t.Branch
		c.Branch = &b
	}
	return &c
}

// validate checks t as rollout's: its object is <run>/<rollout>.jsonl, its
// bucket none or an agent's own store of that run, its digest a sha256 in
// hex, its counts not negative.
func (t *TrajectoryRef) validate(rollout string) error {
	run, name, ok := strings.Cut(t.Object, "/")
	var errs []error
	if !ok || events.ValidateRun(run) != nil || name != rollout+".jsonl" {
		errs = append(errs, fmt.Errorf("object %.80q is not <run>/%s.jsonl", t.Object, rollout))
	}
	if t.Bucket != "" {
		agent, ok := strings.CutPrefix(t.Bucket, events.TrajectoriesBucketPrefix(run)+string(events.KindAgent)+"_")
		if !ok || events.ValidateToken("agent", agent) != nil {
			errs = append(errs, fmt.Errorf("bucket %.80q is not an agent's trajectories store of run %.40q", t.Bucket, run))
		}
	}
	if len(t.SHA256) != 64 || strings.Trim(t.SHA256, "0123456789abcdef") != "" {
		errs = append(errs, fmt.Errorf("sha256 %.80q is not 64 hex digits", t.SHA256))
	}
	if t.Bytes < 0 || t.Calls < 0 {
		errs = append(errs, fmt.Errorf("bytes %d and calls %d: negative", t.Bytes, t.Calls))
	}
	if b := t.Branch; b != nil {
		if b.K < 1 || events.BranchRollout(b.Parent, b.K) != rollout {
			errs = append(errs, fmt.Errorf("branch: %d of parent %.80q is not %s", b.K, b.Parent, rollout))
		}
		if p, err := events.ParseEpisode(b.ParentEpisode); err != nil || p.Rollout != b.Parent {
			errs = append(errs, fmt.Errorf("branch: parent_episode %.80q is not an episode of %.80q", b.ParentEpisode, b.Parent))
		}
		if b.At < 0 || b.At > t.Calls {
			errs = append(errs, fmt.Errorf("branch: at %d: want 0 to the %d calls", b.At, t.Calls))
		}
	}
	return errors.Join(errs...)
}
