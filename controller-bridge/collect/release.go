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
// operation open while it finishes its predecessor's) is asked again,
// until lostAnswerWait passes: a release is idempotent, and one left
// undone leaves the run's records and snapshots behind.
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
		if err != nil && (answerLost(err) || isBusy(err)) && wctx.Err() == nil {
			c.log.Warn().Err(err).Msg("the final release was not answered; asking again")
			return false, nil
		}
		return true, nil
	})
	if err != nil || rel.Status != bridgeapi.StatusCompleted {
		c.log.Warn().Err(err).Msg("final release failed")
		return
	}
	c.log.Info().Int("keep", c.cfg.Keep).Strs("deleted", rel.Deleted).Msg("released")
}

// isBusy tells the refusal of a bridge with another operation open.
func isBusy(err error) bool {
	var ce *client.Error
	return errors.Is(err, bridgeapi.ErrBusy) || (errors.As(err, &ce) && ce.Code == "checkpoint_conflict")
}
