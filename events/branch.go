package events

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// MaxBranches bounds the branches of one branch operation, over all its
// parents.
const MaxBranches = 256

// BranchRollout is the rollout id of branch k (from 1) of rollout: its id
// with ".b<k>" appended.
func BranchRollout(rollout string, k int) string {
	return rollout + ".b" + strconv.Itoa(k)
}

// ParseBranchRollout splits a branch's rollout id into its parent's and
// its number; ok is false for a rollout that is no branch.
func ParseBranchRollout(rollout string) (parent string, k int, ok bool) {
	i := strings.LastIndex(rollout, ".b")
	if i <= 0 {
		return "", 0, false
	}
	n, err := strconv.Atoi(rollout[i+2:])
	if err != nil || n < 1 || rollout[i+2] == '0' {
		return "", 0, false
	}
	return rollout[:i], n, true
}

// BranchSpec is one branch of a branch operation: the checkpointed episode
// it forks, and the new episode it continues as.
type BranchSpec struct {
	// Parent is the episode the source checkpoint holds.
	Parent Episode `json:"parent"`
	// K is the branch's number, from 1, among its parent's branches.
	K int `json:"k"`
	// Episode is the branch's own: rollout BranchRollout(Parent.Rollout,
	// K), attempt Parent.Next().Attempt (it continues from the parent's
	// bookmark, as a restored attempt would), or a later one for a branch
	// made again from the same source after its first was lost before
	// any checkpoint held it.
	Episode Episode `json:"episode"`
	// Seed is the branch's sampling seed: its model calls carry it, so
	// that an upstream sampler diverges.
	Seed uint64 `json:"seed"`
	// Holders are the members that hold the parent in the source (its
	// agent, and its owner when it has a sandbox): each must install the
	// branch for the operation to complete.
	Holders []Member `json:"holders,omitempty"`
}

// NewBranchSpec builds branch k of parent with seed.
func NewBranchSpec(parent Episode, k int, seed uint64) BranchSpec {
	return BranchSpec{Parent: parent, K: k, Seed: seed,
		Episode: Episode{Rollout: BranchRollout(parent.Rollout, k), Attempt: parent.Next().Attempt}}
}

// Again returns b made again at attempt (at least its own): a branch lost
// before any checkpoint held it, forked once more from its source.
func (b BranchSpec) Again(attempt int) BranchSpec {
	b.Episode.Attempt = max(attempt, b.Episode.Attempt)
	return b
}

// Label is the branch's label on its model calls, "b<k>".
func (b BranchSpec) Label() string { return "b" + strconv.Itoa(b.K) }

func (b BranchSpec) validate(field string) error {
	if err := b.Parent.Validate(); err != nil {
		return prefixField(field+".parent.", err)
	}
	if b.K < 1 || b.K > MaxBranches*MaxBranches {
		return fieldErr(field+".k", ErrInvalid, "%d: want 1 or more", b.K)
	}
	want := Episode{Rollout: BranchRollout(b.Parent.Rollout, b.K), Attempt: b.Parent.Next().Attempt}
	if b.Episode.Rollout != want.Rollout || b.Episode.Attempt < want.Attempt {
		return fieldErr(field+".episode", ErrInvalid, "%s: branch %d of %s is %s (or a later attempt of it)", b.Episode, b.K, b.Parent, want)
	}
	want = b.Episode
	if err := want.Validate(); err != nil {
		return prefixField(field+".episode.", err)
	}
	if len(b.Holders) > MaxMembers {
		return fieldErr(field+".holders", ErrTooLarge, "%d members, limit %d", len(b.Holders), MaxMembers)
	}
	for i, m := range b.Holders {
		if err := validateMemberAt(field+".holders", i, string(m)); err != nil {
			return err
		}
	}
	return nil
}

func validateBranches(field string, bs []BranchSpec) error {
	if len(bs) == 0 {
		return fieldErr(field, ErrInvalid, "at least one branch")
	}
	if len(bs) > MaxBranches {
		return fieldErr(field, ErrTooLarge, "%d branches, limit %d", len(bs), MaxBranches)
	}
	seen := make(map[string]bool, len(bs))
	for i, b := range bs {
		f := fmt.Sprintf("%s[%d]", field, i)
		if err := b.validate(f); err != nil {
			return err
		}
		if seen[b.Episode.Rollout] {
			return fieldErr(f+".episode", ErrInvalid, "%s appears twice", b.Episode.Rollout)
		}
		seen[b.Episode.Rollout] = true
	}
	return nil
}

// Branch forks checkpointed episodes into branches that continue
// independently, beside the fleet (PROTOCOL §5, Branch). It is addressed
// to the members that hold the parents in the source checkpoint, in the
// run's epoch; each installs a copy of its parents' records per branch
// (an owner forks a sandbox per branch from the parent's snapshot; an
// agent installs the parent's bookmark as the branch's), and answers with
// the branch episodes it installed. CheckpointID is the operation's id.
type Branch struct {
	PhaseHeader
	// Source is the committed checkpoint the parents are read from.
	Source string `json:"source_checkpoint_id"`
	// SourceCommitSeq and SourceAcks are as in Restore.
	SourceCommitSeq uint64 `json:"source_commit_seq,omitempty"`
	SourceAcks      bool   `json:"source_acks,omitempty"`
	// Carried are the parents the source carried (§5): each is read from
	// that older checkpoint's records.
	Carried []CarriedSource `json:"carried,omitempty"`
	// Branches are the branches to make.
	Branches []BranchSpec `json:"branches"`
}

// Parents returns the distinct parent episodes of the branches, in order.
func (p Branch) Parents() []Episode {
	var out []Episode
	seen := map[Episode]bool{}
	for _, b := range p.Branches {
		if !seen[b.Parent] {
			seen[b.Parent] = true
			out = append(out, b.Parent)
		}
	}
	return out
}

