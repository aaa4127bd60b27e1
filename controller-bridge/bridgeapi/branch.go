package bridgeapi

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strings"

	"github.com/stillpoint/stillpoint/events"
)

// BranchRequest asks to fork rollouts of a committed checkpoint into
// branches that continue beside the fleet (PROTOCOL §5, Branch).
type BranchRequest struct {
	// Source is the checkpoint to branch from; empty means LATEST.
	Source string `json:"source_checkpoint_id,omitempty"`
	// Rollouts are the rollouts to branch; each must be one the source
	// holds with progress (continued or carried).
	Rollouts []string `json:"rollouts"`
	// N is the number of branches of each rollout, 1 or more; N times the
	// rollouts is at most events.MaxBranches.
	N int `json:"n"`
	// First is the number of the first branch (0: 1), so that a second
	// operation on the same rollout makes new branch ids.
	First int `json:"first,omitempty"`
	// Seed is the base seed (0: drawn at random); branch k of rollout r
	// gets BranchSeed(Seed, r, k).
	Seed uint64 `json:"seed,omitempty"`
	// ID is the operation's id; empty picks branch-<seq>.
	ID string `json:"branch_id,omitempty"`
	// TimeoutMS is the branch phase's deadline from its publish (0: the
	// bridge's default).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Attempt is the branches' attempt (0: each parent's next). A
	// controller makes a branch again at a later attempt when the first
	// was lost before any checkpoint held it (its earlier attempts
	// retired first).
	Attempt int `json:"attempt,omitempty"`
}

// FirstK returns the number of the first branch.
func (r BranchRequest) FirstK() int {
	if r.First == 0 {
		return 1
	}
	return r.First
}

// Validate returns nil for a valid request, else an error wrapping
// ErrBadRequest that names every field that is wrong.
func (r BranchRequest) Validate() error {
	var errs []error
	if r.Source != "" {
		if err := events.ValidateCheckpointID(r.Source); err != nil {
			errs = append(errs, fmt.Errorf("source_checkpoint_id: %w", err))
		}
	}
	if len(r.Rollouts) == 0 {
		errs = append(errs, errors.New("rollouts: at least one rollout"))
	}
	seen := map[string]bool{}
	for i, ro := range r.Rollouts {
		if err := events.ValidateRollout(fmt.Sprintf("rollouts[%d]", i), ro); err != nil {
			errs = append(errs, err)
			break
		}
		if seen[ro] {
			errs = append(errs, fmt.Errorf("rollouts[%d]: %s appears twice", i, ro))
			break
		}
		seen[ro] = true
	}
	switch {
	case r.N < 1:
		errs = append(errs, fmt.Errorf("n: %d, want 1 or more", r.N))
	case len(r.Rollouts) > 0 && r.N > events.MaxBranches/len(r.Rollouts):
		errs = append(errs, fmt.Errorf("n: %d branches of %d rollouts is over the limit of %d", r.N, len(r.Rollouts), events.MaxBranches))
	}
	if r.First < 0 || r.First > events.MaxBranches*events.MaxBranches-r.N {
		errs = append(errs, fmt.Errorf("first: %d, want 1 or more (0: 1) and first+n-1 at most %d", r.First, events.MaxBranches*events.MaxBranches))
	}
	if r.ID != "" {
		if err := events.ValidateCheckpointID(r.ID); err != nil {
			errs = append(errs, fmt.Errorf("branch_id: %w", err))
		} else if !strings.HasPrefix(r.ID, "branch-") {
			// The run's phases are told apart by their operation's id: a
			// branch's must not read as a checkpoint's or another's.
			errs = append(errs, fmt.Errorf("branch_id: %q must start with branch-", r.ID))
		}
	}
	if r.TimeoutMS < 0 {
		errs = append(errs, errors.New("timeout_ms: negative"))
	}
	if r.Attempt < 0 {
		errs = append(errs, fmt.Errorf("attempt: %d is negative", r.Attempt))
	}
	return badRequest(errs...)
}

// BranchSeed is the seed of branch k of rollout: the first 8 bytes, as a
// big-endian uint64, of sha256(base || rollout || k), base and k as 8
// bytes big-endian each (so no two rollout, k pairs share an input),
// with its top bit cleared: model servers take a seed as an int64.
func BranchSeed(base uint64, rollout string, k int) uint64 {
	buf := make([]byte, 0, 16+len(rollout))
	buf = binary.BigEndian.AppendUint64(buf, base)
	buf = append(buf, rollout...)
	buf = binary.BigEndian.AppendUint64(buf, uint64(k))
	sum := sha256.Sum256(buf)
	return binary.BigEndian.Uint64(sum[:8]) & math.MaxInt64
}

// BranchResult is the result of a branch operation.
type BranchResult struct {
	Run  string `json:"run"`
	OpID string `json:"op_id"`
	// Source is the checkpoint branched from.
	Source string `json:"source_checkpoint_id"`
	// Status is completed or failed.
	Status string `json:"status"`
	// Seed is the base seed the branches' seeds derive from.
	Seed uint64 `json:"seed"`
	// Branches are the branches, in the order of the request's rollouts,
	// then k.
	Branches []events.BranchSpec `json:"branches"`
	// Members are the members the branch phase addressed: the holders of
	// the parents.
	Members []events.Member `json:"members"`
	// Agents names, for each branch rollout, the agent that continues it
	// (completed only).
	Agents map[string]events.Member `json:"agents,omitempty"`
	// Failure says why it failed; Retired are then the branch episodes
	// retired on every member.
	Failure *Failure `json:"failure,omitempty"`
	Retired []string `json:"retired,omitempty"`
}
