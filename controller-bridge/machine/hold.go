package machine

import (
	"fmt"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
)

// renewEvery is how often a held checkpoint renews the lease: every third
// of the phase timeout.
func (m *Machine) renewEvery() time.Duration { return max(m.op.timeout/3, 10*time.Millisecond) }

// renew asks for a renew of the held checkpoint. It is fenced like every
// publish: once another bridge took the run over, it is refused.
func (m *Machine) renew(now time.Time) []Effect {
	o := m.op
	return m.publish(events.Renew{PhaseHeader: m.header(now, o.id, m.epoch, expected(o.prepare.PhaseHeader), o.timeout)})
}

// unhold checks that id is the held checkpoint and that the run's last
// phase is still the last this machine published for it: another bridge
// that took the run over (and aborted it, or will) fences it.
func (m *Machine) unhold(id string, v View) (fenced []Effect, err error) {
	if m.state != StateHeld || m.op.id != id {
		return nil, fmt.Errorf("%w: no checkpoint %s is held", bridgeapi.ErrNotFound, id)
	}
	if m.want != wantTick {
		return nil, fmt.Errorf("%w: a renew of checkpoint %s is being published", bridgeapi.ErrBusy, id)
	}
	if v.LastID != m.lastID {
		return m.finish(Finish{Err: fmt.Errorf("%w: checkpoint %s is no longer the run's open phase", bridgeapi.ErrFenced, id)})
	}
	m.want = wantNothing
	m.view(v)
	return nil, nil
}

// askCommit commits the held checkpoint, with its own stop flag.
func (m *Machine) askCommit(now time.Time, in CommitAsked) ([]Effect, error) {
	if fenced, err := m.unhold(in.ID, in.View); err != nil || fenced != nil {
		return fenced, err
	}
	m.op.req.Stop = in.Stop
	return m.publishCommit(now)
}

// askAbort abandons the held checkpoint: abort marker, outcome, resume.
func (m *Machine) askAbort(now time.Time, in AbortAsked) ([]Effect, error) {
	if fenced, err := m.unhold(in.ID, in.View); err != nil || fenced != nil {
		return fenced, err
	}
	return m.abort(now, m.op.prepare.PhaseHeader, bridgeapi.Failure{Phase: events.PhasePrepare, Reason: "aborted by the controller"})
}

// shutdown abandons a held checkpoint when the bridge stops, so that the
// fleet does not wait for its lease to run out. It does nothing else.
func (m *Machine) shutdown(now time.Time, in Shutdown) ([]Effect, error) {
	if m.state != StateHeld {
		return nil, nil
	}
	m.want, m.pending = wantNothing, nil
	m.view(in.View)
	return m.abort(now, m.op.prepare.PhaseHeader, bridgeapi.Failure{Phase: events.PhasePrepare,
		Reason: "the bridge stopped while the checkpoint was held"})
}
