package collect

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
)

// recover brings the collection back after a crash (of the collector, the
// fleet, or both): see the package doc.
func (c *Collector) recover(ctx context.Context, why string) error {
	c.mu.Lock()
	c.recovering = true
	c.lastEvent = "recovering: " + why
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.recovering = false
		c.sum.Recoveries++
		c.mu.Unlock()
		c.signal()
	}()
	c.log.Warn().Str("why", why).Msg("recovering")
	// What is in flight belongs to the fleet that was: drop it.
	c.cancelInflight()
	c.waitInflight(ctx, 10*time.Second)
	// Requests still out are dropped: their late answers find no flight
	// (finish checks the generation), and the recovery requeues them.
	c.mu.Lock()
	clear(c.inflight)
	c.mu.Unlock()

	st, latest, err := c.waitFleet(ctx)
	if err != nil {
		return err
	}
	fresh := true
	live := map[string]string{}
	for _, m := range st.Members {
		if k := m.Member.Kind(); (k == events.KindAgent || k == events.KindOwner) && m.Served {
			fresh = false
		}
		live[string(m.Member)] = m.Instance
	}
	// Rollouts sent to an agent process that still runs are asked again
	// from it; only those whose agent restarted need the checkpoint.
	c.mu.Lock()
	lost := 0
	for id, e := range c.sentTo {
		if _, done := c.done[id]; !done && c.isLost(e, live) {
			lost++
		}
	}
	c.mu.Unlock()
	if lost == 0 {
		c.log.Info().Msg("every agent that holds an unfinished rollout still runs: asking again for the attempts in flight")
		return c.reattach()
	}
	c.log.Warn().Int("lost", lost).Bool("fresh_fleet", fresh).Msg("rollouts whose agent restarted")
	switch {
	case fresh && latest != nil:
		rr, err := c.askRestore(ctx, c.restoreRequest(time.Now()))
		switch {
		case isNoFreshMember(err):
			c.log.Warn().Err(err).Msg("the fleet is not fresh: asking again for the attempts in flight")
			return c.reattach()
		case err != nil:
			return fmt.Errorf("collect: restore: %w", err)
		case rr.Status == bridgeapi.StatusCompleted:
			return c.continueRestored(ctx, latest, rr)
		default:
			c.log.Warn().Strs("retired", rr.Retired).Msg("the restore failed; every unfinished rollout starts over one attempt later")
			return c.restartUnfinished(ctx, rr.Retired)
		}
	case latest != nil:
		// A fleet that served, members of it back fresh: what LATEST
		// holds by those alone continues from it, the rest of the lost
		// rollouts start over.
		return c.rejoin(ctx, st, latest, live)
	default:
		// No checkpoint to restore: the lost agents' rollouts start over
		// one attempt later, the others are asked again.
		return c.partial(ctx, live, nil)
	}
}

// rejoin asks the bridge to continue, from LATEST, each lost rollout
// whose attempt in flight LATEST holds by members that are all fresh now
// (PROTOCOL §5, Rejoin): the members of a node that was gone while the
// rest checkpointed, come back. Then partial sends the rejoined rollouts
// as their restored attempts, to the agent of the name that held them,
// and starts the other lost ones over.
func (c *Collector) rejoin(ctx context.Context, st *bridgeapi.Status, latest *events.CheckpointManifest, live map[string]string) error {
	fresh := map[events.Member]bool{}
	for _, m := range st.Members {
		if !m.Served && m.Member.Kind() != events.KindSandbox {
			fresh[m.Member] = true
		}
	}
	holdings := latest.Holdings()
	var want []string
	c.mu.Lock()
	for id, e := range c.sentTo {
		if _, done := c.done[id]; done || !c.isLost(e, live) {
			continue
		}
		k := events.Episode{Rollout: id, Attempt: c.attempt[id]}.String()
		if h, ok := holdings[k]; ok && len(h.Members) > 0 && !slices.ContainsFunc(h.Members, func(m events.Member) bool { return !fresh[m] }) {
			want = append(want, k)
		}
	}
	c.mu.Unlock()
	if len(want) == 0 {
		return c.partial(ctx, live, nil)
	}
	slices.Sort(want)
	req := c.restoreRequest(time.Now())
	req.Rejoin, req.Episodes = true, want
	c.log.Info().Str("checkpoint", latest.CheckpointID).Strs("episodes", want).Msg("members came back: rejoining their rollouts from the checkpoint that holds them")
	rr, err := c.askRestore(ctx, req)
	switch {
	case isNoFreshMember(err):
		c.log.Warn().Err(err).Msg("no rejoin: the lost rollouts start over")
		return c.partial(ctx, live, nil)
	case err != nil:
		return fmt.Errorf("collect: rejoin: %w", err)
	case rr.Status != bridgeapi.StatusCompleted:
		c.log.Warn().Strs("retired", rr.Retired).Msg("the rejoin failed; the lost rollouts start over")
		return c.rejoinFailed(ctx, live, rr.Retired)
	}
	restored := map[string]int{}
	for _, k := range rr.Restored {
		if ep, err := events.ParseEpisode(k); err == nil {
			restored[ep.Rollout] = ep.Attempt
		}
	}
	route := map[string]string{}
	for _, k := range want {
		ep, _ := events.ParseEpisode(k)
		for _, m := range holdings[k].Members {
			if m.Kind() == events.KindAgent {
				route[ep.Rollout] = m.Name()
			}
		}
	}
	c.mu.Lock()
	c.sum.Rejoins = append(c.sum.Rejoins, latest.CheckpointID)
	for id := range restored {
		if a, ok := route[id]; ok {
			c.route[id] = a
		}
	}
	c.lastEvent = fmt.Sprintf("rejoined %s: %d continue", latest.CheckpointID, len(restored))
	c.mu.Unlock()
	c.log.Info().Str("checkpoint", latest.CheckpointID).Int("continue", len(restored)).Msg("rejoined")
	return c.partial(ctx, live, restored)
}

