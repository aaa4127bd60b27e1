package bridge

import (
	"context"
	"fmt"
	"sort"
	"strconv"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/internal/failpoint"
	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
)

// Retire refuses the given attempts (and earlier ones of the same
// rollouts) on every member from now on and stops their work.
func (b *Bridge) Retire(ctx context.Context, episodes []string) (*bridgeapi.OpResult, error) {
	eps, err := parseEpisodes(episodes)
	if err != nil {
		return nil, err
	}
	if len(eps) == 0 {
		return nil, fmt.Errorf("%w: retire needs at least one episode", bridgeapi.ErrBadRequest)
	}
	return b.simpleOp(ctx, events.PhaseRetire, func(h events.PhaseHeader) events.PhaseEvent {
		return events.Retire{PhaseHeader: h, Episodes: eps}
	})
}

// Forget drops the refusal marks of rollouts that are finished for good.
func (b *Bridge) Forget(ctx context.Context, rollouts []string) (*bridgeapi.OpResult, error) {
	if len(rollouts) == 0 {
		return nil, fmt.Errorf("%w: forget needs at least one rollout", bridgeapi.ErrBadRequest)
	}
	for i, r := range rollouts {
		if err := events.ValidateRollout(fmt.Sprintf("rollouts[%d]", i), r); err != nil {
			return nil, fmt.Errorf("%w: %w", bridgeapi.ErrBadRequest, err)
		}
	}
	return b.simpleOp(ctx, events.PhaseForget, func(h events.PhaseHeader) events.PhaseEvent {
		return events.Forget{PhaseHeader: h, Rollouts: rollouts}
	})
}

// simpleOp publishes a retire or forget to the members of the current
// epoch and gathers their acks.
func (b *Bridge) simpleOp(ctx context.Context, phase events.Phase, build func(events.PhaseHeader) events.PhaseEvent) (*bridgeapi.OpResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	st, members, err := b.startOp(ctx)
	if err != nil {
		return nil, err
	}
	id := string(phase) + "-" + strconv.FormatUint(st.seq+1, 10)
	p := build(b.header(&st, id, st.epoch, members, b.cfg.PhaseTimeout))
	if err := b.publishPhase(ctx, &st, p); err != nil {
		return nil, err
	}
	t, v, err := b.gather(ctx, p)
	if err != nil {
		return nil, err
	}
	res := &bridgeapi.OpResult{Run: b.cfg.Run, OpID: id, Phase: phase, Status: bridgeapi.StatusCompleted, Members: members}
	if v != machine.Complete {
		errs, _, _ := t.Failure(b.cfg.Now())
		res.Status = bridgeapi.StatusFailed
		res.Failure = &bridgeapi.Failure{Phase: phase, Reason: fmt.Sprintf("%d of %d members failed or were silent", len(errs), len(members)), Errors: errs}
	}
	b.log.Info().Str("op", id).Str("status", res.Status).Msg(string(phase) + " done")
	return res, nil
}

// startOp recovers, refuses while a checkpoint is held, and returns the
// run state and the members of its epoch.
func (b *Bridge) startOp(ctx context.Context) (runState, []events.Member, error) {
	if err := b.begin(ctx); err != nil {
		return runState{}, nil, err
	}
	st, err := b.state(ctx)
	if err != nil {
		return runState{}, nil, err
	}
	members, _, err := b.liveMembers(ctx, st.epoch, false)
	return st, members, err
}

