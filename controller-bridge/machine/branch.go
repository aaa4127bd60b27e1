package machine

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
)

// askBranch starts a branch (PROTOCOL §5, Branch): each rollout the
// source holds with progress is forked N ways, addressed to the members
// that hold it there, in the run's epoch. Every rollout must be held (not
// restarted), and every holder live.
func (m *Machine) askBranch(now time.Time, in BranchAsked) ([]Effect, error) {
	if err := m.refuseBusy(); err != nil {
		return nil, err
	}
	req, v := in.Request, in.View
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if in.History.Ops[req.ID] {
		return nil, fmt.Errorf("%w: branch_id %s names an earlier branch operation of run %s", bridgeapi.ErrBadRequest, req.ID, m.cfg.Run)
	}
	source := req.Source
	if source == "" {
		if v.Latest == nil {
			return nil, fmt.Errorf("%w: run %s has no committed checkpoint (no LATEST) to branch from", bridgeapi.ErrNotFound, m.cfg.Run)
		}
		source = v.Latest.CheckpointID
	}
	man := v.Manifest
	if man == nil || man.Aborted || man.CheckpointID != source {
		return nil, fmt.Errorf("%w: checkpoint %s of run %s is not committed", bridgeapi.ErrNotFound, source, m.cfg.Run)
	}
	if r := man.Released; r != nil {
		return nil, fmt.Errorf("%w: checkpoint %s of run %s: %s", bridgeapi.ErrReleased, source, m.cfg.Run, describeMark(*r))
	}
	holdings := man.Holdings()
	held := map[string]string{} // rollout -> capture key
	for k := range holdings {
		if e, err := events.ParseEpisode(k); err == nil {
			held[e.Rollout] = k
		}
	}
	restarted := map[string]bool{}
	for _, k := range man.Restarted {
		if e, err := events.ParseEpisode(k); err == nil {
			restarted[e.Rollout] = true
		}
	}
	live := map[events.Member]bool{}
	for _, mem := range v.Members {
		live[mem] = true
	}
	var (
		specs   []events.BranchSpec
		holders []events.Member
		carried []events.CarriedSource
		gone    []string
	)
	timeout := m.timeout(req.TimeoutMS)
	for _, r := range req.Rollouts {
		k, ok := held[r]
		switch {
		case !ok && restarted[r]:
			return nil, fmt.Errorf("%w: rollout %s: checkpoint %s holds it as restarted, with no progress to branch from", bridgeapi.ErrBadRequest, r, source)
		case !ok:
			return nil, fmt.Errorf("%w: rollout %s: checkpoint %s does not hold it", bridgeapi.ErrBadRequest, r, source)
		}
		h := holdings[k]
		if !slices.ContainsFunc(h.Members, func(mem events.Member) bool { return mem.Kind() != events.KindSandbox }) {
			return nil, fmt.Errorf("%w: rollout %s: no member of checkpoint %s holds records of %s", bridgeapi.ErrBadRequest, r, source, k)
		}
		for _, mem := range h.Members {
			if mem.Kind() == events.KindSandbox {
				continue
			}
			if !live[mem] && !slices.Contains(gone, string(mem)) {
				gone = append(gone, string(mem))
			}
			if !slices.Contains(holders, mem) {
				holders = append(holders, mem)
			}
		}
		parent, _ := events.ParseEpisode(k)
		var own []events.Member
		for _, mem := range h.Members {
			if mem.Kind() != events.KindSandbox {
				own = append(own, mem)
			}
		}
		slices.Sort(own)
		for i := range req.N {
			n := req.FirstK() + i
			if _, dup := held[events.BranchRollout(r, n)]; dup {
				return nil, fmt.Errorf("%w: rollout %s: checkpoint %s holds %s already; ask with another first", bridgeapi.ErrBadRequest, r, source, events.BranchRollout(r, n))
			}
			s := events.NewBranchSpec(parent, n, bridgeapi.BranchSeed(req.Seed, r, n)).Again(req.Attempt)
			if a, made := in.History.Rollouts[s.Episode.Rollout]; made && a >= s.Episode.Attempt {
				return nil, fmt.Errorf("%w: rollout %s: an earlier branch operation made %s (attempt %d); ask with another first, or make it again at a later attempt",
					bridgeapi.ErrBadRequest, r, s.Episode.Rollout, a)
			}
			s.Holders = own
			specs = append(specs, s)
		}
		if h.From == man.CheckpointID {
			continue
		}
		src := v.Sources[h.From]
		switch {
		case src == nil || src.Aborted || src.CheckpointID != h.From:
			return nil, fmt.Errorf("%w: checkpoint %s carries %s from %s, which is not a committed checkpoint", bridgeapi.ErrNotFound, source, k, h.From)
		case src.Released != nil:
			return nil, fmt.Errorf("%w: checkpoint %s carries %s from %s: %s", bridgeapi.ErrReleased, source, k, h.From, describeMark(*src.Released))
		}
		i := slices.IndexFunc(carried, func(c events.CarriedSource) bool { return c.Source == h.From })
		if i < 0 {
			i = len(carried)
			carried = append(carried, events.CarriedSource{Source: h.From, SourceCommitSeq: src.CommitSeq,
				SourceAcks: acksKept(now, src, v.StreamMaxAge, timeout)})
		}
		carried[i].Episodes = append(carried[i].Episodes, parent)
	}
	if len(gone) > 0 {
		slices.Sort(gone)
		return nil, fmt.Errorf("%w: checkpoint %s: the parents' holders %v are not live members of the run's epoch", bridgeapi.ErrBadRequest, source, gone)
	}
	slices.Sort(holders)
	id := req.ID
	if id == "" {
		id = "branch-" + strconv.FormatUint(v.Seq+1, 10)
	}
	if in.History.Ops[id] {
		return nil, fmt.Errorf("%w: operation id %s names an earlier branch operation of run %s", bridgeapi.ErrBadRequest, id, m.cfg.Run)
	}
	h := events.PhaseHeader{Run: m.cfg.Run, CheckpointID: id, Seq: v.Seq + 1, Epoch: v.Epoch,
		Deadline: now.Add(timeout).UTC().Truncate(time.Millisecond)}.Address(holders)
	b := events.Branch{PhaseHeader: h, Source: source, SourceCommitSeq: man.CommitSeq,
		SourceAcks: acksKept(now, man, v.StreamMaxAge, timeout), Carried: carried, Branches: specs}
	if err := b.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", bridgeapi.ErrBadRequest, err)
	}
	if err := m.to(StateBranching); err != nil {
		return nil, err
	}
	m.view(v)
	m.op = &operation{kind: opBranch, id: id, branch: &b, epochMembers: slices.Clone(v.Members), bres: branchResult(b), instances: v.Instances}
	m.op.bres.Seed = req.Seed
	return m.publish(b), nil
}

