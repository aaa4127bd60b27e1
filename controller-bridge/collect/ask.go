package collect

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/client"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
)

// lostAnswerWait bounds how long the collector asks again, for the same
// checkpoint id, a bridge whose answer was lost: long enough for a bridge
// to be started again and finish what the dead one left open.
const lostAnswerWait = 2 * time.Minute

// nextCheckpointID names the collector's next checkpoint: the time to the
// millisecond and the collector's own count, so that two collectors, or
// one started again, do not pick the same id.
func (c *Collector) nextCheckpointID(now time.Time) string {
	c.mu.Lock()
	c.ckptSeq++
	n := c.ckptSeq
	c.mu.Unlock()
	u := now.UTC()
	return "c-" + u.Format("20060102T150405") + "-" + fmt.Sprintf("%03d", u.Nanosecond()/int(time.Millisecond)) + "-" + strconv.Itoa(n)
}

// askCheckpoint asks the bridge for checkpoint req.ID. If the answer is
// lost (the bridge died, the connection broke, the bridge was stopping)
// it asks again for the same id until a bridge answers or lostAnswerWait
// passes: a bridge started again first finishes what the dead one left
// open, and an id that committed or failed returns that result. So a
// checkpoint the bridge committed is counted once, with its timings, and
// none is taken twice. lost reports whether the first answer was lost.
func (c *Collector) askCheckpoint(ctx context.Context, req bridgeapi.CheckpointRequest) (res *bridgeapi.CheckpointResult, lost bool, err error) {
	res, err = c.cfg.Controller.Checkpoint(ctx, req)
	if err == nil || !answerLost(err) {
		return res, false, err
	}
	wctx, cancel := context.WithTimeout(ctx, lostAnswerWait)
	defer cancel()
	first := err
	werr := poll.Until(wctx, poll.Backoff(100*time.Millisecond, 2*time.Second), func() (bool, error) {
		c.log.Warn().Err(err).Str("checkpoint", req.ID).Msg("the bridge's answer was lost; asking it what became of the checkpoint")
		res, err = c.cfg.Controller.Checkpoint(wctx, req)
		return err == nil || !answerLost(err), nil
	})
	switch {
	case err == nil:
		return res, true, nil
	case werr != nil && ctx.Err() == nil:
		return nil, true, fmt.Errorf("collect: checkpoint %s: no bridge answered in %s: %w (first: %w)", req.ID, lostAnswerWait, err, first)
	}
	return nil, true, err
}

// answerLost reports whether err leaves the fate of a checkpoint unknown:
// anything but a bridge's decided refusal (a 4xx, or one of bridgeapi's
// errors in process) and the end of the caller's context.
func answerLost(err error) bool {
	var ce *client.Error
	switch {
	case errors.As(err, &ce):
		return ce.Status >= 500
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, bridgeapi.ErrBusy), errors.Is(err, bridgeapi.ErrNotFound), errors.Is(err, bridgeapi.ErrFenced),
		errors.Is(err, bridgeapi.ErrBadRequest), errors.Is(err, bridgeapi.ErrTooLarge), errors.Is(err, bridgeapi.ErrNoFreshMember),
		errors.Is(err, bridgeapi.ErrReleased), errors.Is(err, events.ErrInvalid):
		return false
	}
	return true
}
