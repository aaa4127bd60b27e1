package member

import (
	"fmt"
	"slices"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

func (m *Machine) prepare(now time.Time, d events.Prepare, beforeStart bool) []Effect {
	h, p := d.PhaseHeader, events.PhasePrepare
	if eff := m.recorded(h, p); eff != nil {
		return eff
	}
	if beforeStart && !m.served && m.state == StateIdle {
		// The process the bridge addressed is gone, and its work with it:
		// preparing for it would put this process's nothing in its place
		// and make it one a restore can no longer go into.
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, &events.AckError{Code: events.CodeRestarted,
			Detail: "the prepare was published before this process of the member started: it addressed the process before, whose work is gone"})}
	}
	if e := m.admit(h, p, StateIdle, StatePreparing); e != nil {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, e)}
	}
	if m.restore != 0 {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, &events.AckError{Code: events.CodeInvalidPhase, Detail: "a restore of " + m.open + " is in progress"})}
	}
	if e := deadlinePassed(now, h, p); e != nil {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, e)}
	}
	if m.state == StateIdle {
		if e := m.transition(StatePreparing); e != nil {
			return []Effect{m.fail(p, h.Seq, h.CheckpointID, e)}
		}
		m.open = h.CheckpointID
		m.served = true
	}
	m.extendLease(h.Deadline)
	o := m.newOp(h.CheckpointID, p, h.Seq, d)
	m.prepares[o] = m.ops[o]
	return []Effect{WaitReady{
		Op:         o,
		Checkpoint: Checkpoint{Run: h.Run, ID: h.CheckpointID, Seq: h.Seq, Epoch: h.Epoch, Deadline: h.Deadline},
		ReplyAt:    ReplyAt(now, h.Deadline),
	}}
}

func (m *Machine) readiness(now time.Time, in ReadinessReported) []Effect {
	o, ok := m.prepares[in.Op]
	if !ok {
		return nil // cancelled by a resume or a lease expiry, already answered
	}
	delete(m.prepares, in.Op)
	delete(m.ops, in.Op)
	p, seq, id := events.PhasePrepare, o.seqs[0], o.id
	if in.Err != nil {
		e := &events.AckError{Code: events.CodeInternal, Detail: "prepare: " + in.Err.Error()}
		if m.open == id && m.state == StatePreparing {
			// A prepare that fails reopens admission, so that state and
			// admission never disagree; the id is not fenced.
			out := m.reopen(id, false, "prepare failed", e)
			return append(out, m.fail(p, seq, id, e))
		}
		return []Effect{m.fail(p, seq, id, e)}
	}
	if eff := m.recorded(events.PhaseHeader{CheckpointID: id, Seq: seq}, p); eff != nil {
		return eff // another prepare of the same id got there first
	}
	if m.open != id || m.state != StatePreparing {
		return []Effect{m.fail(p, seq, id, &events.AckError{Code: events.CodeInvalidPhase, Detail: "state " + m.describe()})}
	}
	rep := in.Report
	if rep.Ready {
		if e := m.transition(StatePrepared); e != nil {
			return []Effect{m.fail(p, seq, id, e)}
		}
		m.restarts = slices.Clone(rep.Restarts)
		body := func(h events.AckHeader) events.Data {
			return events.PrepareAck{AckHeader: h, Ready: true, Restarts: slices.Clone(rep.Restarts), Counts: rep.Counts, Pause: rep.Pause}
		}
		m.replies[replyKey{id, p}] = body
		return []Effect{m.ok(p, seq, id, body)}
	}
	// Not ready by the reply time: admission stays closed, the blockers
	// are listed, nothing is recorded.
	return []Effect{m.ok(p, seq, id, func(h events.AckHeader) events.Data {
		a := events.PrepareAck{AckHeader: h, Restarts: slices.Clone(rep.Restarts), Counts: rep.Counts, Pause: rep.Pause}
		a.SetBlockers(rep.Blockers)
		return a
	})}
}

func (m *Machine) renew(d events.Renew) []Effect {
	h, p := d.PhaseHeader, events.PhaseRenew
	allowed := []State{StatePreparing, StatePrepared, StateCommitted, StateRestored}
	if m.restore != 0 && m.open == h.CheckpointID {
		allowed = append(allowed, StateIdle)
	}
	if e := m.admit(h, p, allowed...); e != nil {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, e)}
	}
	m.extendLease(h.Deadline)
	lease := m.lease
	return []Effect{m.ok(p, h.Seq, h.CheckpointID, func(h events.AckHeader) events.Data {
		return events.RenewAck{AckHeader: h, Lease: lease}
	})}
}

