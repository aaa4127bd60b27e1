package member

import (
	"context"
	"errors"
	"slices"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
)

// reopen ends a checkpoint on the participant's side: it cancels the
// checkpoint's workers and waits for them, then reopens admission through
// the Continuer (whose report goes into the resume ack that follows) or
// the Resumer.
func (m *Member) reopen(ctx context.Context, e Reopen) {
	log := &lazyLog{base: &m.log, with: func(c zerolog.Context) zerolog.Context { return c.Str("checkpoint", e.CheckpointID) }}
	m.withProgress(func() {
		m.cancelWorkers(e.CheckpointID)
		switch r := m.cfg.Participant.(type) {
		case Continuer:
			rep, err := r.Continue(ctx, e.CheckpointID)
			if err != nil {
				log.Error().Err(err).Str("reason", e.Reason).Msg("continuing failed")
			}
			if rep != nil && e.Reason == reasonResume {
				m.continued[e.CheckpointID] = rep // for the resume ack that follows
			}
		case Resumer:
			if err := r.Resume(ctx, e.CheckpointID); err != nil {
				log.Error().Err(err).Str("reason", e.Reason).Msg("reopening admission failed")
			}
		}
	})
	ev := log.Info()
	if e.Reason == "lease expired" {
		ev = log.Warn()
	}
	ev.Str("reason", e.Reason).Msg("admission reopened")
}

// call runs a retire, forget, release or branch on the participant,
// bounded by the phase's deadline.
func (m *Member) call(ctx context.Context, e CallParticipant) CallFinished {
	h := e.Data.Header()
	res := CallFinished{Op: e.Op}
	cctx, cancel := context.WithDeadline(ctx, h.Deadline)
	defer cancel()
	if b, ok := e.Data.(events.Branch); ok {
		m.withProgress(func() { res.Branched, res.Err = m.branch(cctx, b) })
		return res
	}
	var err error
	m.withProgress(func() {
		switch d := e.Data.(type) {
		case events.Retire:
			if r, ok := m.cfg.Participant.(Retirer); ok {
				err = r.Retire(cctx, d.Episodes)
			}
		case events.Forget:
			if f, ok := m.cfg.Participant.(Forgetter); ok {
				err = f.Forget(cctx, d.Rollouts)
			}
		case events.Release:
			if r, ok := m.cfg.Participant.(Releaser); ok {
				res.Deleted, err = r.Release(cctx, slices.Clone(d.Keep))
			}
		}
	})
	switch {
	case err != nil && errors.Is(cctx.Err(), context.DeadlineExceeded):
		res.Err = &events.AckError{Code: events.CodeDeadlineExceeded, Detail: err.Error()}
	case err != nil:
		res.Err = &events.AckError{Code: events.CodeInternal, Detail: err.Error()}
	}
	return res
}