// CarriedFrom returns the carried source each carried parent is read from.
func (p Branch) CarriedFrom() map[Episode]string {
	return Restore{Carried: p.Carried}.CarriedFrom()
}

// Phase implements PhaseEvent.
func (Branch) Phase() Phase { return PhaseBranch }

// Type implements Data.
func (Branch) Type() Type { return TypeBranch }

// Validate implements Data.
func (p Branch) Validate() error {
	errs := []error{p.validate()}
	if err := ValidateToken("data.source_checkpoint_id", p.Source); err != nil {
		errs = append(errs, err)
	}
	if err := validateBranches("data.branches", p.Branches); err != nil {
		return errors.Join(append(errs, err)...)
	}
	parents := map[Episode]bool{}
	for _, e := range p.Parents() {
		parents[e] = true
	}
	if len(p.Carried) > MaxListLen {
		return errors.Join(append(errs, fieldErr("data.carried", ErrTooLarge, "%d entries, limit %d", len(p.Carried), MaxListLen))...)
	}
	seen := map[Episode]bool{}
	for i, c := range p.Carried {
		f := fmt.Sprintf("data.carried[%d]", i)
		if err := ValidateToken(f+".source_checkpoint_id", c.Source); err != nil {
			errs = append(errs, err)
		}
		if err := validateEpisodes(f+".episodes", c.Episodes); err != nil {
			return errors.Join(append(errs, err)...)
		}
		for _, e := range c.Episodes {
			if !parents[e] || seen[e] {
				return errors.Join(append(errs, fieldErr(f+".episodes", ErrInvalid, "%s is no parent, or is carried twice", e))...)
			}
			seen[e] = true
		}
	}
	return errors.Join(errs...)
}

func (p Branch) route() route { return p.phaseRoute(PhaseBranch) }

// BranchAck answers a branch.
type BranchAck struct {
	AckHeader
	// Branched are the branch episodes (capture keys) the member
	// installed; none for a member that held no record of the parents.
	Branched []string `json:"branched,omitempty"`
}

// Answers implements Ack.
func (BranchAck) Answers() Phase { return PhaseBranch }

// Type implements Data.
func (BranchAck) Type() Type { return TypeBranchAck }

// Validate implements Data.
func (a BranchAck) Validate() error {
	return errors.Join(a.validate(), validateKeys("data.branched", a.Branched))
}

func (a BranchAck) route() route { return a.ackRoute(PhaseBranch) }

// BranchCompleted says every member addressed installed its branches:
// they are live episodes of the run from now on, continued by the
// controller on the agent that holds each.
type BranchCompleted struct {
	OutcomeHeader
	// Source is the checkpoint branched from.
	Source string `json:"source_checkpoint_id"`
	// Branches are the branches made.
	Branches []BranchSpec `json:"branches"`
	// Agents names, for each branch rollout, the agent that installed it.
	Agents map[string]Member `json:"agents,omitempty"`
	// Instances are those agents' process instances when the bridge
	// asked: a controller's first send of a branch names its instance, so
	// that a successor process, which never installed it, refuses it
	// rather than start it from its task's input.
	Instances map[Member]string `json:"instances,omitempty"`
}

// Type implements Data.
func (BranchCompleted) Type() Type { return TypeBranchCompleted }

// Validate implements Data.
func (o BranchCompleted) Validate() error {
	errs := []error{o.validate(), ValidateToken("data.source_checkpoint_id", o.Source), validateBranches("data.branches", o.Branches)}
	if len(o.Agents) > MaxBranches {
		errs = append(errs, fieldErr("data.agents", ErrTooLarge, "%d entries, limit %d", len(o.Agents), MaxBranches))
	}
	for r, m := range o.Agents {
		if err := ValidateRollout("data.agents", r); err != nil {
			errs = append(errs, err)
			break
		}
		if err := validateMember("data.agents."+r, string(m)); err != nil {
			errs = append(errs, err)
			break
		}
	}
	if len(o.Instances) > MaxBranches {
		errs = append(errs, fieldErr("data.instances", ErrTooLarge, "%d entries, limit %d", len(o.Instances), MaxBranches))
	}
	for m, inst := range o.Instances {
		if err := validateMember("data.instances", string(m)); err != nil {
			errs = append(errs, err)
			break
		}
		if err := ValidateToken("data.instances."+string(m), inst); err != nil {
			errs = append(errs, err)
			break
		}
	}
	return errors.Join(errs...)
}

func (o BranchCompleted) route() route { return o.outcomeRoute(TypeBranchCompleted) }

// BranchFailed says the branch operation did not complete on every member:
// the branch episodes were retired everywhere (no member continues any of
// them), and the parents are untouched.
type BranchFailed struct {
	OutcomeHeader
	// Source is the checkpoint the operation tried.
	Source string `json:"source_checkpoint_id"`
	// Branches are the branches it tried.
	Branches []BranchSpec `json:"branches"`
	// Errors names every member that failed or never answered.
	Errors []MemberError `json:"errors"`
	// Retired are the branch episodes retired.
	Retired []string `json:"retired,omitempty"`
}

// Type implements Data.
func (BranchFailed) Type() Type { return TypeBranchFailed }

// Validate implements Data.
func (o BranchFailed) Validate() error {
	return errors.Join(o.validate(), ValidateToken("data.source_checkpoint_id", o.Source), validateBranches("data.branches", o.Branches),
		validateMemberErrors("data.errors", o.Errors), validateKeys("data.retired", o.Retired))
}

func (o BranchFailed) route() route { return o.outcomeRoute(TypeBranchFailed) }
