package collect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	agent "github.com/stillpoint/stillpoint/participants/agent/agentapi"
)

// branchInfo is a branch the collection adopted from a BranchCompleted.
type branchInfo struct {
	of      string // the parent rollout
	k       int
	seed    uint64
	source  string // the checkpoint branched from
	attempt int    // the attempt its agent installed last (a branch made again: a later one)
	agent   string
	// instance is the agent's process that installed it (when the bridge
	// said): its first send names it, so that a successor refuses it.
	instance string
}

// BranchStat is one branch of the collection, as its summary lists it.
type BranchStat struct {
	RolloutID string `json:"rollout_id"`
	BranchOf  string `json:"branch_of"`
	Branch    int    `json:"branch"`
	Seed      uint64 `json:"seed"`
	Source    string `json:"source_checkpoint_id"`
	// Outcome is its results line's ("" while it runs), Reward its
	// verdict's "reward" when it has one.
	Outcome string   `json:"outcome,omitempty"`
	Reward  *float64 `json:"reward,omitempty"`
}

// settleEvery is how often a collection whose rollouts all have a result
// asks again whether a branch operation is still open.
const settleEvery = time.Second

// branchSubjects are the subjects of a run's branch operations: the
// phase, and its two outcomes.
func branchSubjects(run string) []string {
	return []string{events.PhaseSubject(run, events.PhaseBranch), events.OutcomeSubject(run, events.TypeBranchCompleted),
		events.OutcomeSubject(run, events.TypeBranchFailed)}
}

// lastBranchSeq returns the stream sequence of the run's newest branch
// event (0: none), read from the stream's leader.
func (c *Collector) lastBranchSeq(ctx context.Context) (uint64, error) {
	var last uint64
	for _, subj := range branchSubjects(c.cfg.Run) {
		m, err := jetstream.LeaderLastMsg(ctx, c.cfg.Conn, jetstream.StreamName, subj)
		if errors.Is(err, natsjs.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("collect: branch events: %w", err)
		}
		last = max(last, m.Sequence)
	}
	return last, nil
}

// followBranches reads the run's branch events from the start of the
// stream, adopting every branch a BranchCompleted made (a collector
// started again finds them again), up to the newest one there now; then
// it follows the new ones in a goroutine of c.work until ctx ends. prior
// is the dispatch log as openFiles read it: a branch dispatched before is
// not queued as a first send (the recovery asks that attempt again).
func (c *Collector) followBranches(ctx context.Context, prior map[string]dispatchEntry) error {
	last, err := c.lastBranchSeq(ctx)
	if err != nil {
		return err
	}
	cons, err := c.cfg.JS.OrderedConsumer(ctx, jetstream.StreamName, natsjs.OrderedConsumerConfig{
		FilterSubjects: branchSubjects(c.cfg.Run), DeliverPolicy: natsjs.DeliverAllPolicy})
	if err != nil {
		return fmt.Errorf("collect: branch events consumer: %w", err)
	}
	it, err := cons.Messages()
	if err != nil {
		return fmt.Errorf("collect: branch events: %w", err)
	}
	for c.branchSeqRead() < last {
		m, err := it.Next(natsjs.NextContext(ctx))
		if err != nil {
			it.Stop()
			return fmt.Errorf("collect: read the branch events: %w", err)
		}
		c.onBranchMsg(m, prior)
	}
	c.work.Go(func() {
		defer it.Stop()
		for {
			m, err := it.Next(natsjs.NextContext(ctx))
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				err = fmt.Errorf("collect: following the branch events: %w", err)
				c.log.Error().Err(err).Msg("stopping the collection: branches made from now on would go unseen")
				c.mu.Lock()
				if c.fatal == nil {
					c.fatal = err
				}
				c.mu.Unlock()
				c.signal()
				return
			}
			c.mu.Lock()
			sent := c.sentTo
			c.mu.Unlock()
			c.onBranchMsg(m, sent)
		}
	})
	return nil
}

// branchSeqRead returns the stream sequence of the last branch event read.
func (c *Collector) branchSeqRead() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.branchSeq
}

