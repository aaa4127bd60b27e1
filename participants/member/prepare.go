package member

import (
	"context"
	"time"
)

// waitReady asks the participant until it is ready or the reply time
// comes (PROTOCOL §5, prepare): again at once on Notify, and at least
// every PollEvery.
func (m *Member) waitReady(ctx context.Context, e WaitReady) {
	for {
		changed := m.changed()
		rep, err := m.cfg.Participant.Prepare(ctx, e.Checkpoint)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = rep.validate()
		}
		if err != nil {
			m.post(ctx, ReadinessReported{Op: e.Op, Err: err})
			return
		}
		if rep.Ready && len(rep.Blockers) > 0 {
			rep.Ready = false
		}
		left := e.ReplyAt.Sub(m.cfg.Now())
		if rep.Ready || left <= 0 {
			m.post(ctx, ReadinessReported{Op: e.Op, Report: rep})
			return
		}
		t := time.NewTimer(min(m.cfg.PollEvery, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}