func (m *Machine) commitPhase(now time.Time, d events.Commit) []Effect {
	h, p := d.PhaseHeader, events.PhaseCommit
	if eff := m.recorded(h, p); eff != nil {
		return eff
	}
	if e := m.admit(h, p, StatePrepared); e != nil {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, e)}
	}
	if m.commit != 0 {
		o := m.ops[m.commit]
		prev := o.data.(events.Commit)
		if prev.Stop != d.Stop || !sameEpisodes(prev.Scope, d.Scope) {
			return []Effect{m.fail(p, h.Seq, h.CheckpointID, &events.AckError{Code: events.CodeCheckpointConflict,
				Detail: fmt.Sprintf("checkpoint %s is already being committed with another scope or stop", h.CheckpointID)})}
		}
		m.extendLease(h.Deadline)
		o.seqs = append(o.seqs, h.Seq) // answered with the commit in flight
		return nil
	}
	m.extendLease(h.Deadline)
	if e := deadlinePassed(now, h, p); e != nil {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, e)}
	}
	// Export once per checkpoint id: a later commit writes the same
	// records again, and only for the scope they were exported for.
	var reuse *Export
	if ex, ok := m.exports[h.CheckpointID]; ok {
		if !sameEpisodes(ex.Scope, d.Scope) {
			return []Effect{m.fail(p, h.Seq, h.CheckpointID, &events.AckError{Code: events.CodeCheckpointConflict,
				Detail: fmt.Sprintf("checkpoint %s was exported for another scope: %d episodes, this commit names %d", h.CheckpointID, len(ex.Scope), len(d.Scope))})}
		}
		reuse = &ex
	}
	m.commit = m.newOp(h.CheckpointID, p, h.Seq, d)
	return []Effect{WriteCommit{Op: m.commit, Commit: d, Restarts: slices.Clone(m.restarts), Export: reuse}}
}

func (m *Machine) written(in RecordsWritten) []Effect {
	if m.commit == 0 || m.commit != in.Op {
		return nil // the commit was resumed: its manifest is never created
	}
	if in.Export != nil {
		// Kept even when the write failed: the next commit of this
		// checkpoint writes these records, it does not export again.
		m.exports[m.ops[in.Op].id] = Export{Scope: slices.Clone(in.Export.Scope), Records: slices.Clip(in.Export.Records)}
	}
	if in.Err != nil {
		return m.finishCommit(in.Err)
	}
	// The commit ack is the manifest's one record (PROTOCOL §5, commit):
	// once-only by its subject, so nothing else is written.
	m.ops[in.Op].manifest = in.Manifest
	return m.finishCommit(nil)
}

// finishCommit answers every event waiting on the commit in flight: with
// e (the member stays prepared and a later commit tries again), or, when
// e is nil, with the manifest the op carries (the member is committed and
// the reply is recorded).
func (m *Machine) finishCommit(e *events.AckError) []Effect {
	o := m.ops[m.commit]
	delete(m.ops, m.commit)
	m.commit = 0
	p := events.PhaseCommit
	if e == nil {
		e = m.transition(StateCommitted)
	}
	var out []Effect
	if e != nil {
		for _, seq := range o.seqs {
			out = append(out, m.fail(p, seq, o.id, e))
		}
		return out
	}
	man := o.manifest
	body := func(h events.AckHeader) events.Data {
		if man.Count == 0 && man.Size == 0 {
			// Exported nothing: no manifest (no object, no list entry).
			return events.CommitAck{AckHeader: h}
		}
		mm := man
		mm.Episodes = slices.Clone(man.Episodes)
		return events.CommitAck{AckHeader: h, Manifest: &mm}
	}
	m.replies[replyKey{o.id, p}] = body
	if o.data.(events.Commit).Stop {
		m.stopCommit, m.parked = o.id, false
	}
	for _, seq := range o.seqs {
		out = append(out, m.ok(p, seq, o.id, body))
	}
	return out
}

