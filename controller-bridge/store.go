package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
)

// latest reads LATEST and its revision; nil if there is none.
func (b *Bridge) latest(ctx context.Context) (*events.Latest, uint64, error) {
	e, err := b.cfg.Bus.Manifests.Get(ctx, events.LatestKey(b.cfg.Run))
	if errors.Is(err, natsjs.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("bridge: read LATEST: %w", err)
	}
	var l events.Latest
	if err := json.Unmarshal(e.Value(), &l); err != nil {
		return nil, 0, fmt.Errorf("bridge: LATEST does not decode: %w", err)
	}
	return &l, e.Revision(), nil
}

// checkpoints lists every checkpoint key of the run (committed and
// aborted), oldest first.
func (b *Bridge) checkpoints(ctx context.Context) ([]events.CheckpointManifest, error) {
	lister, err := b.cfg.Bus.Manifests.ListKeysFiltered(ctx, b.cfg.Run+".*")
	if err != nil {
		return nil, fmt.Errorf("bridge: list manifests: %w", err)
	}
	var ids []string
	for k := range lister.Keys() {
		id := strings.TrimPrefix(k, b.cfg.Run+".")
		if id != "LATEST" && id != "HEAD" { // the run's own keys (events.LatestKey, HeadKey)
			ids = append(ids, id)
		}
	}
	var out []events.CheckpointManifest
	for _, id := range ids {
		m, _, err := b.manifest(ctx, id)
		if err != nil {
			return nil, err
		}
		if m != nil {
			out = append(out, *m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out, nil
}

// deleteCheckpoint deletes a checkpoint's records, member manifests and
// manifest, in that order, so that a crash in between leaves a manifest
// that names missing records rather than records nothing names. An abort
// marker stays: only what its members wrote before the abort goes.
func (b *Bridge) deleteCheckpoint(ctx context.Context, m events.CheckpointManifest) error {
	prefix := b.cfg.Run + "/" + m.CheckpointID + "/"
	objs, err := b.cfg.Bus.Records.List(ctx)
	if err != nil && !errors.Is(err, natsjs.ErrNoObjectsFound) {
		return fmt.Errorf("bridge: list records: %w", err)
	}
	for _, o := range objs {
		if strings.HasPrefix(o.Name, prefix) {
			if err := b.cfg.Bus.Records.Delete(ctx, o.Name); err != nil && !errors.Is(err, natsjs.ErrObjectNotFound) {
				return fmt.Errorf("bridge: delete records %s: %w", o.Name, err)
			}
		}
	}
	lister, err := b.cfg.Bus.Manifests.ListKeysFiltered(ctx, events.ManifestKey(b.cfg.Run, m.CheckpointID)+".>")
	if err != nil {
		return fmt.Errorf("bridge: list member manifests: %w", err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	for _, k := range keys {
		if err := b.cfg.Bus.Manifests.Purge(ctx, k); err != nil {
			return fmt.Errorf("bridge: delete %s: %w", k, err)
		}
	}
	if m.Aborted {
		return nil // the abort marker stays
	}
	if err := b.cfg.Bus.Manifests.Purge(ctx, events.ManifestKey(b.cfg.Run, m.CheckpointID)); err != nil {
		return fmt.Errorf("bridge: delete manifest %s: %w", m.CheckpointID, err)
	}
	return nil
}
