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
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
)

// trajectoryReads is how many times saveTrajectory reads a trajectory, the
// waits between doubling from 200 ms: about 6 s in all.
const trajectoryReads = 6

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
	reads := 0
	err := poll.Until(ctx, poll.Backoff(200*time.Millisecond, 5*time.Second), func() (bool, error) {
		var err error
		data, err = ref.Read(ctx, c.cfg.Bus)
		reads++
		if err == nil || errors.Is(err, agentapi.ErrNotItsTrajectory) || ctx.Err() != nil || reads == trajectoryReads {
			return true, err
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("collect: %w", err)
	}
	if err := os.MkdirAll(c.cfg.Trajectories, 0o755); err != nil {
		return fmt.Errorf("collect: trajectories: %w", err)
	}
	return atomicfile.Write(filepath.Join(c.cfg.Trajectories, rollout+".jsonl"), data, 0o644)
}
