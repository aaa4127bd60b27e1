//go:build linux

package image

import (
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/atomicfile"
)

// lock opens (making it) and flocks path; Close of the file unlocks.
func lock(path string, how int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, &os.PathError{Op: "flock", Path: path, Err: err}
	}
	return f, nil
}

// pruneIfFree is how Get's prune locks: not waiting for others at work.
const pruneIfFree = unix.LOCK_EX | unix.LOCK_NB

// lockShared takes the cache's lock shared (Prune takes it exclusive)
// and returns its release.
func (c *Cache) lockShared() (func(), error) {
	f, err := lock(filepath.Join(c.dir, lockFile), unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	return func() { f.Close() }, nil
}

// unpackImage unpacks the layers of src not yet in the cache and records
// the image. Every new layer is checked and unpacked into a staging
// directory first; only when all of them are good are they renamed into
// layers/, so that a bad image leaves nothing in the cache. The caller
// holds the cache's lock shared; each layer's lock is taken exclusive, so
// that two Gets of one layer, in this process or another,
// unpack it once.
func (c *Cache) unpackImage(ctx context.Context, src *source) (record, bool, error) {
	r := record{
		Refs:       []string{src.ref},
		Digest:     src.digest,
		Env:        src.config.Config.Env,
		WorkingDir: src.config.Config.WorkingDir,
		User:       src.config.Config.User,
	}
	if _, ok := digestHex(src.digest); !ok {
		return r, false, badf(src.ref, "digest %q is not sha256", src.digest)
	}
	var ids []string
	for _, l := range src.layers {
		if _, ok := digestHex(l.diffID); !ok {
			return r, false, badf(src.ref, "diff id %q is not sha256", l.diffID)
		}
		r.DiffIDs = append(r.DiffIDs, l.diffID)
		ids = append(ids, l.diffID)
	}
	sort.Strings(ids)
	ids = slices.Compact(ids)

	for _, id := range ids { // sorted: no two Gets wait on each other
		h, _ := digestHex(id)
		l, err := lock(filepath.Join(c.dir, locksDir, h+".lock"), unix.LOCK_EX)
		if err != nil {
			return r, false, fmt.Errorf("image %s: %w", src.ref, err)
		}
		defer l.Close()
	}

	stage, err := os.MkdirTemp(filepath.Join(c.dir, tmpDir), "unpack-")
	if err != nil {
		return r, false, fmt.Errorf("image %s: %w", src.ref, err)
	}
	defer os.RemoveAll(stage)
	staged := map[string]int64{}
	var order []string
	for _, l := range src.layers {
		if _, done := staged[l.diffID]; done {
			continue
		}
		if _, err := os.Lstat(c.layerPath(l.diffID)); err == nil {
			continue
		}
		h, _ := digestHex(l.diffID)
		var taken int64
		for _, n := range staged {
			taken += n
		}
		size, err := unpackLayer(ctx, src.ref, l, filepath.Join(stage, h), c.opts.MaxBytes-taken)
		if err != nil {
			return r, false, err
		}
		staged[l.diffID] = size
		order = append(order, l.diffID)
	}
	for _, id := range order {
		h, _ := digestHex(id)
		meta := atomicfile.JSON[layerMeta]{Path: filepath.Join(c.dir, metaDir, h+".json")}
		if err := meta.Write(layerMeta{DiffID: id, Size: staged[id]}); err != nil {
			return r, false, fmt.Errorf("image %s: %w", src.ref, err)
		}
		if err := os.Rename(filepath.Join(stage, h), c.layerPath(id)); err != nil {
			return r, false, fmt.Errorf("image %s: %w", src.ref, err)
		}
		c.unpacked.Add(1)
		c.opts.Logger.Info().Str("ref", src.ref).Str("diff_id", id).Int64("bytes", staged[id]).Msg("image layer unpacked")
	}
	if err := atomicfile.SyncDir(filepath.Join(c.dir, layersDir)); err != nil {
		return r, false, fmt.Errorf("image %s: %w", src.ref, err)
	}
	for _, id := range ids {
		r.Size += c.layerSize(id)
	}
	if err := c.writeRecord(r); err != nil {
		return r, false, fmt.Errorf("image %s: record: %w", src.ref, err)
	}
	return r, len(order) > 0, nil
}

// layerSize is a layer's size as measured at its unpack (0 when unknown).
func (c *Cache) layerSize(diffID string) int64 {
	h, _ := digestHex(diffID)
	m, err := atomicfile.JSON[layerMeta]{Path: filepath.Join(c.dir, metaDir, h+".json")}.Read()
	if err != nil {
		return 0
	}
	return m.Size
}

// countingReader counts and hashes what is read through it.
type countingReader struct {
	r io.Reader
	h hash.Hash
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	c.h.Write(p[:n])
	return n, err
}

func (c *countingReader) digest() string { return "sha256:" + hex.EncodeToString(c.h.Sum(nil)) }

// unpackLayer reads layer l's blob once: it checks the blob's digest and
// size, decompresses it (gzip, zstd or none), checks the diff id and
// extracts the tar into dst, refusing a layer that unpacks to more than
// limit bytes. It returns the disk usage of dst.
func unpackLayer(ctx context.Context, ref string, l layerSource, dst string, limit int64) (int64, error) {
	name := l.digest
	if name == "" {
		name = l.diffID
	}
	rc, err := l.open()
	var te *transport.Error
	if errors.Is(err, fs.ErrNotExist) || errors.As(err, &te) && te.StatusCode == http.StatusNotFound {
		return 0, badf(ref, "missing blob %s: %v", name, err)
	}
	if err != nil {
		return 0, fmt.Errorf("image %s: layer %s: %w", ref, name, err)
	}
	defer rc.Close()
	raw := &countingReader{r: rc, h: sha256.New()}
	br := bufio.NewReaderSize(raw, 1<<16)
	// checkBlob names a blob that is not the manifest's, which explains a
	// decompression or tar error better than that error does.
	checkBlob := func(cause error) error {
		if _, err := io.Copy(io.Discard, br); err != nil && cause == nil {
			return fmt.Errorf("image %s: layer %s: %w", ref, name, err)
		}
		if l.digest != "" && raw.digest() != l.digest {
			return badf(ref, "layer blob has digest %s, the manifest says %s", raw.digest(), l.digest)
		}
		if l.size >= 0 && raw.n != l.size {
			return badf(ref, "layer blob %s has %d bytes, the manifest says %d", name, raw.n, l.size)
		}
		return cause
	}
	var plain io.Reader = br
	magic, _ := br.Peek(4)
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		zr, err := gzip.NewReader(br)
		if err != nil {
			return 0, checkBlob(badf(ref, "layer %s: gzip: %v", name, err))
		}
		defer zr.Close()
		plain = zr
	case len(magic) == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd:
		zr, err := zstd.NewReader(br)
		if err != nil {
			return 0, checkBlob(badf(ref, "layer %s: zstd: %v", name, err))
		}
		defer zr.Close()
		plain = zr
	}
	diff := &countingReader{r: plain, h: sha256.New()}
	size, err := extract(ctx, diff, dst, limit)
	if err == nil {
		_, err = io.Copy(io.Discard, diff) // the tar's padding, for the diff id
	}
	var unsafe *unsafeEntry
	var big *tooLarge
	switch {
	case errors.As(err, &unsafe):
		return 0, badf(ref, "layer %s: %v", name, unsafe)
	case errors.As(err, &big):
		return 0, badf(ref, "layer %s %v", name, big)
	}
	if err != nil && ctx.Err() != nil {
		return 0, fmt.Errorf("image %s: layer %s: %w", ref, name, ctx.Err())
	}
	if err != nil {
		var pe *os.PathError
		if !errors.As(err, &pe) { // not ours: the blob's bytes are wrong
			err = badf(ref, "layer %s: %v", name, err)
		} else {
			err = fmt.Errorf("image %s: layer %s: %w", ref, name, err)
		}
	}
	if err := checkBlob(err); err != nil {
		return 0, err
	}
	if got := diff.digest(); got != l.diffID {
		return 0, badf(ref, "layer %s has diff id %s, the config says %s", name, got, l.diffID)
	}
	return size, nil
}
