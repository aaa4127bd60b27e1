package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/internal/atomicfile"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// DefaultMaxBytes is the size bound of a cache's unpacked layers when
// Options.MaxBytes is 0.
const DefaultMaxBytes int64 = 20 << 30

// Sentinel errors. Each is returned wrapped, with a message naming the
// reference or digest and what is wrong.
var (
	// ErrBadImage is returned by Get for an image that is broken or unsafe:
	// a missing blob, a blob whose digest or size is not the manifest's, a
	// layer whose diff id is not the config's, a layer entry that would
	// land outside its layer, a layer that unpacks to more than
	// Options.MaxBytes, or a reference that names no one image.
	ErrBadImage = errors.New("image: bad image")

	// ErrNotFound is returned by Get when the reference names nothing: no
	// such file, no such image in a layout or archive, no such repository
	// or tag in a registry.
	ErrNotFound = errors.New("image: not found")

	// ErrNotCached is returned by Lookup and Hold for a digest whose image
	// is not (or no longer) unpacked in the cache.
	ErrNotCached = errors.New("image: not cached")
)

// Options configure a Cache.
type Options struct {
	// MaxBytes bounds the size of the unpacked layers (0: DefaultMaxBytes);
	// Prune removes least recently used images until the cache is under it.
	MaxBytes int64
	// Keychain gives registry credentials (nil: authn.DefaultKeychain, the
	// docker config: $DOCKER_CONFIG/config.json or ~/.docker/config.json).
	Keychain authn.Keychain
	// Logger logs unpacks and prunes.
	Logger zerolog.Logger
}

// Cache is a host's image cache: a directory of unpacked layers, keyed by
// diff id and shared by the images that hold them, and of image records.
// Its methods are safe for concurrent use, by goroutines and by processes
// sharing the directory (file locks).
type Cache struct {
	dir  string
	opts Options

	unpacked atomic.Int64 // layers this Cache unpacked (tests)
}

// The cache directory's parts.
const (
	layersDir = "layers"    // <diffid hex>/: an unpacked layer, an overlay lowerdir
	metaDir   = "layermeta" // <diffid hex>.json: a layer's measured size
	imagesDir = "images"    // <digest hex>.json: an image record
	holdsDir  = "holds"     // <holder>: a hold, holding a digest
	locksDir  = "locks"     // <diffid hex>.lock: held while a layer is unpacked
	tmpDir    = "tmp"       // staging of layers being unpacked
	lockFile  = "lock"      // shared by Get, exclusive for Prune
)

// Open opens the cache rooted at dir, making it (0700) if missing.
func Open(dir string, opts Options) (*Cache, error) {
	if !filepath.IsAbs(dir) {
		return nil, fmt.Errorf("image: cache dir %q is not absolute", dir)
	}
	if opts.MaxBytes < 0 {
		return nil, fmt.Errorf("image: MaxBytes %d is negative", opts.MaxBytes)
	}
	if opts.MaxBytes == 0 {
		opts.MaxBytes = DefaultMaxBytes
	}
	if opts.Keychain == nil {
		opts.Keychain = authn.DefaultKeychain
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("image: cache dir: %w", err)
	}
	for _, d := range []string{layersDir, metaDir, imagesDir, holdsDir, locksDir, tmpDir} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("image: cache dir: %w", err)
		}
	}
	return &Cache{dir: dir, opts: opts}, nil
}

// record is an image's file under images/.
type record struct {
	Refs       []string  `json:"refs"`
	Digest     string    `json:"digest"`
	DiffIDs    []string  `json:"diff_ids"` // bottom first
	Env        []string  `json:"env,omitempty"`
	WorkingDir string    `json:"working_dir,omitempty"`
	User       string    `json:"user,omitempty"`
	Size       int64     `json:"size"` // of its layers, each once
	LastUsed   time.Time `json:"last_used"`
}

// layerMeta is a layer's file under layermeta/.
type layerMeta struct {
	DiffID string `json:"diff_id"`
	Size   int64  `json:"size"` // disk usage measured at unpack
}

var hexDigest = regexp.MustCompile(`^sha256:([a-f0-9]{64})$`)

