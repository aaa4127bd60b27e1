package collect

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

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
		data, err = readTrajectory(ctx, c.cfg.Bus.Trajectories, ref)
		if err == nil || errors.Is(err, errNotItsTrajectory) || ctx.Err() != nil || wait >= 5*time.Second {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
	if err != nil {
		return err
	}
	if err := os.MkdirAll(c.cfg.Trajectories, 0o755); err != nil {
		return fmt.Errorf("collect: trajectories: %w", err)
	}
	return atomicfile.Write(filepath.Join(c.cfg.Trajectories, rollout+".jsonl"), data, 0o644)
}

// errNotItsTrajectory is a stored object whose bytes are not those its
// result names: reading it again does not help.
var errNotItsTrajectory = errors.New("collect: not the result's trajectory")

// readTrajectory reads ref's object from store and checks it against ref.
func readTrajectory(ctx context.Context, store natsjs.ObjectStore, ref *agentapi.TrajectoryRef) ([]byte, error) {
	res, err := store.Get(ctx, ref.Object)
	if err != nil {
		return nil, fmt.Errorf("collect: read trajectory %s: %w", ref.Object, err)
	}
	defer res.Close()
	data, err := io.ReadAll(io.LimitReader(res, ref.Bytes+1))
	if err != nil {
		return nil, fmt.Errorf("collect: read trajectory %s: %w", ref.Object, err)
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); int64(len(data)) != ref.Bytes || got != ref.SHA256 {
		return nil, fmt.Errorf("%w: %s is %d bytes of sha256 %s; its result names %d bytes of %s",
			errNotItsTrajectory, ref.Object, len(data), got, ref.Bytes, ref.SHA256)
	}
	return data, nil
}