func (m *Machine) resume(d events.Resume) []Effect {
	h, p := d.PhaseHeader, events.PhaseResume
	id := h.CheckpointID
	if m.resumedSet[id] {
		return []Effect{m.ok(p, h.Seq, id, nil)} // idempotent
	}
	if m.open == "" {
		// Never saw this id (a prepare that never reached us): fence it
		// anyway, so a late prepare cannot close admission.
		m.fence(id)
		return []Effect{m.ok(p, h.Seq, id, nil)}
	}
	if m.open != id {
		return []Effect{m.fail(p, h.Seq, id, &events.AckError{Code: events.CodeCheckpointConflict,
			Detail: fmt.Sprintf("checkpoint %s is open (state %s)", m.open, m.describe())})}
	}
	out := m.reopen(id, true, reasonResume, nil)
	return append(out, m.ok(p, h.Seq, id, nil))
}

// reopen ends the open checkpoint id: every event waiting on one of its
// handlers is answered (with cause, or stale_checkpoint), what it exported
// is dropped, the id is fenced and its recorded replies dropped if fence
// is set, and the member is idle.
func (m *Machine) reopen(id string, fence bool, reason string, cause *events.AckError) []Effect {
	out := []Effect{Reopen{CheckpointID: id, Reason: reason}}
	var waiting []*op
	for _, k := range m.sortedOps() {
		o := m.ops[k]
		if o.id == id && (o.phase == events.PhasePrepare || o.phase == events.PhaseCommit || o.phase == events.PhaseRestore) {
			waiting = append(waiting, o)
			delete(m.ops, k)
			delete(m.prepares, k)
			if m.commit == k {
				m.commit = 0
			}
			if m.restore == k {
				m.restore = 0
			}
		}
	}
	delete(m.exports, id)
	if fence {
		m.fence(id)
		for k := range m.replies {
			if k.id == id {
				delete(m.replies, k)
			}
		}
	}
	if m.state != StateIdle {
		m.state = StateIdle // every state may resume (successors)
	}
	m.open, m.lease, m.restarts, m.stopCommit, m.parked = "", time.Time{}, nil, "", false
	e := cause
	if e == nil {
		e = &events.AckError{Code: events.CodeStaleCheckpoint, Detail: fmt.Sprintf("checkpoint %s ended (%s) while this phase ran", id, reason)}
	}
	for _, o := range waiting {
		for _, seq := range o.seqs {
			out = append(out, m.fail(o.phase, seq, o.id, e))
		}
	}
	return out
}

func (m *Machine) tick(now time.Time) []Effect {
	if m.lease.IsZero() || now.Before(m.lease) || m.open == "" {
		return nil
	}
	if m.state == StateCommitted && m.stopCommit == m.open {
		// A stop commit whose outcome never came: the bridge died between
		// this member's commit and the outcome. The checkpoint may well be
		// committed, and a restore would then continue this export
		// elsewhere; resuming it here would run that work twice. Park it,
		// as the outcome would have, and stay closed: a bridge that comes
		// back finishes the checkpoint (an abort resumes the member).
		if m.parked {
			return nil
		}
		m.parked = true
		return []Effect{Park{CheckpointID: m.open, Records: m.exports[m.open].Records, LeaseExpired: true}}
	}
	// The bridge is gone: resume by ourselves (PROTOCOL §5, Lease).
	return m.reopen(m.open, true, "lease expired", nil)
}

// missed ends the operation open on the member once the feed shows that
// the run went on to another (PhasesMissed), as the lease would when it
// runs out, only sooner: the lease ends it anyway, and the member need not
// refuse the next operation until then. A member committed with stop, or
// whose checkpoint's newest commit had stop (one it could not commit, its
// deadline past), is left to the lease (§5, Lease): its fleet is parked.
func (m *Machine) missed(in PhasesMissed) []Effect {
	if m.open == "" || m.open == in.Next || !m.epochSet || in.Epoch != m.epoch {
		return nil
	}
	if m.open == m.stopCommit || m.open == in.StopCommit {
		return nil
	}
	return m.reopen(m.open, true, reasonMissed, nil)
}

func (m *Machine) outcome(c events.CheckpointCommitted) []Effect {
	if m.state != StateCommitted || m.stopCommit == "" || m.stopCommit != c.CheckpointID || m.parked {
		return nil
	}
	if !events.Includes(c.Members, m.self) {
		return nil
	}
	m.parked = true
	return []Effect{Park{CheckpointID: c.CheckpointID, Records: m.exports[c.CheckpointID].Records}}
}
