package collect

import (
	"context"
	"errors"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/client"
	"github.com/stillpoint/stillpoint/internal/poll"
)

// finalRelease releases what the end of the collection does not keep.
// A bridge that is down or restarting (its answer lost, or another
// operation open while it finishes its predecessor's) is asked again, and
// so is one whose release failed because a member did not release (one
// stopped or slow past the phase's deadline, or failing): the next
// release asks the members alive then, and one whose lease ran out is
// not among them. All until lostAnswerWait passes: a release is
// idempotent, and one left undone leaves the run's records and snapshots
// behind.
func (c *Collector) finalRelease(ctx context.Context) {
	req := bridgeapi.ReleaseRequest{KeepLatest: c.cfg.Keep}
	var (
		rel *bridgeapi.OpResult
		err error
	)
	wctx, cancel := context.WithTimeout(ctx, lostAnswerWait)
	defer cancel()
	_ = poll.Until(wctx, poll.Backoff(100*time.Millisecond, 2*time.Second), func() (bool, error) {
		rel, err = c.cfg.Controller.Release(wctx, req)
		if wctx.Err() != nil {
			return true, nil
		}
		if err != nil && (answerLost(err) || isBusy(err)) {
			c.log.Warn().Err(err).Msg("the final release was not answered; asking again")
			return false, nil
		}
		if err == nil && rel.Status == bridgeapi.StatusFailed {
			ev := c.log.Warn().Str("op", rel.OpID)
			if rel.Failure != nil {
				ev = ev.Str("reason", rel.Failure.Reason).Interface("errors", rel.Failure.Errors)
			}
			ev.Msg("the final release failed: a member did not release; asking again")
			return false, nil
		}
		return true, nil
	})
	if err != nil || rel.Status != bridgeapi.StatusCompleted {
		ev := c.log.Error().Err(err)
		if rel != nil && rel.Failure != nil {
			ev = ev.Str("reason", rel.Failure.Reason)
		}
		ev.Msg("final release failed; the run's records and snapshots stay until a release completes (stillpoint release)")
		return
	}
	c.log.Info().Int("keep", c.cfg.Keep).Strs("deleted", rel.Deleted).Msg("released")
}

// isBusy tells the refusal of a bridge with another operation open.
func isBusy(err error) bool {
	var ce *client.Error
	return errors.Is(err, bridgeapi.ErrBusy) || (errors.As(err, &ce) && ce.Code == "checkpoint_conflict")
}