// rejoinFailed starts the lost rollouts over after a failed rejoin, each
// above the next attempt the bridge retired for it (the rejoin's).
func (c *Collector) rejoinFailed(ctx context.Context, live map[string]string, retired []string) error {
	above := map[string]int{}
	for _, k := range retired {
		if ep, err := events.ParseEpisode(k); err == nil {
			above[ep.Rollout] = max(above[ep.Rollout], ep.Attempt)
		}
	}
	if err := c.partial(ctx, live, nil); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, a := range above {
		if _, done := c.done[id]; !done {
			c.attempt[id] = max(c.attempt[id], a+1)
		}
	}
	return nil
}

// isLost tells whether the attempt of a rollout in flight was sent to an
// agent, or used an owner, that is not the process it was. An attempt
// queued and not sent yet (a restore or rejoin queued it) is not lost.
// The caller holds c.mu.
func (c *Collector) isLost(e dispatchEntry, live map[string]string) bool {
	if e.Attempt != c.attempt[e.RolloutID] {
		return false
	}
	return e.Instance == "" || live["agent."+e.Agent] != e.Instance || (e.Owners != "" && e.Owners != c.ownersFor(e.Agent, live))
}

// ownersFor names the live processes of the owners an agent's rollouts
// use: the one its heartbeat names (events.CapabilityOwner), else every
// owner. The caller holds c.mu.
func (c *Collector) ownersFor(agent string, live map[string]string) string {
	if o, ok := c.agentOwner[agent]; ok {
		return string(o) + "=" + live[string(o)]
	}
	return ownersOf(live)
}

