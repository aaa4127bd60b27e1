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

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/atomicfile"
)

// Prune removes images least recently used first until the unpacked
// layers are under MaxBytes, never an image held (Hold); a layer stays as
// long as an image kept stands on it. Layers no image records (left by a
// crash) go first. It returns the bytes freed. It waits for Gets in
// progress, in any process, to finish.
func (c *Cache) Prune(ctx context.Context) (int64, error) {
	return c.prune(ctx, "", unix.LOCK_EX)
}

// prune is Prune keeping the image of digest keep as well (the one a Get
// is about to return). Get's prune passes LOCK_EX|LOCK_NB: while another
// Get or a Rootfs is at work, it leaves the pruning to a later Get.
func (c *Cache) prune(ctx context.Context, keep string, how int) (int64, error) {
	global, err := lock(filepath.Join(c.dir, lockFile), how)
	if errors.Is(err, unix.EWOULDBLOCK) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("image: prune: %w", err)
	}
	defer global.Close()
	if err := c.removeStaging(); err != nil {
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
			n, err := c.removeLayer(id)
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
			n, err := c.removeLayer(id)
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

// removeStaging removes what a crash left in tmp/: unpacks and removals
// that did not finish. The caller holds the cache's lock exclusive.
func (c *Cache) removeStaging() error {
	ents, err := os.ReadDir(filepath.Join(c.dir, tmpDir))
	if err != nil {
		return err
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "unpack-") || strings.HasPrefix(e.Name(), "prune-") {
			if err := os.RemoveAll(filepath.Join(c.dir, tmpDir, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}

// removeLayer removes an unpacked layer and its files; it returns its size.
func (c *Cache) removeLayer(id string) (int64, error) {
	h, _ := digestHex(id)
	n := c.layerSize(id)
	// Renamed away first, so that no half layer is ever found in layers/.
	gone := filepath.Join(c.dir, tmpDir, "prune-"+h)
	if err := os.Rename(c.layerPath(id), gone); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("image: prune layer %s: %w", id, err)
	}
	if err := os.RemoveAll(gone); err != nil {
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
