package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"slices"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/member"
)

var (
	_ member.Participant = (*Agent)(nil)
	_ member.Exporter    = (*Agent)(nil)
	_ member.Resumer     = (*Agent)(nil)
	_ member.Installer   = (*Agent)(nil)
	_ member.Retirer     = (*Agent)(nil)
	_ member.Parker      = (*Agent)(nil)
)

// Prepare implements member.Participant: close admission, ask every run
// to park, and report: a run is ready at its bookmark (queued, between
// stages, held by the checkpoint, or waiting for its grade) or with its
// launch paused in place for this checkpoint; restart-only runs never
// block.
func (a *Agent) Prepare(_ context.Context, cp member.Checkpoint) (member.Report, error) {
	a.mu.Lock()
	if !a.closed || a.open != cp.ID {
		a.closed, a.open = true, cp.ID
	}
	dl := cp.Deadline.Add(-deadlineMargin(cp))
	var rep member.Report
	parked, paused, queued, verifying := 0, 0, 0, 0
	for _, r := range a.runs {
		if r.parkReq == nil || r.parkReq.cp != cp.ID || r.parkReq.seq != cp.Seq {
			r.parkReq = &parkRequest{cp: cp.ID, seq: cp.Seq, dl: dl, reopen: a.reopen}
			select {
			case r.parkCh <- struct{}{}:
			default:
			}
		}
		switch {
		case r.bm.Restart:
			rep.Restarts = append(rep.Restarts, r.key)
		case r.at == atBoundary:
			parked++
			if r.bm.Next == agentapi.StageSeed && !r.seeded {
				queued++
			}
		case r.at == atParked && r.parkedFor == cp.ID:
			paused++
		case r.at == atVerifying:
			verifying++
		default:
			rep.Blockers = append(rep.Blockers, r.key)
		}
	}
	installed := len(a.installed)
	a.mu.Unlock()
	slices.Sort(rep.Blockers)
	slices.Sort(rep.Restarts)
	rep.Ready = len(rep.Blockers) == 0
	rep.Counts = map[string]int{"parked": parked, "paused": paused, "queued": queued, "verifying": verifying,
		"restarts": len(rep.Restarts), "installed": installed}
	return rep, nil
}

// deadlineMargin leaves a run time to fall back to a stop before the
// bridge stops waiting: a third of the time left, from 500 ms to 15 s.
func deadlineMargin(cp member.Checkpoint) time.Duration {
	return min(max(time.Until(cp.Deadline)/3, 500*time.Millisecond), 15*time.Second)
}

// Export implements member.Exporter: the bookmark of every run at a
// boundary (a run waiting for its grade at its verify bookmark) or paused
// for this checkpoint, and of every restored rollout not asked for yet;
// restarts are not exported.
func (a *Agent) Export(_ context.Context, c events.Commit) iter.Seq2[events.Record, error] {
	return member.Records(a.export(c))
}

