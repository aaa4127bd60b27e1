package agentapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/jetstream"
)

// ErrNotItsTrajectory is a stored trajectory whose bytes are not those its
// result names (sha256 and size): reading it again does not help.
var ErrNotItsTrajectory = errors.New("not the result's trajectory")

// TrajectoryStores opens the trajectories store a TrajectoryRef names by
// its Bucket: the shared jetstream.BucketTrajectories for "", else an
// agent's own. A *jetstream.Bus is one.
type TrajectoryStores interface {
	TrajectoryStore(ctx context.Context, bucket string) (natsjs.ObjectStore, error)
}

var _ TrajectoryStores = (*jetstream.Bus)(nil)

// NotFoundFor is how long Read asks again for a trajectory its store says
// is not there.
const NotFoundFor = 30 * time.Second

// Read reads the trajectory r names from its store (r.Bucket, opened
// through stores), at most one byte more than r names, and returns its
// bytes once they are the ones r names; else ErrNotItsTrajectory, wrapped,
// says what it found. An object the store says is not there is asked for
// again, for NotFoundFor: a result names only a trajectory that was
// stored, and on a cluster a replica still catching up (its node back
// from a crash or a partition) may answer the read before it has it.
func (r *TrajectoryRef) Read(ctx context.Context, stores TrajectoryStores) ([]byte, error) {
	store, err := stores.TrajectoryStore(ctx, r.Bucket)
	if err != nil {
		return nil, fmt.Errorf("read trajectory %s: %w", r.Object, err)
	}
	res, err := store.Get(ctx, r.Object)
	for wait, until := 100*time.Millisecond, time.Now().Add(NotFoundFor); errors.Is(err, natsjs.ErrObjectNotFound) && time.Now().Before(until); wait = min(2*wait, time.Second) {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("read trajectory %s: %w (%w)", r.Object, err, context.Cause(ctx))
		case <-time.After(wait):
		}
		res, err = store.Get(ctx, r.Object)
	}
	if err != nil {
		return nil, fmt.Errorf("read trajectory %s: %w", r.Object, err)
	}
	defer res.Close()
	data, err := io.ReadAll(io.LimitReader(res, r.Bytes+1))
	if err != nil {
		return nil, fmt.Errorf("read trajectory %s: %w", r.Object, err)
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); int64(len(data)) != r.Bytes || got != r.SHA256 {
		return nil, fmt.Errorf("%w: %s is %d bytes of sha256 %s; its result names %d bytes of %s",
			ErrNotItsTrajectory, r.Object, len(data), got, r.Bytes, r.SHA256)
	}
	return data, nil
}
