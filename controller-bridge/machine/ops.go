package machine

import (
	"fmt"
	"sort"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
)

// askRetire asks every member of the epoch to refuse the attempts (and
// earlier ones of the same rollouts) from now on.
func (m *Machine) askRetire(now time.Time, in RetireAsked) ([]Effect, error) {
	if len(in.Episodes) == 0 {
		return nil, fmt.Errorf("%w: retire needs at least one episode", bridgeapi.ErrBadRequest)
	}
	return m.startOp(now, events.PhaseRetire, in.View, func(h events.PhaseHeader) events.PhaseEvent {
		return events.Retire{PhaseHeader: h, Episodes: in.Episodes}
	})
}

// askForget asks every member of the epoch to drop the refusal marks of
// rollouts finished for good.
func (m *Machine) askForget(now time.Time, in ForgetAsked) ([]Effect, error) {
	if err := (bridgeapi.ForgetRequest{Rollouts: in.Rollouts}).Validate(); err != nil {
		return nil, err
	}
	return m.startOp(now, events.PhaseForget, in.View, func(h events.PhaseHeader) events.PhaseEvent {
		return events.Forget{PhaseHeader: h, Rollouts: in.Rollouts}
	})
}

// startOp publishes a retire or forget, with an id of its own.
func (m *Machine) startOp(now time.Time, p events.Phase, v View, build func(events.PhaseHeader) events.PhaseEvent) ([]Effect, error) {
	if err := m.refuseBusy(); err != nil {
		return nil, err
	}
	if err := m.to(StateOperating); err != nil {
		return nil, err
	}
	m.view(v)
	id := m.opID(p)
	k := opRetire
	if p == events.PhaseForget {
		k = opForget
	}
	ev := build(m.header(now, id, m.epoch, v.Members, m.cfg.PhaseTimeout))
	m.op = &operation{kind: k, id: id, phase: ev,
		ores: &bridgeapi.OpResult{Run: m.cfg.Run, OpID: id, Phase: p, Status: bridgeapi.StatusCompleted, Members: v.Members}}
	return m.publish(ev), nil
}

// opGathered reports what every member of a retire or forget did.
func (m *Machine) opGathered(now time.Time, t *Tally, v Verdict) ([]Effect, error) {
	res := m.op.ores
	if v != Complete {
		errs, _, _ := t.Failure(now)
		res.Status = bridgeapi.StatusFailed
		res.Failure = &bridgeapi.Failure{Phase: res.Phase,
			Reason: fmt.Sprintf("%d of %d members failed or were silent", len(errs), len(res.Members)), Errors: errs}
	}
	return m.finish(Finish{Op: res})
}

// askRelease asks every member of the epoch to delete the external state
// that no kept checkpoint names; the bridge's side follows once all did.
// A release that keeps nothing is the final release.
func (m *Machine) askRelease(now time.Time, in ReleaseAsked) ([]Effect, error) {
	if err := m.refuseBusy(); err != nil {
		return nil, err
	}
	req, v := in.Request, in.View
	if err := req.Validate(); err != nil {
		return nil, err
	}
	keep, err := keepSet(v.Checkpoints, req)
	if err != nil {
		return nil, err
	}
	if err := m.to(StateReleasing); err != nil {
		return nil, err
	}
	m.view(v)
	id := m.opID(events.PhaseRelease)
	p := events.Release{PhaseHeader: m.header(now, id, m.epoch, v.Members, m.cfg.PhaseTimeout), Keep: keep, Final: req.Final()}
	m.op = &operation{kind: opRelease, id: id, phase: p, ores: releaseResult(m.cfg.Run, p)}
	return m.publish(p), nil
}

func releaseResult(run string, p events.Release) *bridgeapi.OpResult {
	return &bridgeapi.OpResult{Run: run, OpID: p.CheckpointID, Phase: events.PhaseRelease, Status: bridgeapi.StatusCompleted,
		Members: expected(p.PhaseHeader), Keep: p.Keep, MemberDeleted: map[events.Member][]string{}}
}

// releaseGathered takes what every member deleted. If one did not
// release, the bridge keeps its side: that member may still hold
// snapshots the manifests name.
func (m *Machine) releaseGathered(now time.Time, t *Tally, v Verdict) ([]Effect, error) {
	res := m.op.ores
	for member, ack := range t.Acks() {
		if r, ok := ack.(events.ReleaseAck); ok && len(r.Deleted) > 0 {
			res.MemberDeleted[member] = r.Deleted
		}
	}
	if v != Complete {
		errs, _, _ := t.Failure(now)
		res.Status = bridgeapi.StatusFailed
		res.Failure = &bridgeapi.Failure{Phase: events.PhaseRelease,
			Reason: fmt.Sprintf("%d of %d members did not release; manifests kept", len(errs), len(res.Members)), Errors: errs}
		// The manifests stay, but what they name may not: mark every
		// checkpoint not kept, so that no restore installs half of one.
		mark := releaseMark(res)
		mark.Failed = errs
		m.want = wantReleasedMarked
		return []Effect{MarkReleased{Keep: res.Keep, Mark: mark}}, nil
	}
	m.want = wantCheckpointsListed
	return []Effect{ListCheckpoints{Release: m.op.id}}, nil
}

