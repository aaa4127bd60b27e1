package collect

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
)

// nextRestoreID names the collector's next restore as nextCheckpointID
// names its checkpoints, "r-" first.
func (c *Collector) nextRestoreID(now time.Time) string {
	c.mu.Lock()
	c.ckptSeq++
	n := c.ckptSeq
	c.mu.Unlock()
	u := now.UTC()
	return "r-" + u.Format("20060102T150405") + "-" + fmt.Sprintf("%03d", u.Nanosecond()/int(time.Millisecond)) + "-" + strconv.Itoa(n)
}

// restoreRequest is the restore the collector asks for: a new id, and
// its RestoreTimeout as the phase's deadline.
func (c *Collector) restoreRequest(now time.Time) bridgeapi.RestoreRequest {
	return bridgeapi.RestoreRequest{ID: c.nextRestoreID(now), TimeoutMS: c.cfg.RestoreTimeout.Milliseconds()}
}

// askRestore asks the bridge for restore req.ID. If the answer is lost
// (the bridge died mid-restore), it reads what became of the restore from its
// outcome on the stream, and while there is none asks a bridge again for
// the same id, until lostAnswerWait passes: a bridge started again
// finishes the restore the dead one left open before it takes another
// operation, and reports its outcome; a restore that never began is
// simply asked for.
func (c *Collector) askRestore(ctx context.Context, req bridgeapi.RestoreRequest) (*bridgeapi.RestoreResult, error) {
	res, err := c.cfg.Controller.Restore(ctx, req)
	if err == nil || !answerLost(err) {
		return res, err
	}
	first := err
	wctx, cancel := context.WithTimeout(ctx, lostAnswerWait)
	defer cancel()
	werr := poll.Until(wctx, poll.Backoff(100*time.Millisecond, 2*time.Second), func() (bool, error) {
		if out, ok := c.restoreOutcome(wctx, req.ID); ok {
			res, err = out, nil
			return true, nil
		}
		c.log.Warn().Err(err).Str("restore", req.ID).Msg("the bridge's answer was lost; asking it again for the restore")
		res, err = c.cfg.Controller.Restore(wctx, req)
		if err != nil && !answerLost(err) {
			// Refused now (its fleet has served): the refusal came after
			// the restore the dead bridge left was finished.
			if out, ok := c.restoreOutcome(wctx, req.ID); ok {
				res, err = out, nil
			}
		}
		return err == nil || !answerLost(err), nil
	})
	switch {
	case err == nil:
		return res, nil
	case werr != nil && ctx.Err() == nil:
		return nil, fmt.Errorf("collect: restore %s: no bridge answered in %s: %w (first: %w)", req.ID, lostAnswerWait, err, first)
	}
	return nil, err
}

// restoreOutcome reads restore id's outcome from the stream, if it has
// one.
func (c *Collector) restoreOutcome(ctx context.Context, id string) (*bridgeapi.RestoreResult, bool) {
	if c.cfg.JS == nil {
		return nil, false
	}
	entries, err := timeline.Read(ctx, c.cfg.JS, c.cfg.Run, id)
	if err != nil {
		return nil, false
	}
	for _, e := range entries {
		switch o := e.Data.(type) {
		case events.RestoreCompleted:
			return &bridgeapi.RestoreResult{Run: c.cfg.Run, RestoreID: id, Source: o.Source, Status: bridgeapi.StatusCompleted, Restored: o.Restored}, true
		case events.RestoreFailed:
			return &bridgeapi.RestoreResult{Run: c.cfg.Run, RestoreID: id, Source: o.Source, Status: bridgeapi.StatusFailed, Retired: o.Retired}, true
		}
	}
	return nil, false
}