func branchResult(b events.Branch) *bridgeapi.BranchResult {
	return &bridgeapi.BranchResult{Run: b.Run, OpID: b.CheckpointID, Source: b.Source, Status: bridgeapi.StatusCompleted,
		Branches: b.Branches, Members: expected(b.PhaseHeader)}
}

// branchGathered takes the branch's verdict: every holder branched, and
// an agent holds each branch, so branch.completed; else the branches are
// retired everywhere.
func (m *Machine) branchGathered(now time.Time, t *Tally, v Verdict) ([]Effect, error) {
	res := m.op.bres
	var f bridgeapi.Failure
	if v == Complete {
		// Each branch installed by every holder of its parent (the phase
		// names them), and by an agent: keys an ack names that are no
		// branch of this operation are not counted.
		made := map[string]map[events.Member]bool{}
		for _, s := range res.Branches {
			made[s.Episode.String()] = map[events.Member]bool{}
		}
		for mem, ack := range t.Acks() {
			if ba, ok := ack.(events.BranchAck); ok {
				for _, k := range ba.Branched {
					if by, ok := made[k]; ok {
						by[mem] = true
					}
				}
			}
		}
		agents := map[string]events.Member{}
		var missing []string
		for _, s := range res.Branches {
			by := made[s.Episode.String()]
			for mem := range by {
				if mem.Kind() == events.KindAgent && (agents[s.Episode.Rollout] == "" || mem < agents[s.Episode.Rollout]) {
					agents[s.Episode.Rollout] = mem
				}
			}
			var not []string
			for _, h := range s.Holders {
				if !by[h] {
					not = append(not, string(h))
				}
			}
			switch {
			case agents[s.Episode.Rollout] == "":
				missing = append(missing, s.Episode.Rollout+" (no agent)")
			case len(not) > 0:
				missing = append(missing, fmt.Sprintf("%s (not by %v)", s.Episode.Rollout, not))
			}
		}
		if len(missing) == 0 {
			res.Status, res.Agents = bridgeapi.StatusCompleted, agents
			out := events.BranchCompleted{OutcomeHeader: events.OutcomeHeader{Run: m.cfg.Run, CheckpointID: res.OpID, Epoch: m.op.branch.Epoch},
				Source: res.Source, Branches: res.Branches, Agents: agents}
			for _, a := range agents {
				if inst := m.op.instances[a]; inst != "" {
					if out.Instances == nil {
						out.Instances = map[events.Member]string{}
					}
					out.Instances[a] = inst
				}
			}
			m.want = wantOutcomePublished
			return []Effect{PublishOutcome{ID: res.OpID, Outcome: out, Replayed: m.op.replayed}}, nil
		}
		f = bridgeapi.Failure{Phase: events.PhaseBranch, Reason: fmt.Sprintf("not installed: %v", missing)}
	} else {
		errs, _, _ := t.Failure(now)
		f = bridgeapi.Failure{Phase: events.PhaseBranch,
			Reason: fmt.Sprintf("%d of %d members did not branch", len(errs), len(res.Members)), Errors: errs}
	}
	if err := m.to(StateBranchFailing); err != nil {
		return nil, err
	}
	res.Failure = &f
	note := Note{Level: LevelWarn, Msg: fmt.Sprintf("branch %s failed (%s); retiring its branches everywhere", res.OpID, f.Reason)}
	effs, err := m.retireBranches(now)
	return append([]Effect{note}, effs...), err
}

