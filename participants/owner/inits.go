package owner

import (
	"context"
	"time"
)

// initPoll is how often the owner looks for sandboxes whose init exited.
const initPoll = 250 * time.Millisecond

// watchInits tells the run of every sandbox daemon that died, until ctx
// ends: every initPoll it asks w whether the init of each session's
// sandbox (its daemon) has exited, and deletes the heartbeat of one that
// has, once; a delete the bus refused is tried again at the
// next look. The bridge and the agents follow the daemons' heartbeats and
// take a deleted one for gone at once (PROTOCOL §3, Liveness): without the
// delete it lives the sandbox TTL after the daemon died, and a phase waits
// until the bridge's asking finds the daemon silent.
func (o *Owner) watchInits(ctx context.Context, w InitWatcher) {
	// told holds, by sandbox, when its daemon's heartbeat was deleted;
	// again, those deleted a second time, redeleteAfter later: a last
	// heartbeat the daemon sent before it died may land after the first.
	told := map[string]time.Time{}
	again := map[string]bool{}
	tick := time.NewTicker(initPoll)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		live := map[string]bool{}
		for _, id := range o.runningSandboxes() {
			if ctx.Err() != nil {
				return
			}
			live[id] = true
			at, done := told[id]
			switch {
			case done && (again[id] || time.Since(at) < redeleteAfter):
				continue
			case !done && !w.InitExited(id):
				continue
			}
			if err := o.deleteDaemon(ctx, id); err != nil {
				o.log.Warn().Err(err).Str("sandbox", id).Msg("the sandbox's init, its daemon, exited; its heartbeat could not be deleted yet")
				continue
			}
			if done {
				again[id] = true
				continue
			}
			told[id] = time.Now()
			o.log.Info().Str("sandbox", id).Msg("the sandbox's init, its daemon, exited: its heartbeat deleted")
		}
		for id := range told {
			if !live[id] {
				delete(told, id)
				delete(again, id)
			}
		}
	}
}

// redeleteAfter is when a dead daemon's heartbeat is deleted a second
// time, after the first.
const redeleteAfter = 2 * time.Second

// runningSandboxes returns the ids of the sandboxes of the owner's
// sessions that no end is stopping.
func (o *Owner) runningSandboxes() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]string, 0, len(o.sessions))
	for _, s := range o.sessions {
		if s.Sandbox != nil && !o.stopping[s.Sandbox.ID] {
			out = append(out, s.Sandbox.ID)
		}
	}
	return out
}
