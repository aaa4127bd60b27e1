package member

import (
	"fmt"
	"slices"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

func (m *Machine) restorePhase(now time.Time, d events.Restore) []Effect {
	h, p := d.PhaseHeader, events.PhaseRestore
	if eff := m.recorded(h, p); eff != nil {
		return eff
	}
	if m.restore != 0 && m.open == h.CheckpointID {
		o := m.ops[m.restore]
		prev := o.data.(events.Restore)
		if prev.Source != d.Source || !sameEpisodes(prev.Scope, d.Scope) {
			return []Effect{m.fail(p, h.Seq, h.CheckpointID, &events.AckError{Code: events.CodeCheckpointConflict,
				Detail: fmt.Sprintf("restore %s is already running from %s with another scope", h.CheckpointID, prev.Source)})}
		}
		m.extendLease(h.Deadline)
		o.seqs = append(o.seqs, h.Seq)
		return nil
	}
	if e := m.admit(h, p, StateIdle); e != nil {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, e)}
	}
	if m.served {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, &events.AckError{Code: events.CodeInvalidPhase,
			Detail: "restore needs a member that has not served a phase"})}
	}
	if e := deadlinePassed(now, h, p); e != nil {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, e)}
	}
	m.open = h.CheckpointID
	m.extendLease(h.Deadline)
	m.restore = m.newOp(h.CheckpointID, p, h.Seq, d)
	return []Effect{InstallRestore{Op: m.restore, Restore: d}}
}

func (m *Machine) restored(in RestoreFinished) []Effect {
	if m.restore == 0 || m.restore != in.Op {
		return nil
	}
	o := m.ops[m.restore]
	delete(m.ops, m.restore)
	m.restore = 0
	p := events.PhaseRestore
	d := o.data.(events.Restore)
	e := in.Err
	if e == nil {
		e = m.transition(StateRestored)
	}
	if e != nil {
		// All or none: admission reopens, the member stays fresh and idle.
		out := m.reopen(o.id, false, "restore failed", e)
		for _, seq := range o.seqs {
			out = append(out, m.fail(p, seq, o.id, e))
		}
		return out
	}
	m.served = true
	keys := slices.Clone(in.Restored)
	slices.Sort(keys)
	body := func(h events.AckHeader) events.Data {
		return events.RestoreAck{AckHeader: h, Source: d.Source, Restored: slices.Clone(keys)}
	}
	m.replies[replyKey{o.id, p}] = body
	var out []Effect
	for _, seq := range o.seqs {
		out = append(out, m.ok(p, seq, o.id, body))
	}
	return out
}

// branchPhase handles a branch (PROTOCOL §5, Branch): an outside phase
// whose success is recorded, so that a repeat answers what the first
// answered without branching again.
func (m *Machine) branchPhase(h events.PhaseHeader, d events.Branch, beforeStart bool) []Effect {
	p := events.PhaseBranch
	if eff := m.recorded(h, p); eff != nil {
		return eff
	}
	if beforeStart && !m.served && m.state == StateIdle {
		// As for a prepare: the process the bridge addressed is gone, and
		// what it held with it; this one stays one a restore can go into.
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, &events.AckError{Code: events.CodeRestarted,
			Detail: "the branch was published before this process of the member started: it addressed the process before"})}
	}
	return m.outside(h, p, d, beforeStart)
}

// outside handles retire, forget, release and branch: allowed only while
// no checkpoint is open (idle, or restored and not yet resumed).
func (m *Machine) outside(h events.PhaseHeader, p events.Phase, d events.PhaseEvent, beforeStart bool) []Effect {
	if m.restore != 0 || (m.state != StateIdle && m.state != StateRestored) {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, &events.AckError{Code: events.CodeInvalidPhase,
			Detail: fmt.Sprintf("%s is not valid in state %s; resume first", p, m.describe())})}
	}
	if m.state == StateRestored {
		m.extendLease(h.Deadline)
	}
	switch d := d.(type) {
	case events.Retire:
		// Mark first, then stop the work: a request sent before the retire
		// and arriving after it is refused (PROTOCOL §5, retire).
		for _, ep := range d.Episodes {
			if mark, ok := m.marks[ep.Rollout]; !ok || ep.Attempt > mark {
				m.marks[ep.Rollout] = ep.Attempt
			}
		}
		m.marksVersion++
		// A retire published before this process started (a member
		// without a state file) marks, but leaves a member that has served
		// nothing fresh: a restore can still go into it (PROTOCOL §5,
		// Restarted members).
		m.served = m.served || !beforeStart
	case events.Forget:
		for _, r := range d.Rollouts {
			delete(m.marks, r)
		}
		m.marksVersion++
	}
	o := m.newOp(h.CheckpointID, p, h.Seq, d)
	m.calls[o] = m.ops[o]
	return []Effect{CallParticipant{Op: o, Data: d}}
}

func (m *Machine) called(in CallFinished) []Effect {
	o, ok := m.calls[in.Op]
	if !ok {
		return nil
	}
	delete(m.calls, in.Op)
	delete(m.ops, in.Op)
	seq := o.seqs[0]
	if in.Err != nil {
		return []Effect{m.fail(o.phase, seq, o.id, in.Err)}
	}
	if o.phase == events.PhaseBranch {
		keys := slices.Clone(in.Branched)
		slices.Sort(keys)
		if len(keys) > 0 {
			m.served = true
		}
		body := func(h events.AckHeader) events.Data {
			return events.BranchAck{AckHeader: h, Branched: slices.Clone(keys)}
		}
		m.replies[replyKey{o.id, o.phase}] = body
		return []Effect{m.ok(o.phase, seq, o.id, body)}
	}
	if o.phase == events.PhaseRelease {
		deleted := slices.Clone(in.Deleted)
		return []Effect{m.ok(o.phase, seq, o.id, func(h events.AckHeader) events.Data {
			return events.ReleaseAck{AckHeader: h, Deleted: deleted}
		})}
	}
	return []Effect{m.ok(o.phase, seq, o.id, nil)}
}