// retireBranches retires every branch episode on every live member of
// the epoch (and every holder), unless the retire is on the stream
// already; branch.failed follows.
func (m *Machine) retireBranches(now time.Time) ([]Effect, error) {
	b := m.op.branch
	if !m.lastIs(events.PhaseBranch, b.CheckpointID) {
		return m.publishBranchFailed()
	}
	members := slices.Clone(m.op.epochMembers)
	for _, mem := range expected(b.PhaseHeader) {
		if !slices.Contains(members, mem) {
			members = append(members, mem)
		}
	}
	slices.Sort(members)
	eps := make([]events.Episode, len(b.Branches))
	for i, s := range b.Branches {
		eps[i] = s.Episode
	}
	return m.publish(events.Retire{PhaseHeader: m.header(now, b.CheckpointID, b.Epoch, members, m.cfg.PhaseTimeout), Episodes: eps}), nil
}

// branchRetireGathered adds the members that did not retire to the
// failure; branch.failed follows.
func (m *Machine) branchRetireGathered(now time.Time, t *Tally, v Verdict) ([]Effect, error) {
	m.op.retireGathered = true
	var effs []Effect
	if v != Complete {
		errs, _, _ := t.Failure(now)
		f := m.op.bres.Failure
		f.Errors = append(f.Errors, errs...)
		effs = append(effs, Note{Level: LevelError, Msg: fmt.Sprintf(
			"retire after a failed branch did not complete everywhere (%d members)", len(errs))})
	}
	more, err := m.publishBranchFailed()
	return append(effs, more...), err
}

// branchFailedRead takes the branch's acks read back by a replay of a
// failed branch: they name who did not branch. The retire's acks follow,
// or the retire itself.
func (m *Machine) branchFailedRead(now time.Time, t *Tally) ([]Effect, error) {
	errs, _, _ := t.Failure(now)
	m.op.bres.Failure.Errors = errs
	if m.op.retire != nil && !m.op.retireGathered && m.lastIs(events.PhaseRetire, m.op.id) {
		return m.gather(now, *m.op.retire, true), nil
	}
	return m.retireBranches(now)
}

// publishBranchFailed reports branch.failed: who did not branch, and the
// branch episodes retired.
func (m *Machine) publishBranchFailed() ([]Effect, error) {
	res, b := m.op.bres, m.op.branch
	res.Status, res.Retired, res.Agents = bridgeapi.StatusFailed, nil, nil
	for _, s := range b.Branches {
		res.Retired = append(res.Retired, s.Episode.String())
	}
	out := events.BranchFailed{OutcomeHeader: events.OutcomeHeader{Run: m.cfg.Run, CheckpointID: res.OpID, Epoch: b.Epoch},
		Source: res.Source, Branches: res.Branches, Errors: res.Failure.Errors, Retired: res.Retired}
	if out.Errors == nil {
		out.Errors = []events.MemberError{}
	}
	m.want = wantOutcomePublished
	return []Effect{PublishOutcome{ID: res.OpID, Outcome: out, Replayed: m.op.replayed}}, nil
}

// replayedBranch carries on with a branch a bridge left open: a failed
// one retires and reports; an open one gathers its acks.
func (m *Machine) replayedBranch(now time.Time) ([]Effect, string, error) {
	o := m.op
	if o.retire != nil {
		if err := m.to(StateBranchFailing); err != nil {
			return nil, "", err
		}
		o.bres.Failure = &bridgeapi.Failure{Phase: events.PhaseBranch, Reason: "the branch failed (recovered after a bridge restart)"}
		return m.gather(now, *o.branch, false), "a failed branch was left retiring; finishing it", nil
	}
	if err := m.to(StateBranching); err != nil {
		return nil, "", err
	}
	return m.gather(now, *o.branch, true), "a branch was left open; reading its acks", nil
}
