package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

var _ member.Brancher = (*Agent)(nil)

// ErrBranchExists is returned (wrapped, naming the rollout) by Branch for a
// branch whose rollout id runs, ran or is installed on this agent already.
var ErrBranchExists = errors.New("agent: the branch's rollout is known here already")

// Branch implements member.Brancher (PROTOCOL §5, Branch): for each
// bookmark record of a parent, it installs per branch of that parent the
// parent's bookmark rewritten as the branch's (its rollout and attempt,
// its session ownerapi.BranchSession of the parent's, no sandbox hint,
// and a BranchRef), all or none. The controller then asks for the branch
// as for a restored attempt: its rollout at the branch's attempt. A
// record of no parent is left alone; a parent whose harness has finished
// (at verify or return) has nothing to continue and fails the branch.
func (a *Agent) Branch(ctx context.Context, b events.Branch, records []events.Record) ([]events.Episode, error) {
	specs := map[string][]events.BranchSpec{}
	for _, s := range b.Branches {
		specs[s.Parent.String()] = append(specs[s.Parent.String()], s)
	}
	var bms []agentapi.Bookmark
	var eps []events.Episode
	var errs []error
	for _, rec := range records {
		todo := specs[rec.Key]
		if len(todo) == 0 {
			continue
		}
		bm, err := agentapi.DecodeBookmark(rec.Data)
		if err != nil {
			errs = append(errs, fmt.Errorf("agent: branch of %s: record: %w", rec.Key, err))
			continue
		}
		if (events.Episode{Rollout: bm.Rollout, Attempt: bm.Attempt}).String() != rec.Key {
			errs = append(errs, fmt.Errorf("agent: branch of %s: record: %w: it holds %s attempt %d", rec.Key, agentapi.ErrBadBookmark, bm.Rollout, bm.Attempt))
			continue
		}
		if bm.Next == agentapi.StageVerify || bm.Next == agentapi.StageReturn {
			errs = append(errs, fmt.Errorf("agent: branch of %s: its harness has finished (next stage %s): a branch has nothing to continue", rec.Key, bm.Next))
			continue
		}
		for _, s := range todo {
			bms = append(bms, branchBookmark(bm, b.Source, s))
			eps = append(eps, s.Episode)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, bm := range bms {
		id := bm.Rollout
		if r, ok := a.runs[id]; ok {
			errs = append(errs, fmt.Errorf("%w: %s: attempt %d runs", ErrBranchExists, id, r.ep.Attempt))
		}
		if r, ok := a.finished[id]; ok {
			errs = append(errs, fmt.Errorf("%w: %s: attempt %d ran", ErrBranchExists, id, r.ep.Attempt))
		}
		if ib, ok := a.installed[id]; ok {
			errs = append(errs, fmt.Errorf("%w: %s: attempt %d is installed", ErrBranchExists, id, ib.Attempt))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, bm := range bms {
		a.installed[bm.Rollout] = bm
	}
	a.log.Info().Str("source", b.Source).Int("branches", len(bms)).Msg("branches installed")
	return eps, nil
}

// branchBookmark is the parent's bookmark bm rewritten as branch s's.
func branchBookmark(bm agentapi.Bookmark, source string, s events.BranchSpec) agentapi.Bookmark {
	nb := bm.Clone()
	nb.Rollout, nb.Attempt, nb.Sandbox = s.Episode.Rollout, s.Episode.Attempt, ""
	if nb.Session != "" {
		nb.Session = ownerapi.BranchSession(bm.Session, s.K)
	}
	nb.Branch = &agentapi.BranchRef{Parent: s.Parent.String(), K: s.K, Seed: s.Seed, Source: source, Label: s.Label()}
	return nb
}

// branchLabel is the label bm's launches and re-points give the relay:
// the branch's, with its episode (under which a fork that continues in
// place records its calls from the re-point on), nil for a rollout that
// is no branch.
func branchLabel(bm agentapi.Bookmark) *sandboxapi.BranchLabel {
	if bm.Branch == nil {
		return nil
	}
	return &sandboxapi.BranchLabel{Label: bm.Branch.Label, Seed: bm.Branch.Seed,
		Episode: events.Episode{Rollout: bm.Rollout, Attempt: bm.Attempt}.String()}
}

// trajectoryBranch is the branch header of bm's trajectory, whose calls
// are calls (nil for a rollout that is no branch): At counts the calls at
// the head of the file that are not the branch's own (of its episode or
// sent with its label), those the fork's capture inherited from the
// parent.
func trajectoryBranch(bm agentapi.Bookmark, calls []trajectory.Whole) *agentapi.TrajectoryBranch {
	br := bm.Branch
	if br == nil {
		return nil
	}
	parent, _ := events.ParseEpisode(br.Parent)
	at := 0
	for _, c := range calls {
		// Its own: of its episode, or sent with its label (a fork that
		// continued in place keeps the parent's episode on its calls).
		if ep, err := events.ParseEpisode(c.Episode); err == nil && ep.Rollout == bm.Rollout || c.Branch == br.Label && c.Seed == br.Seed {
			break
		}
		at++
	}
	return &agentapi.TrajectoryBranch{Parent: parent.Rollout, ParentEpisode: br.Parent, K: br.K, Seed: br.Seed, Source: br.Source, At: at}
}
