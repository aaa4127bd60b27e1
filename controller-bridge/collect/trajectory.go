package collect

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/atomicfile"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
)

// saveTrajectory writes the trajectory ref names into Config.Trajectories
// as <rollout>.jsonl, once its bytes are the ones the result names (sha256
// and size). It runs before the result is written: a result in the output
// then has its file beside it, and a collector killed in between asks the
// agent again and writes both. The store is the bus, so a failure is
// tried again for a while; one that lasts is an error the caller logs, and
// the trajectory stays in the store, where `stillpoint trajectory` reads it.
func (c *Collector) saveTrajectory(ctx context.Context, rollout string, ref *agentapi.TrajectoryRef) error {
	if err := events.ValidateRollout("rollout_id", rollout); err != nil {
		return fmt.Errorf("collect: trajectory of %q: %w", rollout, err)
	}
	var data []byte
	var err error
	for wait := 200 * time.Millisecond; ; wait = min(2*wait, 5*time.Second) {
		data, err = ref.Read(ctx, c.cfg.Bus)
		if err == nil || errors.Is(err, agentapi.ErrNotItsTrajectory) || ctx.Err() != nil || wait >= 5*time.Second {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	if err != nil {
		return fmt.Errorf("collect: %w", err)
	}
	if err := os.MkdirAll(c.cfg.Trajectories, 0o755); err != nil {
		return fmt.Errorf("collect: trajectories: %w", err)
	}
	return atomicfile.Write(filepath.Join(c.cfg.Trajectories, rollout+".jsonl"), data, 0o644)
}