// export takes the bookmarks of Export under the agent's lock.
func (a *Agent) export(c events.Commit) ([]events.Record, error) {
	scope := map[string]bool{}
	for _, e := range c.Scope {
		scope[e.String()] = true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	var recs []events.Record
	add := func(key string, bm agentapi.Bookmark) error {
		if len(scope) > 0 && !scope[key] {
			return nil
		}
		b, err := json.Marshal(bm)
		if err != nil {
			return fmt.Errorf("agent: bookmark of %s: %w", key, err)
		}
		recs = append(recs, events.Record{Key: key, Data: b})
		return nil
	}
	for _, r := range a.runs {
		if r.bm.Restart {
			continue
		}
		if r.at != atBoundary && !(r.at == atParked && r.parkedFor == c.CheckpointID) && r.at != atVerifying {
			return nil, fmt.Errorf("agent: %s is not at a boundary for %s", r.key, c.CheckpointID)
		}
		if err := add(r.key, r.bm); err != nil {
			return nil, err
		}
	}
	for _, bm := range a.installed {
		if err := add(events.Episode{Rollout: bm.Rollout, Attempt: bm.Attempt}.String(), bm); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(recs, func(x, y events.Record) int { return cmpString(x.Key, y.Key) })
	return recs, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Resume implements member.Resumer: reopen admission; runs at their
// boundary go on, and launches paused in place are continued by their
// daemons.
func (a *Agent) Resume(_ context.Context, checkpointID string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.closed {
		return nil
	}
	if checkpointID != a.open {
		a.log.Warn().Str("checkpoint", checkpointID).Str("open", a.open).Msg("resume of another checkpoint than the open one; reopening")
	}
	a.closed, a.open = false, ""
	close(a.reopen)
	a.reopen = make(chan struct{})
	for _, r := range a.runs {
		r.parkReq = nil
	}
	return nil
}

// Install implements member.Installer: the bookmarks of the restored
// rollouts, all or none; each continues as its next attempt when the
// controller asks for it.
func (a *Agent) Install(ctx context.Context, _ events.Restore, records []events.Record) ([]events.Episode, error) {
	bms := make([]agentapi.Bookmark, 0, len(records))
	eps := make([]events.Episode, 0, len(records))
	var errs []error
	for _, rec := range records {
		ep, err := events.ParseEpisode(rec.Key)
		if err != nil {
			errs = append(errs, fmt.Errorf("record %q: %w", rec.Key, err))
			continue
		}
		bm, err := agentapi.DecodeBookmark(rec.Data)
		if err != nil {
			errs = append(errs, fmt.Errorf("record %s: %w", rec.Key, err))
			continue
		}
		if bm.Rollout != ep.Rollout || bm.Attempt != ep.Attempt {
			errs = append(errs, fmt.Errorf("record %s: %w: it holds %s attempt %d", rec.Key, agentapi.ErrBadBookmark, bm.Rollout, bm.Attempt))
			continue
		}
		bm.Attempt = ep.Next().Attempt
		bms, eps = append(bms, bm), append(eps, ep)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, bm := range bms {
		a.installed[bm.Rollout] = bm
	}
	return eps, nil
}

// Retire implements member.Retirer: cancel the retired attempts' runs (the
// cleanup rule kills their launches and closes their sessions) and drop
// their restored bookmarks; it waits for the runs to end.
func (a *Agent) Retire(ctx context.Context, eps []events.Episode) error {
	mark := map[string]int{}
	for _, e := range eps {
		mark[e.Rollout] = max(mark[e.Rollout], e.Attempt)
	}
	a.mu.Lock()
	var waits []*run
	for id, r := range a.runs {
		if m, ok := mark[id]; ok && r.ep.Attempt <= m {
			r.cancel(fmt.Errorf("%w: %s retired", member.ErrStaleAttempt, r.key))
			waits = append(waits, r)
		}
	}
	for id, bm := range a.installed {
		if m, ok := mark[id]; ok && bm.Attempt <= m {
			delete(a.installed, id)
		}
	}
	for id, r := range a.finished {
		if m, ok := mark[id]; ok && r.ep.Attempt <= m {
			delete(a.finished, id)
		}
	}
	a.mu.Unlock()
	for _, r := range waits {
		select {
		case <-r.done:
		case <-ctx.Done():
			return fmt.Errorf("agent: retire of %s: %w", r.key, ctx.Err())
		}
	}
	return nil
}

// Park implements member.Parker: after a commit with stop, the exported
// runs end with ErrParked and their launches are killed; the checkpoint
// holds their bookmarks.
func (a *Agent) Park(_ context.Context, records []events.Record) error {
	keys := map[string]bool{}
	for _, rec := range records {
		keys[rec.Key] = true
	}
	a.mu.Lock()
	var waits []*run
	for _, r := range a.runs {
		if keys[r.key] {
			r.cancel(ErrParked)
			waits = append(waits, r)
		}
	}
	a.mu.Unlock()
	for _, r := range waits {
		<-r.done
	}
	return nil
}

// capabilities are what the agent's heartbeat says of it: its adapter,
// and the owner whose sandboxes its rollouts use (a collector takes the
// rollouts of an agent as lost when that owner restarted, not another).
func capabilities(cfg Config) []string {
	caps := []string{"adapter:" + cfg.Adapter.Name()}
	if c := events.CapabilityOwner + cfg.Owner; cfg.Owner != "" && events.ValidCapability(c) {
		caps = append(caps, c)
	}
	return caps
}