// checkpointsListed deletes every checkpoint not kept. Abort markers stay,
// even after the final release: deleting one would let a slow bridge
// create that checkpoint after all (PROTOCOL §7, invariant 2); the records
// and member manifests its members wrote before the abort go.
func (m *Machine) checkpointsListed(in CheckpointsListed) ([]Effect, error) {
	if err := m.expect(wantCheckpointsListed, in); err != nil {
		return nil, err
	}
	res := m.op.ores
	kept := map[string]bool{}
	for _, k := range res.Keep {
		kept[k] = true
	}
	var del []Deletion
	// What a bridge that died in this release deleted already is deleted
	// by it all the same.
	for _, id := range in.Purged {
		if !kept[id] {
			res.Deleted = append(res.Deleted, id)
		}
	}
	for _, c := range in.Checkpoints {
		if kept[c.CheckpointID] {
			continue
		}
		del = append(del, Deletion{CheckpointID: c.CheckpointID, KeepMarker: c.Aborted})
		if !c.Aborted {
			res.Deleted = append(res.Deleted, c.CheckpointID)
		}
	}
	m.want = wantCheckpointsDeleted
	return []Effect{DeleteCheckpoints{Delete: del, Keep: res.Keep, Mark: releaseMark(res)}}, nil
}

// releaseMark is the mark a release sets on what it does not keep: the
// release and what each member deleted.
func releaseMark(res *bridgeapi.OpResult) events.ReleaseMark {
	mark := events.ReleaseMark{Op: res.OpID}
	if len(res.MemberDeleted) > 0 {
		mark.Deleted = res.MemberDeleted
	}
	return mark
}

func (m *Machine) releasedMarked(in ReleasedMarked) ([]Effect, error) {
	if err := m.expect(wantReleasedMarked, in); err != nil {
		return nil, err
	}
	return m.publishReleased(), nil
}

func (m *Machine) checkpointsDeleted(in CheckpointsDeleted) ([]Effect, error) {
	if err := m.expect(wantCheckpointsDeleted, in); err != nil {
		return nil, err
	}
	return m.publishReleased(), nil
}

// publishReleased reports the release's outcome: release.completed with
// what was kept and deleted, or, when any member did not release,
// release.failed naming each one and what the others deleted.
func (m *Machine) publishReleased() []Effect {
	res := m.op.ores
	h := events.OutcomeHeader{Run: m.cfg.Run, CheckpointID: res.OpID, Epoch: m.op.phase.Header().Epoch}
	keep := res.Keep
	if keep == nil {
		keep = []string{}
	}
	var out events.Data = events.ReleaseCompleted{OutcomeHeader: h, Keep: keep, Deleted: res.Deleted}
	if res.Failure != nil {
		f := events.ReleaseFailed{OutcomeHeader: h, Keep: keep, Reason: res.Failure.Reason, Errors: res.Failure.Errors}
		if len(res.MemberDeleted) > 0 {
			f.Deleted = res.MemberDeleted
		}
		out = f
	}
	m.want = wantOutcomePublished
	return []Effect{PublishOutcome{ID: res.OpID, Outcome: out, Replayed: m.op.replayed}}
}

// keepSet resolves a release request to the committed checkpoints kept:
// those it names (each must be committed) and the newest KeepLatest.
func keepSet(all []events.CheckpointManifest, req bridgeapi.ReleaseRequest) ([]string, error) {
	committed := map[string]bool{}
	var order []string
	for _, c := range all {
		if !c.Aborted {
			committed[c.CheckpointID] = true
			order = append(order, c.CheckpointID)
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
	// A kept checkpoint restores what it carries from older ones: they
	// stay while one that is kept names them (PROTOCOL §5, Progress only
	// moves forward).
	for _, c := range all {
		if !keep[c.CheckpointID] {
			continue
		}
		for _, cr := range c.Carried {
			if committed[cr.From] {
				keep[cr.From] = true
			}
		}
	}
	out := make([]string, 0, len(keep))
	for k := range keep {
		out = append(out, k)
	}
	sort.Strings(out)
	return out, nil
}
