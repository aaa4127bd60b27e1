package machine

import (
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
)

// askCheckpoint starts a checkpoint: prepare to the members of the epoch.
// An id that already committed or failed returns that result and opens
// nothing.
func (m *Machine) askCheckpoint(now time.Time, in CheckpointAsked) ([]Effect, error) {
	if err := m.refuseBusy(); err != nil {
		return nil, err
	}
	req := in.Request
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if req.ID == "" {
		req.ID = newCheckpointID(now)
	}
	v := in.View
	if v.Manifest != nil {
		return []Effect{Finish{Checkpoint: bridgeapi.ResultOf(v.Manifest)}}, nil
	}
	if v.Last != nil && v.Last.Header().CheckpointID == req.ID {
		return nil, fmt.Errorf("%w: id %s was already used by %s seq %d", bridgeapi.ErrBadRequest, req.ID, v.Last.Phase(), v.Seq)
	}
	if err := m.to(StatePreparing); err != nil {
		return nil, err
	}
	m.view(v)
	timeout := m.timeout(req.TimeoutMS)
	m.op = &operation{kind: opCheckpoint, id: req.ID, req: req, timeout: timeout, started: now, instances: v.Instances, prev: v.Previous}
	return m.publish(events.Prepare{PhaseHeader: m.header(now, req.ID, m.epoch, v.Members, timeout)}), nil
}

// prepared takes the prepare's verdict: all ready commits (or holds);
// anything else aborts, naming every blocker and member.
func (m *Machine) prepared(now time.Time, t *Tally, v Verdict) ([]Effect, error) {
	o := m.op
	o.prepTally, o.prepMS = t, now.Sub(o.started).Milliseconds()
	prep := o.prepare
	if v != Complete {
		errs, blockers, counts := t.Failure(now)
		return m.abort(now, prep.PhaseHeader, bridgeapi.Failure{Phase: events.PhasePrepare,
			Reason: fmt.Sprintf("%d of %d members not ready, failed or silent", len(errs), len(expected(prep.PhaseHeader))),
			Errors: errs, Blockers: blockers, BlockerCount: counts})
	}
	if o.req.Hold {
		if err := m.to(StateHeld); err != nil {
			return nil, err
		}
		m.want = wantTick
		return []Effect{SetTimer{After: m.renewEvery()}, Finish{Checkpoint: &bridgeapi.CheckpointResult{Run: m.cfg.Run,
			CheckpointID: o.id, Status: bridgeapi.StatusPrepared, Epoch: m.epoch, Members: expected(prep.PhaseHeader),
			PrepareMS: o.prepMS, Restarted: restartsOf(t)}}}, nil
	}
	return m.publishCommit(now)
}

// publishCommit asks for the commit: the controller's episodes less the
// restarts, to the members that prepared (a sandbox daemon excused at
// prepare, its sandbox stopped, is not asked). Sandbox daemons, which
// export nothing (their sandboxes are their owners' to snapshot), are
// asked only to stop: they stay prepared, their launches paused, until
// the resume (PROTOCOL §5, commit).
func (m *Machine) publishCommit(now time.Time) ([]Effect, error) {
	if err := m.to(StateCommitting); err != nil {
		return nil, err
	}
	o := m.op
	o.commitStart = now
	to := o.prepTally.Members()
	if !o.req.Stop {
		to = slices.DeleteFunc(to, func(m events.Member) bool { return m.Kind() == events.KindSandbox })
	}
	c := events.Commit{PhaseHeader: m.header(now, o.id, m.epoch, to, o.timeout),
		Scope: scopeOf(o.req.Episodes, restartsOf(o.prepTally)), Stop: o.req.Stop}
	return m.publish(c), nil
}

