package collect

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/stillpoint/stillpoint/jetstream/live"
	agent "github.com/stillpoint/stillpoint/participants/agent/agentapi"
)

// The retries of unfinished rollouts: when a rollout the collector could
// not finish (or had to start over) is sent again.

// retryAfter is how long an unfinished rollout waits before it is asked
// again.
const retryAfter = time.Second

// startOverWait is how long a rollout's nth start-over waits before it is
// sent: the first at once, then from retryAfter doubling up to
// maxStartOverWait. What makes an attempt start over can last (a session
// still held while the owner starts its sandbox, a microVM's first start
// of an image), and each start-over retires an attempt on the bus.
func startOverWait(n int) time.Duration {
	if n <= 1 {
		return 0
	}
	return min(retryAfter<<min(n-2, 5), maxStartOverWait)
}

// maxStartOverWait bounds startOverWait.
const maxStartOverWait = 30 * time.Second

// retry is an unfinished rollout to queue again at a time.
type retry struct {
	id string
	at time.Time
}

// nextRetry returns how long until the first retry is due.
func (c *Collector) nextRetry(now time.Time) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.retries) == 0 {
		return 0, false
	}
	first := c.retries[0].at
	for _, r := range c.retries[1:] {
		if r.at.Before(first) {
			first = r.at
		}
	}
	return max(first.Sub(now), 0), true
}

// requeueDue queues the rollouts whose retry is due, unless they ended,
// are in flight or are queued already.
func (c *Collector) requeueDue(now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retries = slices.DeleteFunc(c.retries, func(r retry) bool {
		if r.at.After(now) {
			return false
		}
		if _, done := c.done[r.id]; !done && c.inflight[r.id] == nil && !slices.Contains(c.queue, r.id) {
			c.queue = append(c.queue, r.id)
		}
		return true
	})
}

// errAskAgain ends a rollout request that waited AskAgain unanswered.
var errAskAgain = errors.New("collect: no answer yet; asking again")

// askAgain runs a rollout request, asking it again every AskAgain while
// no answer comes. A repeat names the agent process the request went to
// (SentTo, from the dispatch log): that process answers it from the run
// it has, or the answer it kept; any other refuses it (attempt_lost),
// never runs the attempt a second time. A request whose process the
// dispatch log does not know (sent before the agent's heartbeat was seen)
// is asked once and waited for, as a repeat could reach a successor that
// would run it again.
func (c *Collector) askAgain(ctx context.Context, req *agent.Request, ask func(context.Context, agent.Request) (agent.Result, error)) (agent.Result, error) {
	for {
		if req.SentTo == "" {
			c.mu.Lock()
			known := c.sentTo[req.RolloutID].Instance != ""
			c.mu.Unlock()
			if !known {
				return ask(ctx, *req)
			}
		}
		actx, cancel := context.WithTimeoutCause(ctx, c.cfg.AskAgain, errAskAgain)
		res, err := ask(actx, *req)
		// Its own timeout ended it: the request's deadline, or the wait
		// between two tries of an agent not answering (no responders).
		again := err != nil && ctx.Err() == nil && errors.Is(context.Cause(actx), errAskAgain) &&
			(errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errAskAgain) || live.NoResponders(err))
		cancel()
		if !again {
			return res, err
		}
		if req.SentTo == "" {
			c.mu.Lock()
			req.SentTo = c.sentTo[req.RolloutID].Instance
			c.mu.Unlock()
		}
		c.log.Debug().Str("rollout", req.RolloutID).Int("attempt", req.Attempt).Str("sent_to", req.SentTo).Msg("no answer yet; asking again")
	}
}
