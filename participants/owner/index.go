package owner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
)

// casAttempts bounds the compare-and-set retries of an index update.
const casAttempts = 16

// entry reads the index entry of snapshot id; nil when absent.
func (o *Owner) entry(ctx context.Context, id string) (*ownerapi.IndexEntry, error) {
	ent, err := o.cfg.Bus.Snapshots.Get(ctx, id)
	if errors.Is(err, natsjs.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("owner: read index of %s: %w", id, err)
	}
	e, err := ownerapi.DecodeIndexEntry(ent.Value(), id)
	if err != nil {
		return nil, fmt.Errorf("owner: %w", err)
	}
	return &e, nil
}

// update applies fn to the index entry of snapshot id (nil when absent)
// with compare-and-set; fn returns the new entry (nil to delete it) and
// whether to write it at all.
func (o *Owner) update(ctx context.Context, id string, fn func(e *ownerapi.IndexEntry) (next *ownerapi.IndexEntry, write bool)) error {
	kv := o.cfg.Bus.Snapshots
	for range casAttempts {
		var (
			cur *ownerapi.IndexEntry
			rev uint64
		)
		ent, err := kv.Get(ctx, id)
		switch {
		case errors.Is(err, natsjs.ErrKeyNotFound):
		case err != nil:
			return fmt.Errorf("owner: read index of %s: %w", id, err)
		default:
			e, err := ownerapi.DecodeIndexEntry(ent.Value(), id)
			if err != nil {
				return fmt.Errorf("owner: %w", err)
			}
			cur = &e
			rev = ent.Revision()
		}
		next, write := fn(cur)
		switch {
		case !write, next == nil && cur == nil:
			return nil
		case next == nil:
			err = kv.Delete(ctx, id, natsjs.LastRevision(rev))
		default:
			b, merr := json.Marshal(next)
			if merr != nil {
				return merr
			}
			if cur == nil {
				_, err = kv.Create(ctx, id, b)
			} else {
				_, err = kv.Update(ctx, id, b, rev)
			}
		}
		if err == nil {
			return nil
		}
		if !errors.Is(err, natsjs.ErrKeyExists) && !isWrongSeq(err) {
			return fmt.Errorf("owner: write index of %s: %w", id, err)
		}
	}
	return fmt.Errorf("owner: write index of %s: too many concurrent updates", id)
}

// isWrongSeq tells whether err is a lost compare-and-set.
func isWrongSeq(err error) bool {
	var apiErr *natsjs.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == natsjs.JSErrCodeStreamWrongLastSequence
}

// index records that checkpoint ckpt names snapshot id.
func (o *Owner) index(ctx context.Context, id, ckpt string) error {
	return o.update(ctx, id, func(e *ownerapi.IndexEntry) (*ownerapi.IndexEntry, bool) {
		if e == nil {
			return &ownerapi.IndexEntry{Run: o.cfg.Run, Snapshot: id, Checkpoints: []string{ckpt}}, true
		}
		if slices.Contains(e.Checkpoints, ckpt) {
			return e, false
		}
		e.Checkpoints = append(e.Checkpoints, ckpt)
		return e, true
	})
}

// unindex drops ckpt from snapshot id's entry and deletes the snapshot
// when no checkpoint names it any more.
func (o *Owner) unindex(ctx context.Context, id, ckpt string) error {
	// Delete the snapshot first when ckpt is the only checkpoint naming it:
	// were the entry dropped first and the delete to fail, nothing would
	// name the snapshot any more and no release would find it.
	if e, err := o.entry(ctx, id); err != nil {
		return err
	} else if e == nil || (len(e.Checkpoints) == 1 && e.Checkpoints[0] == ckpt) {
		if err := o.deleteSnapshot(ctx, id); err != nil {
			return err
		}
	}
	return o.update(ctx, id, func(e *ownerapi.IndexEntry) (*ownerapi.IndexEntry, bool) {
		if e == nil {
			return nil, false
		}
		e.Checkpoints = slices.DeleteFunc(e.Checkpoints, func(c string) bool { return c == ckpt })
		if len(e.Checkpoints) == 0 {
			return nil, true
		}
		return e, true
	})
}

// Release deletes every snapshot of the run that no checkpoint in keep
// names, per the sp_snapshots index, and drops the released checkpoints
// from the entries of the snapshots it keeps. It returns the deleted
// snapshot ids, sorted. A snapshot whose deletion fails stays indexed, for
// the next release.
func (o *Owner) Release(ctx context.Context, keep []string) ([]string, error) {
	keys, err := o.cfg.Bus.Snapshots.Keys(ctx)
	if errors.Is(err, natsjs.ErrNoKeysFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("owner: list the snapshot index: %w", err)
	}
	var (
		deleted []string
		errs    []error
	)
	for _, id := range keys {
		var drop bool
		err := o.update(ctx, id, func(e *ownerapi.IndexEntry) (*ownerapi.IndexEntry, bool) {
			drop = false
			if e == nil || e.Run != o.cfg.Run {
				return e, false
			}
			kept := slices.DeleteFunc(slices.Clone(e.Checkpoints), func(c string) bool { return !slices.Contains(keep, c) })
			if len(kept) == 0 {
				drop = true
				return e, false // deleted below, once the snapshot is gone
			}
			if len(kept) == len(e.Checkpoints) {
				return e, false
			}
			e.Checkpoints = kept
			return e, true
		})
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !drop {
			continue
		}
		if err := o.deleteSnapshot(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("owner: delete snapshot %s: %w", id, err))
			continue
		}
		if err := o.cfg.Bus.Snapshots.Delete(ctx, id); err != nil {
			errs = append(errs, fmt.Errorf("owner: unindex snapshot %s: %w", id, err))
		}
		deleted = append(deleted, id)
	}
	slices.Sort(deleted)
	if len(deleted) > 0 {
		o.log.Info().Strs("deleted", deleted).Strs("keep", keep).Msg("released snapshots")
	}
	return deleted, errors.Join(errs...)
}

// deleteSnapshot deletes snapshot id on the provider; a provider that
// cannot snapshot holds none, and there is nothing to delete.
func (o *Owner) deleteSnapshot(ctx context.Context, id string) error {
	if o.snap == nil {
		return nil
	}
	return o.snap.DeleteSnapshot(ctx, id)
}