// commitGathered takes the commit's verdict: every member exported, and
// the manifests their acks carry are written as the member list; else the
// checkpoint is aborted.
func (m *Machine) commitGathered(now time.Time, t *Tally, v Verdict) ([]Effect, error) {
	o, c := m.op, m.op.commit
	o.members = o.withSandboxes(t.Members())
	if !o.commitStart.IsZero() { // a replay whose commit aged out of the stream has no start
		o.commitMS = max(now.Sub(o.commitStart).Milliseconds(), 0)
	}
	if v != Complete {
		errs, _, _ := t.Failure(now)
		reason := fmt.Sprintf("%d of %d members did not export", len(errs), len(expected(c.PhaseHeader)))
		if o.replayed {
			reason = "the bridge restarted during the commit and not every member exported"
		}
		return m.abort(now, c.PhaseHeader, bridgeapi.Failure{Phase: events.PhaseCommit, Reason: reason, Errors: errs})
	}
	o.commitTally = t
	if err := m.to(StateVerifying); err != nil {
		return nil, err
	}
	var prepSeq uint64
	if o.prepare != nil {
		prepSeq = o.prepare.Seq
	}
	var unfinished map[string]bool
	if o.req.Unfinished != nil {
		unfinished = map[string]bool{}
		for _, k := range o.req.Unfinished {
			unfinished[k] = true
		}
	}
	prev := o.prev
	if prev != nil && prev.CheckpointID == c.CheckpointID {
		prev = nil // LATEST is this checkpoint already: nothing to build
	}
	man, list, err := buildManifest(m.cfg.Run, now, *c, t, restartsOf(o.prepTally), prepSeq, o.prepMS, o.commitMS, prev, unfinished)
	if err != nil {
		effs, aerr := m.abort(now, c.PhaseHeader, bridgeapi.Failure{Phase: events.PhaseCommit, Reason: err.Error()})
		return append([]Effect{Note{Level: LevelWarn, Msg: "member manifests do not verify; aborting: " + err.Error()}}, effs...), aerr
	}
	o.built = &man
	m.want = wantMemberList
	return []Effect{WriteMemberList{CheckpointID: o.id, Object: man.MemberList.Object, Data: list}}, nil
}

// memberListWritten asks for the checkpoint manifest, the commit point,
// once the member list it names is stored.
func (m *Machine) memberListWritten(in MemberListWritten) ([]Effect, error) {
	if err := m.expect(wantMemberList, in); err != nil {
		return nil, err
	}
	m.want = wantManifestCreated
	return []Effect{CreateManifest{Manifest: *m.op.built}}, nil
}

// manifestCreated takes the checkpoint key as it is now. Whoever created
// it first decided: a manifest is the commit point, an abort marker means
// the checkpoint never exists.
func (m *Machine) manifestCreated(now time.Time, in ManifestCreated) ([]Effect, error) {
	if err := m.expect(wantManifestCreated, in); err != nil {
		return nil, err
	}
	have, o := in.Manifest, m.op
	switch {
	case m.state == StateVerifying && have.Aborted:
		o.manifest = &have
		o.failure = &bridgeapi.Failure{Phase: events.PhaseCommit, Reason: have.Reason}
		if err := m.to(StateAborting); err != nil {
			return nil, err
		}
		note := Note{Level: LevelWarn, Msg: "the checkpoint was aborted by another bridge; not committing: " + have.Reason}
		return append([]Effect{note}, m.publishFailed()...), nil
	case m.state == StateVerifying:
		return m.commitPoint(now, have, in.Created)
	case m.state == StateAborting && !have.Aborted:
		note := Note{Level: LevelWarn, Msg: "abort found the checkpoint committed; finishing the commit"}
		effs, err := m.commitPoint(now, have, false)
		return append([]Effect{note}, effs...), err
	case m.state == StateAborting:
		o.manifest = &have
		return m.publishFailed(), nil
	}
	return nil, fmt.Errorf("%w: ManifestCreated in state %s", ErrUnexpected, m.state)
}

// commitPoint: the checkpoint exists. LATEST moves to it.
func (m *Machine) commitPoint(now time.Time, man events.CheckpointManifest, created bool) ([]Effect, error) {
	if err := m.to(StateCommitted); err != nil {
		return nil, err
	}
	m.op.manifest, m.want = &man, wantLatestMoved
	var effs []Effect
	if created {
		effs = append(effs, Note{Level: LevelInfo, Msg: fmt.Sprintf("checkpoint manifest created: %d continued, %d restarted",
			len(man.Continued), len(man.Restarted))})
	}
	return append(effs, MoveLatest{Latest: events.Latest{CheckpointID: man.CheckpointID, Epoch: man.Epoch,
		CommitSeq: man.CommitSeq, Updated: now.UTC()}}), nil
}

// latestMoved reports the checkpoint committed, unless a replay found the
// outcome already there.
func (m *Machine) latestMoved(now time.Time, in LatestMoved) ([]Effect, error) {
	if err := m.expect(wantLatestMoved, in); err != nil {
		return nil, err
	}
	o := m.op
	if o.seen(events.TypeCheckpointCommitted) {
		return m.afterCommitted(now)
	}
	out := committedOutcome(m.cfg.Run, *o.manifest, o.members, o.instances)
	m.want = wantOutcomePublished
	return []Effect{PublishOutcome{ID: o.id, Outcome: out, Replayed: o.replayed}}, nil
}

