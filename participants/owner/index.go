package owner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

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
			return &ownerapi.IndexEntry{Run: o.cfg.Run, Snapshot: id, Owner: o.cfg.Name, Checkpoints: []string{ckpt}, Size: size}, true
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

// readTry bounds one watch of readIndex: a watch whose consumer sits on a
// replica that stops short of the mark is given up for a new one.
const readTry = 2 * time.Second

// markPrefix begins every owner's mark key: not a token, so no snapshot
// id.
const markPrefix = "_read."

// markKey is the owner's key in the snapshot index that readIndex writes
// to mark how far a read must reach.
func (o *Owner) markKey() string {
	sum := sha256.Sum256([]byte(o.cfg.Run + "\x00" + o.cfg.Name))
	return markPrefix + hex.EncodeToString(sum[:8])
}

// readIndex reads the index entries whose keys match filter (a key, or >
// for all), whatever replica answers. A KV get is a direct get, which any
// replica may answer, and the ordered consumer of a watch may sit on any
// replica too: one still catching up after its node of a cluster came
// back says a key is missing. So readIndex first writes its mark (markKey;
// the write goes through the stream's leader, which gives it the next
// revision), then reads a watch of filter and the mark until the mark's
// write is in: every write before it is then in too. A watch that does
// not get there within readTry is given up for a new one. The mark is
// deleted again. An entry that does not decode is in bad, by key.
func (o *Owner) readIndex(ctx context.Context, filter string) (map[string]indexed, map[string]error, error) {
	kv, mark := o.cfg.Bus.Snapshots, o.markKey()
	rev, err := kv.Put(ctx, mark, nil)
	if err != nil {
		return nil, nil, fmt.Errorf("owner: mark a read of the snapshot index: %w", err)
	}
	defer func() {
		if err := kv.Delete(context.WithoutCancel(ctx), mark); err != nil {
			o.log.Warn().Err(err).Str("key", mark).Msg("deleting the mark of a read of the snapshot index failed")
		}
	}()
	for try := 1; ; try++ {
		out, bad, err := o.watchTo(ctx, filter, mark, rev)
		if !errors.Is(err, errShort) {
			return out, bad, err
		}
		o.log.Debug().Int("try", try).Uint64("mark", rev).Msg("a watch of the snapshot index stopped short of its mark; watching again")
	}
}

// errShort says a watch did not reach the mark within readTry.
var errShort = errors.New("owner: the watch did not reach the mark")

// watchTo reads one watch of filter and mark until mark's entry of
// revision rev or later is in (readIndex).
func (o *Owner) watchTo(ctx context.Context, filter, mark string, rev uint64) (map[string]indexed, map[string]error, error) {
	keys := []string{filter, mark}
	if filter == ">" {
		keys = keys[:1] // > holds the mark; overlapping filters are refused
	}
	tctx, cancel := context.WithTimeout(ctx, readTry)
	defer cancel()
	w, err := o.cfg.Bus.Snapshots.WatchFiltered(tctx, keys)
	if err != nil {
		if ctx.Err() == nil && tctx.Err() != nil {
			return nil, nil, errShort
		}
		return nil, nil, fmt.Errorf("owner: watch the snapshot index: %w", err)
	}
	defer func() { _ = w.Stop() }()
	out, bad := map[string]indexed{}, map[string]error{}
	for {
		select {
		case <-tctx.Done():
			if ctx.Err() != nil {
				return nil, nil, fmt.Errorf("owner: read the snapshot index: %w", ctx.Err())
			}
			return nil, nil, errShort
		case ent, ok := <-w.Updates():
			if !ok {
				return nil, nil, errors.New("owner: read the snapshot index: the watch closed")
			}
			if ent == nil { // what this replica holds is in; the mark may come later
				continue
			}
			k := ent.Key()
			if k == mark {
				if ent.Revision() >= rev {
					return out, bad, nil
				}
				continue
			}
			if strings.HasPrefix(k, markPrefix) {
				// Another owner's mark (of this run or another): its
				// read, not an entry.
				continue
			}
			delete(out, k)
			delete(bad, k)
			if ent.Operation() != natsjs.KeyValuePut {
				continue
			}
			e, err := ownerapi.DecodeIndexEntry(ent.Value(), k)
			if err != nil {
				bad[k] = fmt.Errorf("owner: %w", err)
				continue
			}
			out[k] = indexed{entry: e, rev: ent.Revision()}
		}
	}
}

// Release deletes every snapshot of the run this owner took that no
// checkpoint in keep names, per the sp_snapshots index, and drops the
// released checkpoints from the entries of the snapshots it keeps. Another
// owner's entries are that owner's to release. It returns the deleted
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
		if e.Run != o.cfg.Run || e.Owner != "" && e.Owner != o.cfg.Name {
			return false, nil // another run's, or another owner's to release
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