// ownersOf names every live owner's process.
func ownersOf(live map[string]string) string {
	var parts []string
	for m, inst := range live {
		if strings.HasPrefix(m, string(events.KindOwner)+".") {
			parts = append(parts, m+"="+inst)
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// partial handles a fleet that lost some agents when no restore can help
// (nothing committed, or members that served): the rollouts of agents that
// still run are asked again; those a rejoin restored are sent as their
// restored attempts; those of an agent (or owner) that restarted are
// retired (the owner stops their sandboxes) and sent one attempt later.
func (c *Collector) partial(ctx context.Context, live map[string]string, restored map[string]int) error {
	var retire []string
	c.mu.Lock()
	c.queue = nil
	for _, t := range c.cfg.Tasks {
		id := t.RolloutID
		if _, done := c.done[id]; done {
			continue
		}
		if a, ok := restored[id]; ok {
			c.attempt[id] = a
			c.restoredQ[id] = a
		} else if e, sent := c.sentTo[id]; sent && c.isLost(e, live) {
			retire = append(retire, events.Episode{Rollout: id, Attempt: c.attempt[id]}.String())
			c.attempt[id]++
		}
		c.queue = append(c.queue, id)
	}
	c.mu.Unlock()
	c.log.Warn().Int("restart", len(retire)).Int("rejoined", len(restored)).Msg("the fleet served already: rollouts of restarted agents start over one attempt later")
	if len(retire) > 0 {
		slices.Sort(retire)
		if err := c.retire(ctx, retire); err != nil {
			return fmt.Errorf("collect: retire: %w", err)
		}
	}
	return nil
}

// waitFleet waits until every agent and owner, and the members that hold
// records of LATEST (its own or carried), are alive and either all fresh,
// or those that served all answer as the processes that served (none
// restarted, or a partial loss known as such), up to RecoverGrace; it
// returns the bridge's status and LATEST's manifest.
func (c *Collector) waitFleet(ctx context.Context) (*bridgeapi.Status, *events.CheckpointManifest, error) {
	deadline := time.Now().Add(c.cfg.RecoverGrace)
	var st *bridgeapi.Status
	var latest *events.CheckpointManifest
	err := poll.Until(ctx, poll.Every(200*time.Millisecond), func() (bool, error) {
		var err error
		st, err = c.cfg.Controller.Status(ctx)
		if err != nil {
			return false, fmt.Errorf("collect: bridge status: %w", err)
		}
		latest = nil
		if st.Latest != nil {
			if latest, err = c.manifest(ctx, st.Latest.CheckpointID); err != nil {
				return false, err
			}
		}
		alive := map[events.Member]events.MemberInfo{}
		for _, m := range st.Members {
			alive[m.Member] = m
		}
		// Every agent, and every owner the fleet has: one that died and
		// came back loses the rollouts whose sandboxes it held.
		need := map[events.Member]bool{}
		for _, a := range c.cfg.Agents {
			need[events.Member("agent."+a)] = true
		}
		c.mu.Lock()
		for _, o := range c.agentOwner {
			need[o] = true
		}
		c.mu.Unlock()
		for _, m := range st.Members {
			if m.Member.Kind() == events.KindOwner {
				need[m.Member] = true
			}
		}
		if latest != nil {
			for _, m := range latest.CommittedMembers() {
				if m.Kind() != events.KindSandbox {
					need[m] = true
				}
			}
			// The holders of what it carries: members gone at its commit
			// that a restore or a rejoin goes into when they are back.
			for _, cr := range latest.Carried {
				for _, m := range cr.Members {
					if m.Kind() != events.KindSandbox {
						need[m] = true
					}
				}
			}
		}
		ok, fresh, served := true, 0, 0
		var restarted, stayed []events.Member
		for m := range need {
			info, up := alive[m]
			switch {
			case !up:
				ok = false
			case info.Served:
				served++
				stayed = append(stayed, m)
			default:
				fresh++
				restarted = append(restarted, m)
			}
		}
		if ok && served == 0 {
			return true, nil
		}
		// A member that shows the instance that served may be dead with
		// its heartbeat not yet expired, its successor on the way: only
		// one that answers as that process still runs.
		if ok && c.stillRunning(ctx, stayed, alive) {
			if fresh > 0 {
				// A partial loss, known as such: the restarted members'
				// new instances are up and every other one answers as the
				// process that served. No restore can follow (it needs
				// them all fresh); waiting longer would change nothing.
				slices.Sort(restarted)
				slices.Sort(stayed)
				c.log.Info().Strs("restarted", memberNames(restarted)).Strs("still_running", memberNames(stayed)).
					Dur("waited", time.Since(deadline.Add(-c.cfg.RecoverGrace))).
					Msg("partial loss: the restarted members are back and the others answer; going on without waiting out the grace")
			}
			return true, nil
		}
		if time.Now().After(deadline) {
			c.log.Warn().Int("fresh", fresh).Int("served", served).Int("members", len(need)).Msg("the fleet did not settle; going on")
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return nil, nil, err
	}
	return st, latest, nil
}

// stillRunning tells whether each of members answers a ping as the
// instance its heartbeat shows: its process did not die. One that does
// not answer may be dead with its heartbeat not yet expired, its
// successor on the way.
func (c *Collector) stillRunning(ctx context.Context, members []events.Member, alive map[events.Member]events.MemberInfo) bool {
	got, err := c.answering(ctx)
	if err != nil {
		c.log.Debug().Err(err).Msg("ping the members")
		return false
	}
	for _, m := range members {
		if !got[m][alive[m].Instance] {
			return false
		}
	}
	return true
}

// memberNames returns the members as strings, for a log.
func memberNames(ms []events.Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m)
	}
	return out
}

// manifest reads a checkpoint manifest.
func (c *Collector) manifest(ctx context.Context, id string) (*events.CheckpointManifest, error) {
	e, err := c.cfg.Bus.Manifests.Get(ctx, events.ManifestKey(c.cfg.Run, id))
	if err != nil {
		return nil, fmt.Errorf("collect: manifest of %s: %w", id, err)
	}
	var m events.CheckpointManifest
	if err := json.Unmarshal(e.Value(), &m); err != nil {
		return nil, fmt.Errorf("collect: manifest of %s: %w", id, err)
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("collect: manifest of %s: %w", id, err)
	}
	if err := m.LoadMembers(func(o string) ([]byte, error) { return c.cfg.Bus.Checkpoints.GetBytes(ctx, o) }); err != nil {
		return nil, fmt.Errorf("collect: manifest of %s: %w", id, err)
	}
	return &m, nil
}

// continueRestored queues each continued rollout as its restored attempt,
// on the agent that holds it, retires the restored attempts of rollouts
// already written, and starts every other unfinished rollout over one
// attempt later.
func (c *Collector) continueRestored(ctx context.Context, m *events.CheckpointManifest, rr *bridgeapi.RestoreResult) error {
	restored := map[string]int{}
	var retire []string
	c.mu.Lock()
	for _, k := range rr.Restored {
		ep, err := events.ParseEpisode(k)
		if err != nil {
			continue
		}
		if _, ours := c.byID[ep.Rollout]; ours {
			restored[ep.Rollout] = max(restored[ep.Rollout], ep.Attempt)
		}
	}
	c.sum.Restores = append(c.sum.Restores, m.CheckpointID)
	c.route = map[string]string{}
	for _, mm := range m.Members {
		if mm.Member.Kind() != events.KindAgent {
			continue
		}
		for _, k := range mm.Episodes {
			if ep, err := events.ParseEpisode(k); err == nil {
				c.route[ep.Rollout] = mm.Member.Name()
			}
		}
	}
	// A carried episode continues on the agent of the name that held it.
	for _, cr := range m.Carried {
		for _, mem := range cr.Members {
			if mem.Kind() != events.KindAgent {
				continue
			}
			for _, k := range cr.Episodes {
				if ep, err := events.ParseEpisode(k); err == nil {
					c.route[ep.Rollout] = mem.Name()
				}
			}
		}
	}
	c.queue = nil
	for _, t := range c.cfg.Tasks {
		id := t.RolloutID
		a, isRestored := restored[id]
		_, done := c.done[id]
		last, dispatched := c.attempt[id]
		switch {
		case done && isRestored:
			retire = append(retire, events.Episode{Rollout: id, Attempt: a}.String())
		case done:
		case isRestored:
			c.attempt[id] = a
			c.restoredQ[id] = a
			c.queue = append(c.queue, id)
		case dispatched:
			retire = append(retire, events.Episode{Rollout: id, Attempt: last}.String())
			c.attempt[id] = last + 1
			c.queue = append(c.queue, id)
		default:
			c.queue = append(c.queue, id)
		}
	}
	c.lastEvent = fmt.Sprintf("restored %s: %d continue", m.CheckpointID, len(restored))
	c.mu.Unlock()
	c.log.Info().Str("checkpoint", m.CheckpointID).Int("continue", len(restored)).Int("retire", len(retire)).Msg("restored")
	if len(retire) > 0 {
		if err := c.retire(ctx, retire); err != nil {
			return fmt.Errorf("collect: retire after the restore: %w", err)
		}
	}
	return nil
}

// restartUnfinished retires every dispatched unfinished attempt and queues
// it one attempt later (above any attempt a failed restore retired).
func (c *Collector) restartUnfinished(ctx context.Context, retired []string) error {
	above := map[string]int{}
	for _, k := range retired {
		if ep, err := events.ParseEpisode(k); err == nil {
			above[ep.Rollout] = max(above[ep.Rollout], ep.Attempt)
		}
	}
	var retire []string
	c.mu.Lock()
	c.queue = nil
	for _, t := range c.cfg.Tasks {
		id := t.RolloutID
		if _, done := c.done[id]; done {
			continue
		}
		if last, dispatched := c.attempt[id]; dispatched {
			retire = append(retire, events.Episode{Rollout: id, Attempt: last}.String())
			c.attempt[id] = max(last, above[id]) + 1
		}
		c.queue = append(c.queue, id)
	}
	c.mu.Unlock()
	slices.Sort(retire)
	if len(retire) > 0 {
		if err := c.retire(ctx, retire); err != nil {
			return fmt.Errorf("collect: retire: %w", err)
		}
	}
	return nil
}

// reattach asks again for every unfinished attempt: the agents answer from
// the run in flight or from the result they kept.
func (c *Collector) reattach() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queue = nil
	for _, t := range c.cfg.Tasks {
		if _, done := c.done[t.RolloutID]; !done {
			c.queue = append(c.queue, t.RolloutID)
		}
	}
	c.lastEvent = "asking again for the attempts in flight"
	return nil
}