// digestHex returns the hex of a "sha256:<hex>" digest.
func digestHex(d string) (string, bool) {
	m := hexDigest.FindStringSubmatch(d)
	if m == nil {
		return "", false
	}
	return m[1], true
}

func (c *Cache) recordPath(digest string) string {
	h, _ := digestHex(digest)
	return filepath.Join(c.dir, imagesDir, h+".json")
}

func (c *Cache) layerPath(diffID string) string {
	h, _ := digestHex(diffID)
	return filepath.Join(c.dir, layersDir, h)
}

func (c *Cache) readRecord(digest string) (record, error) {
	r, err := atomicfile.JSON[record]{Path: c.recordPath(digest)}.Read()
	if err == nil && r.Digest != digest {
		err = fmt.Errorf("%s: holds %q", c.recordPath(digest), r.Digest)
	}
	if errors.Is(err, fs.ErrNotExist) {
		return r, fmt.Errorf("%w: %s", ErrNotCached, digest)
	}
	return r, err
}

func (c *Cache) writeRecord(r record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(c.recordPath(r.Digest), append(b, '\n'))
}

// writeAtomic replaces path with data (0600) through a temporary file of a
// name of its own (".<name>.*", which listings skip), so that two writers
// of one path never share a temporary file.
func writeAtomic(path string, data []byte) error {
	dir, base := filepath.Split(path)
	f, err := os.CreateTemp(dir, "."+base+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// present reports whether every layer of r is unpacked.
func (c *Cache) present(r record) bool {
	for _, d := range r.DiffIDs {
		if _, err := os.Lstat(c.layerPath(d)); err != nil {
			return false
		}
	}
	return true
}

// use marks r used now (and by ref, when not ""), and returns its image.
func (c *Cache) use(r record, ref string) (*provider.Image, error) {
	r.LastUsed = time.Now()
	if ref != "" && !slices.Contains(r.Refs, ref) {
		r.Refs = append(r.Refs, ref)
	}
	if err := c.writeRecord(r); err != nil {
		return nil, fmt.Errorf("image: record of %s: %w", r.Digest, err)
	}
	img := &provider.Image{
		Ref:        ref,
		Digest:     r.Digest,
		Env:        slices.Clone(r.Env),
		WorkingDir: r.WorkingDir,
		User:       r.User,
	}
	if img.Ref == "" && len(r.Refs) > 0 {
		img.Ref = r.Refs[0]
	}
	for _, d := range r.DiffIDs {
		img.Layers = append(img.Layers, c.layerPath(d))
	}
	return img, nil
}

// Get resolves ref, checks it (every blob present and of its digest and
// size, every diff id the config's, every layer path safe), unpacks each
// layer not yet cached, records the image, marks it used and returns it.
// Errors wrap ErrBadImage or ErrNotFound, or are I/O or registry errors;
// each names ref. Get prunes the cache after unpacking, or when an
// earlier Get left a prune pending (see prunePending).
func (c *Cache) Get(ctx context.Context, ref string) (*provider.Image, error) {
	return c.get(ctx, ref, "")
}

// GetHeld is Get that also makes holder hold the image, recorded under
// the same lock as the image's check: no Prune can remove the image
// between Get and a Hold of its user. The caller releases holder
// (Release) once the image's user holds it under a name of its own.
func (c *Cache) GetHeld(ctx context.Context, ref, holder string) (*provider.Image, error) {
	if !holderName.MatchString(holder) {
		return nil, fmt.Errorf("image %s: holder %q is not a path-safe name", ref, holder)
	}
	return c.get(ctx, ref, holder)
}

func (c *Cache) get(ctx context.Context, ref, holder string) (*provider.Image, error) {
	src, err := c.resolve(ctx, ref)
	if err != nil {
		return nil, err
	}
	img, unpacked, err := c.getLocked(ctx, src, holder)
	if err != nil {
		return nil, err
	}
	c.pruneAfterGet(ctx, src, unpacked)
	return img, nil
}

// getLocked is Get's work under the cache's shared lock, which keeps a
// Prune from removing the image between its check and its use (and its
// hold, when holder is not "").
func (c *Cache) getLocked(ctx context.Context, src *source, holder string) (*provider.Image, bool, error) {
	unlock, err := c.lockShared()
	if err != nil {
		return nil, false, fmt.Errorf("image %s: %w", src.ref, err)
	}
	defer unlock()
	var unpacked bool
	r, err := c.readRecord(src.digest)
	if err != nil || !c.present(r) {
		if r, unpacked, err = c.unpackImage(ctx, src); err != nil {
			return nil, false, err
		}
	}
	img, err := c.use(r, src.ref)
	if err == nil && holder != "" {
		err = c.writeHold(holder, src.digest)
	}
	if err != nil {
		return nil, false, fmt.Errorf("image %s: %w", src.ref, err)
	}
	return img, unpacked, nil
}

// Lookup returns an image already in the cache by its manifest digest
// ("sha256:<hex>"), for a restore, and marks it used. It returns
// ErrNotCached (wrapped, naming the digest) when the image or one of its
// layers is not there.
func (c *Cache) Lookup(digest string) (*provider.Image, error) {
	if _, ok := digestHex(digest); !ok {
		return nil, fmt.Errorf("%w: bad digest %q (want sha256:<64 hex>)", ErrNotCached, digest)
	}
	unlock, err := c.lockShared()
	if err != nil {
		return nil, fmt.Errorf("image: lookup: %w", err)
	}
	defer unlock()
	r, err := c.readRecord(digest)
	if err != nil {
		return nil, fmt.Errorf("image: lookup: %w", err)
	}
	if !c.present(r) {
		return nil, fmt.Errorf("image: lookup: %w: %s (a layer is missing)", ErrNotCached, digest)
	}
	return c.use(r, "")
}

var holderName = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$`)

// Hold keeps the image of digest from Prune until Release(holder): a file
// under the cache dir, so that it outlasts the process. holder is a
// path-safe name chosen by the caller (e.g. "overlay-<hash>-snapshot-<id>");
// a second Hold of the same holder replaces the first. Holding a digest
// not in the cache returns ErrNotCached.
func (c *Cache) Hold(holder, digest string) error {
	if !holderName.MatchString(holder) {
		return fmt.Errorf("image: holder %q is not a path-safe name", holder)
	}
	if _, ok := digestHex(digest); !ok {
		return fmt.Errorf("image: hold %s: bad digest %q", holder, digest)
	}
	unlock, err := c.lockShared()
	if err != nil {
		return fmt.Errorf("image: hold %s: %w", holder, err)
	}
	defer unlock()
	if _, err := c.readRecord(digest); err != nil {
		return fmt.Errorf("image: hold %s: %w", holder, err)
	}
	return c.writeHold(holder, digest)
}

// writeHold records holder's hold of digest; the caller holds the
// cache's lock shared.
func (c *Cache) writeHold(holder, digest string) error {
	if err := writeAtomic(filepath.Join(c.dir, holdsDir, holder), []byte(digest+"\n")); err != nil {
		return fmt.Errorf("image: hold %s: %w", holder, err)
	}
	return nil
}

// Holders returns the holders whose names start with prefix: a process
// that starts finds the holds an earlier one of its own left (a crash)
// and releases those nothing stands on any more.
func (c *Cache) Holders(prefix string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(c.dir, holdsDir))
	if err != nil {
		return nil, fmt.Errorf("image: holders: %w", err)
	}
	var out []string
	for _, e := range ents {
		if n := e.Name(); !strings.HasPrefix(n, ".") && strings.HasPrefix(n, prefix) {
			out = append(out, n)
		}
	}
	return out, nil
}

// Release drops holder's hold; releasing a holder that holds nothing is
// no error.
func (c *Cache) Release(holder string) error {
	if !holderName.MatchString(holder) {
		return fmt.Errorf("image: holder %q is not a path-safe name", holder)
	}
	err := os.Remove(filepath.Join(c.dir, holdsDir, holder))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("image: release %s: %w", holder, err)
	}
	return nil
}

// held returns the digests held.
func (c *Cache) held() (map[string]bool, error) {
	ents, err := os.ReadDir(filepath.Join(c.dir, holdsDir))
	if err != nil {
		return nil, err
	}
	out := make(map[string]bool)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(c.dir, holdsDir, e.Name()))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out[strings.TrimSpace(string(b))] = true
	}
	return out, nil
}
