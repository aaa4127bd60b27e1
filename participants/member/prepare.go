package member

import (
	"context"

	"github.com/stillpoint/stillpoint/internal/poll"
)

// waitReady asks the participant until it is ready or the reply time
// comes (PROTOCOL §5, prepare): again at once on Notify, and at least
// every PollEvery. The last answer is the reply: the first ready one, the
// first that fails, or the one that ends at or past the reply time.
func (m *Member) waitReady(ctx context.Context, e WaitReady) {
	rctx, cancel := context.WithTimeout(ctx, e.ReplyAt.Sub(m.cfg.Now()))
	defer cancel()
	var (
		rep  Report
		err  error
		late bool // the last answer ended at or past the reply time
	)
	_ = poll.UntilWoken(rctx, poll.Every(m.cfg.PollEvery), m.changed, func() (bool, error) {
		if late || ctx.Err() != nil {
			return true, nil
		}
		rep, err = m.cfg.Participant.Prepare(ctx, e.Checkpoint)
		if err == nil {
			err = rep.validate()
		}
		if rep.Ready && len(rep.Blockers) > 0 {
			rep.Ready = false
		}
		late = !e.ReplyAt.After(m.cfg.Now())
		return err != nil || rep.Ready || late, nil
	})
	switch {
	case ctx.Err() != nil:
	case err != nil:
		m.post(ctx, ReadinessReported{Op: e.Op, Err: err})
	default:
		m.post(ctx, ReadinessReported{Op: e.Op, Report: rep})
	}
}