// Release asks every member to delete external state (snapshots) that no
// kept checkpoint names, then deletes the manifests and records of every
// checkpoint not kept. A release that keeps nothing is the final release:
// it leaves no manifest, record or LATEST of the run. Abort markers are
// kept by every release, so that an aborted checkpoint can never be
// created later (PROTOCOL §7, invariant 2).
func (b *Bridge) Release(ctx context.Context, req bridgeapi.ReleaseRequest) (*bridgeapi.OpResult, error) {
	if err := validateTokens("keep", req.Keep); err != nil {
		return nil, err
	}
	if req.KeepLatest < 0 {
		return nil, fmt.Errorf("%w: keep_latest: negative", bridgeapi.ErrBadRequest)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	st, members, err := b.startOp(ctx)
	if err != nil {
		return nil, err
	}
	all, err := b.checkpoints(ctx)
	if err != nil {
		return nil, err
	}
	keep, err := keepSet(all, req)
	if err != nil {
		return nil, err
	}
	id := "release-" + strconv.FormatUint(st.seq+1, 10)
	p := events.Release{PhaseHeader: b.header(&st, id, st.epoch, members, b.cfg.PhaseTimeout), Keep: keep,
		Final: len(req.Keep) == 0 && req.KeepLatest == 0}
	if err := b.publishPhase(ctx, &st, p); err != nil {
		return nil, err
	}
	failpoint.Hit("bridge/after-release")
	return b.finishRelease(ctx, p)
}

// finishRelease gathers release acks and, if every member released,
// deletes what is not kept. Recovery calls it again.
func (b *Bridge) finishRelease(ctx context.Context, p events.Release) (*bridgeapi.OpResult, error) {
	res := &bridgeapi.OpResult{Run: b.cfg.Run, OpID: p.CheckpointID, Phase: events.PhaseRelease, Status: bridgeapi.StatusCompleted,
		Members: p.Members, Keep: p.Keep, MemberDeleted: map[events.Member][]string{}}
	t, v, err := b.gather(ctx, p)
	if err != nil {
		return nil, err
	}
	for m, ack := range t.Acks() {
		if r, ok := ack.(events.ReleaseAck); ok && len(r.Deleted) > 0 {
			res.MemberDeleted[m] = r.Deleted
		}
	}
	if v != machine.Complete {
		// Keep the bridge's side: a member that did not release may still
		// hold snapshots that these manifests name.
		errs, _, _ := t.Failure(b.cfg.Now())
		res.Status = bridgeapi.StatusFailed
		res.Failure = &bridgeapi.Failure{Phase: events.PhaseRelease, Reason: fmt.Sprintf("%d of %d members did not release; manifests kept", len(errs), len(p.Members)), Errors: errs}
	} else {
		kept := map[string]bool{}
		for _, k := range p.Keep {
			kept[k] = true
		}
		all, err := b.checkpoints(ctx)
		if err != nil {
			return nil, err
		}
		for _, m := range all {
			// Abort markers stay, even after the final release: deleting one
			// would let a slow bridge create that checkpoint after all
			// (PROTOCOL §7, invariant 2). The records and member manifests
			// its members wrote before the abort go (deleteCheckpoint).
			if kept[m.CheckpointID] {
				continue
			}
			if err := b.deleteCheckpoint(ctx, m); err != nil {
				return nil, err
			}
			if !m.Aborted {
				res.Deleted = append(res.Deleted, m.CheckpointID)
			}
		}
		if l, _, err := b.latest(ctx); err != nil {
			return nil, err
		} else if l != nil && !kept[l.CheckpointID] {
			if err := b.cfg.Bus.Manifests.Purge(ctx, events.LatestKey(b.cfg.Run)); err != nil {
				return nil, fmt.Errorf("bridge: delete LATEST: %w", err)
			}
		}
	}
	if o, err := b.outcomeOf(ctx, events.TypeReleaseCompleted, p.CheckpointID); err != nil {
		return nil, err
	} else if o == nil {
		out := events.ReleaseCompleted{OutcomeHeader: events.OutcomeHeader{Run: b.cfg.Run, CheckpointID: p.CheckpointID, Epoch: p.Epoch},
			Keep: p.Keep, Deleted: res.Deleted}
		if res.Failure != nil {
			out.Errors = res.Failure.Errors
		}
		if out.Keep == nil {
			out.Keep = []string{}
		}
		if err := b.publishOutcome(ctx, out, p.CheckpointID); err != nil {
			return nil, err
		}
	}
	b.log.Info().Strs("keep", p.Keep).Strs("deleted", res.Deleted).Str("status", res.Status).Msg("release done")
	return res, nil
}

// keepSet resolves a release request to the committed checkpoints kept.
func keepSet(all []events.CheckpointManifest, req bridgeapi.ReleaseRequest) ([]string, error) {
	committed := map[string]bool{}
	var order []string
	for _, m := range all {
		if !m.Aborted {
			committed[m.CheckpointID] = true
			order = append(order, m.CheckpointID)
		}
	}
	keep := map[string]bool{}
	for _, k := range req.Keep {
		if !committed[k] {
			return nil, fmt.Errorf("%w: keep names %s, which is not a committed checkpoint", bridgeapi.ErrNotFound, k)
		}
		keep[k] = true
	}
	for i := len(order) - 1; i >= 0 && i >= len(order)-req.KeepLatest; i-- {
		keep[order[i]] = true
	}
	out := make([]string, 0, len(keep))
	for k := range keep {
		out = append(out, k)
	}
	sort.Strings(out)
	return out, nil
}

// Status reads the run's state from the bus.
func (b *Bridge) Status(ctx context.Context) (*bridgeapi.Status, error) {
	st, err := b.state(ctx)
	if err != nil {
		return nil, err
	}
	s := &bridgeapi.Status{Run: b.cfg.Run, Epoch: st.epoch, Seq: st.seq, Checkpoints: []bridgeapi.CheckpointInfo{}, Members: []events.MemberInfo{}}
	if st.last != nil {
		s.LastPhase, s.LastCheckpoint = st.last.Phase(), st.last.Header().CheckpointID
	}
	if op, err := b.openOp(ctx, st); err != nil {
		return nil, err
	} else if op != "" {
		s.Open = op
	}
	b.mu.Lock()
	if b.held != nil {
		s.Held = b.held.id
	}
	b.mu.Unlock()
	if s.Latest, _, err = b.latest(ctx); err != nil {
		return nil, err
	}
	all, err := b.checkpoints(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range all {
		s.Checkpoints = append(s.Checkpoints, bridgeapi.CheckpointInfo{CheckpointID: m.CheckpointID, Epoch: m.Epoch, Created: m.Created,
			Aborted: m.Aborted, Reason: m.Reason, Continued: len(m.Continued), Restarted: len(m.Restarted), Members: len(m.Members), Stop: m.Stop})
	}
	_, infos, err := b.liveMembers(ctx, st.epoch, false)
	if err != nil {
		return nil, err
	}
	if infos != nil {
		s.Members = infos
	}
	return s, nil
}

func parseEpisodes(keys []string) ([]events.Episode, error) {
	out := make([]events.Episode, 0, len(keys))
	for i, k := range keys {
		e, err := events.ParseEpisode(k)
		if err != nil {
			return nil, fmt.Errorf("%w: episodes[%d]: %w", bridgeapi.ErrBadRequest, i, err)
		}
		out = append(out, e)
	}
	return out, nil
}

func validateTokens(field string, ids []string) error {
	for i, id := range ids {
		if err := events.ValidateToken(fmt.Sprintf("%s[%d]", field, i), id); err != nil {
			return fmt.Errorf("%w: %w", bridgeapi.ErrBadRequest, err)
		}
	}
	return nil
}
