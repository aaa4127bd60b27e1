//go:build linux

package image

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/atomicfile"
	"github.com/stillpoint/stillpoint/internal/poll"
)

// Prune removes images least recently used first until the unpacked
// layers are under MaxBytes, never an image held (Hold); a layer stays as
// long as an image kept stands on it. Layers no image records (left by a
// crash) go first. It returns the bytes freed. It waits for Gets in
// progress, in any process, to finish.
func (c *Cache) Prune(ctx context.Context) (int64, error) {
	return c.prune(ctx, "", unix.LOCK_EX)
}

// pendingFile marks a prune that a Get owed and could not do (others were
// at work): the next Get, of any image and in any process, does it.
const pendingFile = "prune-pending"

// pruneWait is how long a Get that owes a prune waits for the cache's
// lock before it leaves the prune pending.
var pruneWait = time.Second

// pruneAfterGet prunes after a Get that unpacked, or that finds a prune
// pending, keeping src's image. While others are at work it waits up to
// pruneWait for them, then leaves the prune pending for the next Get.
func (c *Cache) pruneAfterGet(ctx context.Context, src *source, unpacked bool) {
	mark := filepath.Join(c.dir, pendingFile)
	if !unpacked {
		if _, err := os.Lstat(mark); err != nil {
			return
		}
	}
	wctx, cancel := context.WithTimeout(ctx, pruneWait)
	defer cancel()
	done := false
	_ = poll.Until(wctx, poll.Every(20*time.Millisecond), func() (bool, error) {
		_, err := c.prune(ctx, src.digest, pruneIfFree)
		if errors.Is(err, errBusy) {
			return false, nil
		}
		if err != nil {
			c.opts.Logger.Warn().Err(err).Str("ref", src.ref).Msg("image cache prune failed")
		}
		done = true
		return true, nil
	})
	if done {
		return
	}
	if err := writeAtomic(mark, nil); err != nil {
		c.opts.Logger.Warn().Err(err).Str("ref", src.ref).Msg("image cache: cannot mark a prune pending")
	}
}

// pruneUnlocked, when set (tests), is called by prune between its unlock
// and its removals, with the directories it is about to remove.
var pruneUnlocked func(gone []string)

// errBusy is prune's answer, with pruneIfFree, while others hold the lock.
var errBusy = errors.New("image: cache busy")

// prune is Prune keeping the image of digest keep as well (the one a Get
// is about to return). Get's prune passes LOCK_EX|LOCK_NB and gets
// errBusy while another Get or a Rootfs is at work. Under the lock, the
// layers to remove are only renamed into tmp/ and their records dropped;
// they are deleted after the unlock, so that a large removal does not
// stall every Get, Hold and Lookup of the cache.
func (c *Cache) prune(ctx context.Context, keep string, how int) (int64, error) {
	global, err := lock(filepath.Join(c.dir, lockFile), how)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return 0, errBusy
	}
	if err != nil {
		return 0, fmt.Errorf("image: prune: %w", err)
	}
	var gone []string
	freed, err := c.pruneLocked(ctx, keep, &gone)
	global.Close()
	if pruneUnlocked != nil {
		pruneUnlocked(gone)
	}
	for _, g := range gone {
		if rerr := os.RemoveAll(g); rerr != nil {
			err = errors.Join(err, fmt.Errorf("image: prune: %w", rerr))
		}
	}
	return freed, err
}

// pruneLocked is prune's work under the exclusive lock: it drops the
// pending mark, and adds the staging directories of the layers it takes
// out to gone.
func (c *Cache) pruneLocked(ctx context.Context, keep string, gone *[]string) (int64, error) {
	if err := os.Remove(filepath.Join(c.dir, pendingFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("image: prune: %w", err)
	}
	if err := c.removeStaging(gone); err != nil {
		return 0, fmt.Errorf("image: prune: %w", err)
	}
	held, err := c.held()
	if err != nil {
		return 0, fmt.Errorf("image: prune: %w", err)
	}
	recs, err := c.records()
	if err != nil {
		return 0, fmt.Errorf("image: prune: %w", err)
	}
	users := map[string]int{} // diff id: images standing on it
	for _, r := range recs {
		for _, id := range uniq(r.DiffIDs) {
			users[id]++
		}
	}
	layers, err := os.ReadDir(filepath.Join(c.dir, layersDir))
	if err != nil {
		return 0, fmt.Errorf("image: prune: %w", err)
	}
	var total, freed int64
	for _, e := range layers {
		id := "sha256:" + e.Name()
		if _, ok := digestHex(id); !ok {
			continue
		}
		if users[id] == 0 { // no image records it: a leftover
			n, err := c.removeLayer(id, gone)
			if err != nil {
				return freed, err
			}
			freed += n
			continue
		}
		total += c.layerSize(id)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].LastUsed.Before(recs[j].LastUsed) })
	for _, r := range recs {
		if total <= c.opts.MaxBytes || ctx.Err() != nil {
			break
		}
		if held[r.Digest] || r.Digest == keep {
			continue
		}
		if err := os.Remove(c.recordPath(r.Digest)); err != nil {
			return freed, fmt.Errorf("image: prune: %w", err)
		}
		for _, id := range uniq(r.DiffIDs) {
			if users[id]--; users[id] > 0 {
				continue
			}
			n, err := c.removeLayer(id, gone)
			if err != nil {
				return freed, err
			}
			freed += n
			total -= n
		}
		c.opts.Logger.Info().Str("digest", r.Digest).Strs("refs", r.Refs).Msg("image pruned")
	}
	return freed, ctx.Err()
}

// removeStaging adds to gone what a crash left in tmp/ (unpacks and
// removals that did not finish), for prune to delete after its unlock.
// The caller holds the cache's lock exclusive, so no unpack is at work;
// a removal another prune is doing after its unlock may be done twice:
// RemoveAll minds no entry that is gone.
func (c *Cache) removeStaging(gone *[]string) error {
	ents, err := os.ReadDir(filepath.Join(c.dir, tmpDir))
	if err != nil {
		return err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "unpack-") || strings.HasPrefix(e.Name(), "prune-") {
			*gone = append(*gone, filepath.Join(c.dir, tmpDir, e.Name()))
		}
	}
	return nil
}

// removeLayer takes an unpacked layer out of layers/ (renamed into a
// directory of tmp/ it adds to gone, for the caller to delete once it
// has unlocked) and drops its files; it returns its size.
func (c *Cache) removeLayer(id string, gone *[]string) (int64, error) {
	h, _ := digestHex(id)
	n := c.layerSize(id)
	// Renamed away first, so that no half layer is ever found in layers/.
	dir, err := os.MkdirTemp(filepath.Join(c.dir, tmpDir), "prune-")
	if err != nil {
		return 0, fmt.Errorf("image: prune layer %s: %w", id, err)
	}
	*gone = append(*gone, dir)
	if err := os.Rename(c.layerPath(id), filepath.Join(dir, h)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("image: prune layer %s: %w", id, err)
	}
	os.Remove(filepath.Join(c.dir, metaDir, h+".json"))
	os.Remove(filepath.Join(c.dir, locksDir, h+".lock"))
	return n, nil
}

// records reads every image record.
func (c *Cache) records() ([]record, error) {
	ents, err := os.ReadDir(filepath.Join(c.dir, imagesDir))
	if err != nil {
		return nil, err
	}
	var out []record
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") || !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		r, err := atomicfile.JSON[record]{Path: filepath.Join(c.dir, imagesDir, e.Name())}.Read()
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

func uniq(ids []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out
}