// committedOutcome is the checkpoint.committed of manifest man: what the
// manifest holds, with each member's export (and its instance, when
// known), as many exports as fit under the payload limit.
func committedOutcome(run string, man events.CheckpointManifest, members []events.Member, instances map[events.Member]string) events.CheckpointCommitted {
	out := events.CheckpointCommitted{OutcomeHeader: events.OutcomeHeader{Run: run, CheckpointID: man.CheckpointID, Epoch: man.Epoch},
		Continued: man.Continued, Restarted: man.Restarted, Carried: man.Carried, Retired: man.Retired, Members: members, PrepareMS: man.PrepareMS, CommitMS: man.CommitMS, Stop: man.Stop,
		Created: man.Created, PrepareSeq: man.PrepareSeq, CommitSeq: man.CommitSeq}
	if out.Members == nil {
		out.Members = []events.Member{}
	}
	exports := make([]events.MemberExport, 0, len(man.Members))
	for _, mm := range man.Members {
		exports = append(exports, events.ExportOf(mm, man.Epoch, instances[mm.Member]))
	}
	out.Exports, out.ExportsCut = events.CapExports(exports, outcomeBudget(out))
	return out
}

// afterCommitted resumes the fleet, except after a stop commit: the fleet
// stays parked until a restore.
func (m *Machine) afterCommitted(now time.Time) ([]Effect, error) {
	if m.op.manifest.Stop {
		return m.finish(Finish{Checkpoint: m.op.result()})
	}
	return m.resume(now, m.op.resumed(), false), nil
}

// abort makes sure the checkpoint never exists: it asks for the abort
// marker, then outcome checkpoint.failed and the resume follow. The
// members of h are those the outcome names and the resume addresses.
func (m *Machine) abort(now time.Time, h events.PhaseHeader, f bridgeapi.Failure) ([]Effect, error) {
	if err := m.to(StateAborting); err != nil {
		return nil, err
	}
	o := m.op
	o.failure, o.members = &f, o.withSandboxes(expected(h))
	marker := events.CheckpointManifest{Schema: events.CheckpointSchema, Run: m.cfg.Run, CheckpointID: h.CheckpointID, Epoch: h.Epoch,
		Created: now.UTC(), Aborted: true, Reason: f.Reason, PrepareMS: o.prepMS}
	m.want = wantManifestCreated
	return []Effect{CreateManifest{Manifest: marker}}, nil
}

// publishFailed reports checkpoint.failed, naming every blocker and
// member.
func (m *Machine) publishFailed() []Effect {
	o := m.op
	m.want = wantOutcomePublished
	f := o.failure
	out := events.CheckpointFailed{OutcomeHeader: events.OutcomeHeader{Run: m.cfg.Run, CheckpointID: o.id, Epoch: o.manifest.Epoch},
		Phase: f.Phase, Reason: f.Reason, Blockers: f.Blockers, BlockerCount: f.BlockerCount, Errors: f.Errors}
	if len(out.Reason) > events.MaxDetail {
		out.Reason = out.Reason[:events.MaxDetail]
	}
	out.Members, out.PrepareMS, out.CommitMS = o.members, o.prepMS, o.commitMS
	if o.prepare != nil {
		out.PrepareSeq = o.prepare.Seq
	}
	if o.commit != nil {
		out.CommitSeq = o.commit.Seq
	}
	if outcomeBudget(out) < 0 {
		out.Members, out.MembersCut = nil, len(o.members)
	}
	return []Effect{PublishOutcome{ID: o.id, Outcome: out, Replayed: o.replayed}}
}

// afterFailed resumes the fleet: the resume is also the abort. A replay
// that found the resume on the stream is done.
func (m *Machine) afterFailed(now time.Time) ([]Effect, error) {
	if m.lastIs(events.PhaseResume, m.op.id) {
		return m.finish(Finish{Checkpoint: m.op.result()})
	}
	return m.resume(now, m.op.resumed(), true), nil
}

// outcomeSlack is what an outcome keeps free below events.MaxDataSize.
const outcomeSlack = 4 << 10

// outcomeBudget is how many more bytes of JSON the outcome may carry and
// stay under the payload limit; below zero when it is over already.
func outcomeBudget(out events.Data) int {
	b, err := json.Marshal(out)
	if err != nil {
		return -1
	}
	return events.MaxDataSize - outcomeSlack - len(b)
}