// onBranchMsg reads one branch event: a phase opens its operation, an
// outcome closes it, and a BranchCompleted's branches are adopted.
func (c *Collector) onBranchMsg(m natsjs.Msg, sent map[string]dispatchEntry) {
	defer c.signal()
	md, err := m.Metadata()
	if err != nil {
		c.log.Warn().Err(err).Msg("a branch event without metadata; skipped")
		return
	}
	_, d, derr := events.Unmarshal(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
	c.mu.Lock()
	defer c.mu.Unlock()
	if md.Sequence.Stream <= c.branchSeq {
		return
	}
	c.branchSeq = md.Sequence.Stream
	if derr != nil {
		c.log.Warn().Err(derr).Uint64("stream_seq", md.Sequence.Stream).Str("subject", m.Subject()).Msg("a branch event that does not decode; skipped")
		return
	}
	switch o := d.(type) {
	case events.Branch:
		if !c.branchClosed[o.CheckpointID] {
			c.branchOpen[o.CheckpointID] = true
		}
	case events.BranchCompleted:
		delete(c.branchOpen, o.CheckpointID)
		c.branchClosed[o.CheckpointID] = true
		c.adopt(o, sent)
	case events.BranchFailed:
		delete(c.branchOpen, o.CheckpointID)
		c.branchClosed[o.CheckpointID] = true
		c.sum.BranchesFailed += len(o.Branches)
		c.log.Warn().Str("op", o.CheckpointID).Int("branches", len(o.Branches)).Strs("retired", o.Retired).Msg("a branch operation failed: its branches were retired, the parents go on")
	}
}

// adopt adds each branch of o as a task of the collection: the parent's
// payload under the branch's rollout id, queued to continue at its first
// attempt on the agent that installed it, as a restored attempt is. A
// branch already written (a collector started again) is only known; one
// dispatched before (in sent) is left to the recovery. The caller holds
// c.mu.
func (c *Collector) adopt(o events.BranchCompleted, sent map[string]dispatchEntry) {
	adopted := 0
	for _, b := range o.Branches {
		id := b.Episode.Rollout
		parent, ok := c.byID[b.Parent.Rollout]
		if !ok {
			c.log.Warn().Str("op", o.CheckpointID).Str("branch", id).Msg("a branch of a rollout this collection does not collect; not adopted")
			continue
		}
		if _, dup := c.byID[id]; dup {
			bi, ok := c.branches[id]
			switch {
			case ok && bi.source == o.Source && b.Episode.Attempt > bi.attempt:
				c.madeAgain(id, b, o.Agents[id], o.Instances[o.Agents[id]])
			case !ok || bi.attempt != b.Episode.Attempt || bi.source != o.Source:
				c.log.Warn().Str("op", o.CheckpointID).Str("branch", id).Msg("a branch whose rollout id the collection already has; not adopted again")
			}
			continue
		}
		name, instance := "", ""
		if m, ok := o.Agents[id]; ok && m.Kind() == events.KindAgent {
			name, instance = m.Name(), o.Instances[m]
		}
		t := Task{RolloutID: id, Task: parent.Task, BranchOf: parent.RolloutID, Branch: b.K}
		c.cfg.Tasks = append(c.cfg.Tasks, t)
		c.byID[id] = t
		c.branches[id] = branchInfo{of: parent.RolloutID, k: b.K, seed: b.Seed, source: o.Source, attempt: b.Episode.Attempt, agent: name, instance: instance}
		adopted++
		if _, done := c.done[id]; done {
			continue
		}
		if name == "" {
			ep := b.Episode.String()
			c.write(Result{RolloutID: id, Attempt: b.Episode.Attempt, Episode: ep, Outcome: OutcomeInfraFailed,
				Error: fmt.Sprintf("branch %s: operation %s names no agent that installed it", ep, o.CheckpointID), Time: time.Now().UTC()})
			continue
		}
		c.route[id] = name
		if e, ok := sent[id]; ok && e.Attempt >= b.Episode.Attempt {
			continue
		}
		c.attempt[id] = b.Episode.Attempt
		c.restoredQ[id] = b.Episode.Attempt
		c.queue = append(c.queue, id)
	}
	if adopted > 0 {
		c.lastEvent = fmt.Sprintf("branched %s: %d branches", o.Source, adopted)
		c.log.Info().Str("op", o.CheckpointID).Str("source", o.Source).Int("branches", adopted).Msg("branches adopted")
	}
}

// branchStartsOver tells whether sending branch id at attempt would start
// it from its task's input: neither its first send to the agent that holds
// it (installed by the branch, or restored) nor an attempt sent before.
// A branch is its parent's state at the branch point; started over it is
// none, so it is made again from its source instead (rebranch). The
// caller holds c.mu.
func (c *Collector) branchStartsOver(id string, attempt int) bool {
	if _, ok := c.branches[id]; !ok {
		return false
	}
	if a, ok := c.restoredQ[id]; ok && a == attempt {
		return false
	}
	e, ok := c.sentTo[id]
	return !ok || e.Attempt != attempt
}

// branchLost writes branch id infra_failed: what held it was lost before
// a checkpoint did, and it could not be made again from its source (why).
// The caller holds c.mu.
func (c *Collector) branchLost(id string, attempt int, why string) {
	ep := events.Episode{Rollout: id, Attempt: attempt}.String()
	c.log.Error().Str("episode", ep).Str("why", why).Msg("a branch lost before a checkpoint held it could not be made again from its source; written infra_failed")
	c.write(Result{RolloutID: id, Attempt: attempt, Episode: ep, Agent: c.branches[id].agent, Outcome: OutcomeInfraFailed,
		Error: fmt.Sprintf("branch %s was lost before a checkpoint held it, and could not be made again from %s: %s", ep, c.branches[id].source, why),
		Time:  time.Now().UTC()})
	c.lastEvent = id + " infra_failed"
}

// settled tells whether a collection whose rollouts all have a result may
// end: no branch operation open (its phase on the stream without its
// outcome, or the bridge's status naming it open), and every branch event
// on the stream now read, so that a branch completed just before the last
// result was written is adopted and collected first.
func (c *Collector) settled(ctx context.Context) bool {
	c.mu.Lock()
	open := sortedKeys(c.branchOpen)
	c.mu.Unlock()
	if len(open) > 0 {
		c.log.Info().Strs("ops", open).Msg("every rollout has its result; waiting for the branch operations still open")
		return false
	}
	// The status first: an operation it no longer names open has its
	// outcome on the stream, below the sequence read next.
	if st, err := c.cfg.Controller.Status(ctx); err == nil && strings.HasPrefix(st.Open, "branch ") {
		c.log.Info().Str("open", st.Open).Msg("every rollout has its result; waiting for the branch operation the bridge has open")
		return false
	}
	last, err := c.lastBranchSeq(ctx)
	if err != nil {
		c.log.Warn().Err(err).Msg("every rollout has its result; the branch events did not read, asking again")
		return false
	}
	if c.branchSeqRead() < last {
		return false
	}
	return c.finished()
}

// branchStats lists the branches with their outcomes and rewards, in the
// order adopted. The caller holds c.mu.
func (c *Collector) branchStats() []BranchStat {
	var out []BranchStat
	for _, t := range c.cfg.Tasks {
		b, ok := c.branches[t.RolloutID]
		if !ok {
			continue
		}
		st := BranchStat{RolloutID: t.RolloutID, BranchOf: b.of, Branch: b.k, Seed: b.seed, Source: b.source}
		if r, done := c.done[t.RolloutID]; done {
			st.Outcome, st.Reward = r.Outcome, rewardOf(r.Result)
			if st.Outcome == "" && r.OK {
				st.Outcome = OutcomeGraded
			}
		}
		out = append(out, st)
	}
	return out
}

// rewardOf returns the "reward" of a result's verdict, if it has one.
func rewardOf(r *agent.Result) *float64 {
	if r == nil || len(r.Verdict) == 0 {
		return nil
	}
	var v struct {
		Reward *float64 `json:"reward"`
	}
	if json.Unmarshal(r.Verdict, &v) != nil {
		return nil
	}
	return v.Reward
}
