package collect

import (
	"context"
	"fmt"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
)

// rebranch makes branch id again, at attempt, from the checkpoint it was
// first made from: what held it was lost before any checkpoint did (its
// agent or sandbox gone, or a restore from a checkpoint older than it),
// and a branch is its parent's state at the branch point, which only its
// source holds; started over from its task's input it would be none. Its
// earlier attempts were retired first (dispatch flushes the retires
// before it). Once the bridge made it, it is queued to continue as a
// restored attempt would; a branch the bridge cannot make again (its
// source released, its parent's holders gone) is written infra_failed,
// naming why. flight gen is the placeholder dispatch left for it.
func (c *Collector) rebranch(ctx context.Context, id string, attempt int, gen uint64) {
	c.mu.Lock()
	bi := c.branches[id]
	c.mu.Unlock()
	req := bridgeapi.BranchRequest{Source: bi.source, Rollouts: []string{bi.of}, N: 1, First: bi.k, Attempt: attempt, Seed: bi.seed}
	c.log.Warn().Str("branch", id).Int("attempt", attempt).Str("source", bi.source).Msg("a branch lost before a checkpoint held it: making it again from its source")
	res, err := c.cfg.Controller.Branch(ctx, req)
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.signal()
	if fl := c.inflight[id]; fl != nil && fl.gen == gen {
		delete(c.inflight, id)
	}
	if ctx.Err() != nil || c.attempt[id] != attempt {
		return // the collection stopped, or moved on (a recovery requeues it)
	}
	why := ""
	switch {
	case err != nil:
		why = err.Error()
	case res.Status != bridgeapi.StatusCompleted:
		why = "the branch operation failed"
		if res.Failure != nil {
			why += ": " + res.Failure.Reason
		}
	case len(res.Branches) != 1 || res.Branches[0].Episode.Rollout != id:
		why = fmt.Sprintf("the bridge made %v", res.Branches)
	}
	if why != "" {
		c.branchLost(id, attempt, why)
		return
	}
	c.madeAgain(id, res.Branches[0], res.Agents[id], "")
}

// madeAgain takes branch id made again (b, installed by agent, whose
// process is instance when known): the branch's new attempt continues
// there, as a restored attempt would. The caller holds c.mu.
func (c *Collector) madeAgain(id string, b events.BranchSpec, agent events.Member, instance string) {
	bi := c.branches[id]
	if b.Episode.Attempt < bi.attempt {
		return
	}
	bi.attempt, bi.seed, bi.instance = b.Episode.Attempt, b.Seed, instance
	if agent.Kind() == events.KindAgent {
		bi.agent = agent.Name()
		c.route[id] = bi.agent
	}
	c.branches[id] = bi
	if _, done := c.done[id]; done || c.inflight[id] != nil || c.restoredQ[id] == b.Episode.Attempt {
		return
	}
	c.attempt[id] = b.Episode.Attempt
	c.restoredQ[id] = b.Episode.Attempt
	c.queue = append(c.queue, id)
	c.lastEvent = fmt.Sprintf("%s made again from %s", id, bi.source)
}
