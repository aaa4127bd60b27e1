package owner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
)

// casAttempts bounds the compare-and-set retries of an index update.
const casAttempts = 16

// entry reads the index entry of snapshot id from a watch of its key
// (readIndex); nil when absent. unindex deletes the snapshot when the entry
// is absent, so the answer must not be a replica's that is catching up.
func (o *Owner) entry(ctx context.Context, id string) (*ownerapi.IndexEntry, error) {
	entries, bad, err := o.readIndex(ctx, id)
	if err != nil {
		return nil, err
	}
	if err := bad[id]; err != nil {
		return nil, err
	}
	e, ok := entries[id]
	if !ok {
		return nil, nil
	}
	return &e.entry, nil
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
func (o *Owner) index(ctx context.Context, id, ckpt string, size int64) error {
	return o.update(ctx, id, func(e *ownerapi.IndexEntry) (*ownerapi.IndexEntry, bool) {
		if e == nil {
			return &ownerapi.IndexEntry{Run: o.cfg.Run, Snapshot: id, Checkpoints: []string{ckpt}, Size: size}, true
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

// indexed is an index entry as one read of the bucket found it, with the
// revision a compare-and-set of it names.
type indexed struct {
	entry ownerapi.IndexEntry
	rev   uint64
}

// readIndex reads the index entries whose keys match filter (a key, or >
// for all) from one watch of the bucket. A watch's entries come from the
// stream through its consumer, not from a direct get, which any replica
// may answer: one still catching up after its node of a cluster came back
// says a key just listed is missing. An entry that does not decode is in
// bad, by key.
func (o *Owner) readIndex(ctx context.Context, filter string) (map[string]indexed, map[string]error, error) {
	w, err := o.cfg.Bus.Snapshots.Watch(ctx, filter, natsjs.IgnoreDeletes())
	if err != nil {
		return nil, nil, fmt.Errorf("owner: watch the snapshot index: %w", err)
	}
	defer func() { _ = w.Stop() }()
	out, bad := map[string]indexed{}, map[string]error{}
	for {
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("owner: read the snapshot index: %w", ctx.Err())
		case ent, ok := <-w.Updates():
			if !ok {
				return nil, nil, errors.New("owner: read the snapshot index: the watch closed")
			}
			if ent == nil { // every entry there was is in
				return out, bad, nil
			}
			e, err := ownerapi.DecodeIndexEntry(ent.Value(), ent.Key())
			if err != nil {
				delete(out, ent.Key())
				bad[ent.Key()] = fmt.Errorf("owner: %w", err)
				continue
			}
			delete(bad, ent.Key())
			out[ent.Key()] = indexed{entry: e, rev: ent.Revision()}
		}
	}
}

// Release deletes every snapshot of the run that no checkpoint in keep
// names, per the sp_snapshots index, and drops the released checkpoints
// from the entries of the snapshots it keeps. It returns the deleted
// snapshot ids, sorted. A snapshot whose deletion fails stays indexed, for
// the next release.
//
// The index is read from one watch (readIndex), keys and values together,
// so that every key the listing shows is decided on its value, whatever a
// replica catching up would answer a get of it.
func (o *Owner) Release(ctx context.Context, keep []string) ([]string, error) {
	entries, bad, err := o.readIndex(ctx, ">")
	if err != nil {
		return nil, err
	}
	var (
		deleted []string
		errs    []error
	)
	for _, id := range slices.Sorted(maps.Keys(bad)) {
		errs = append(errs, bad[id])
	}
	for _, id := range slices.Sorted(maps.Keys(entries)) {
		drop, err := o.release(ctx, id, entries[id], keep)
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

// release decides snapshot id's entry, as cur read it, for a release that
// keeps the checkpoints in keep: drop when none of them names it (the
// caller deletes the snapshot, then its key), otherwise the released
// checkpoints are dropped from its entry with a compare-and-set on cur's
// revision. A lost compare-and-set reads the key again from a watch.
func (o *Owner) release(ctx context.Context, id string, cur indexed, keep []string) (drop bool, err error) {
	for range casAttempts {
		e := cur.entry
		if e.Run != o.cfg.Run {
			return false, nil
		}
		kept := slices.DeleteFunc(slices.Clone(e.Checkpoints), func(c string) bool { return !slices.Contains(keep, c) })
		if len(kept) == 0 {
			return true, nil
		}
		if len(kept) == len(e.Checkpoints) {
			return false, nil
		}
		e.Checkpoints = kept
		b, err := json.Marshal(e)
		if err != nil {
			return false, err
		}
		_, err = o.cfg.Bus.Snapshots.Update(ctx, id, b, cur.rev)
		if err == nil {
			return false, nil
		}
		if !errors.Is(err, natsjs.ErrKeyExists) && !isWrongSeq(err) {
			return false, fmt.Errorf("owner: write index of %s: %w", id, err)
		}
		again, bad, err := o.readIndex(ctx, id)
		if err != nil {
			return false, err
		}
		if err := bad[id]; err != nil {
			return false, err
		}
		next, ok := again[id]
		if !ok { // deleted meanwhile: nothing left to release
			return false, nil
		}
		cur = next
	}
	return false, fmt.Errorf("owner: write index of %s: too many concurrent updates", id)
}

// deleteSnapshot deletes snapshot id on the provider; a provider that
// cannot snapshot holds none, and there is nothing to delete.
func (o *Owner) deleteSnapshot(ctx context.Context, id string) error {
	if o.snap == nil {
		return nil
	}
	return o.snap.DeleteSnapshot(ctx, id)
}

// snapshotSize is the size of snapshot id as its index entry recorded it
// when it was taken; 0 when it is not known (an entry of an older owner,
// or one that cannot be read).
func (o *Owner) snapshotSize(ctx context.Context, id string) int64 {
	if o.cfg.Metrics == nil {
		return 0
	}
	e, err := o.entry(ctx, id)
	if err != nil || e == nil {
		return 0
	}
	return e.Size
}
