package demo

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/client"
	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// branch branches one rollout that checkpoint source holds mid-run (one
// with no result yet) --branches ways, through the bridge's API; the
// collector adopts the branches from the run's stream and writes each
// one's result.
func (d *Fleet) branch(ctx context.Context, col *collect.Collector, bus *jetstream.Bus, ctl *client.Client, source string) error {
	e, err := bus.Manifests.Get(ctx, events.ManifestKey(d.run, source))
	if err != nil {
		return fmt.Errorf("demo: branch: the manifest of %s: %w", source, err)
	}
	var m events.CheckpointManifest
	if err := json.Unmarshal(e.Value(), &m); err != nil {
		return fmt.Errorf("demo: branch: the manifest of %s: %w", source, err)
	}
	done := col.Results()
	parent := ""
	for _, k := range m.Continued {
		if ep, err := events.ParseEpisode(k); err == nil && parent == "" {
			if _, ok := done[ep.Rollout]; !ok {
				parent = ep.Rollout
			}
		}
	}
	if parent == "" {
		return fmt.Errorf("demo: branch: %s holds no rollout without a result", source)
	}
	br, err := ctl.Branch(ctx, bridgeapi.BranchRequest{Source: source, Rollouts: []string{parent}, N: d.f.branches})
	switch {
	case err != nil:
		return fmt.Errorf("demo: branch %s: %w", parent, err)
	case br.Status != bridgeapi.StatusCompleted:
		why := "failed"
		if br.Failure != nil {
			why = br.Failure.Reason
		}
		return fmt.Errorf("demo: branch %s %d ways from %s: %s", parent, d.f.branches, source, why)
	}
	d.Say("branched %s %d ways from %s (%s): the branches run beside the fleet", parent, len(br.Branches), source, br.OpID)
	return nil
}
