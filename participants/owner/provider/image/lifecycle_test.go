//go:build linux

package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// GetHeld records its hold under Get's lock: a Prune right after it keeps
// the image until the holder is released; Holders finds it by prefix.
func TestGetHeldHoldsTheImage(t *testing.T) {
	ctx := context.Background()
	c := openCache(t, Options{})
	tiny, err := Open(c.dir, Options{MaxBytes: 1, Logger: c.opts.Logger})
	if err != nil {
		t.Fatal(err)
	}
	dir := writeLayout(t, []v1.Image{imageOf(t, v1.Config{}, layerOf(t, fileE("a", randomBody(t, 8<<10))))})
	if _, err := c.GetHeld(ctx, dir, "owner/../x"); err == nil || !strings.Contains(err.Error(), "path-safe") {
		t.Fatalf("GetHeld with a bad holder: %v", err)
	}
	img, err := c.GetHeld(ctx, dir, "owner-1234abcd-seed-s1-1")
	if err != nil {
		t.Fatal(err)
	}
	if hs, err := c.Holders("owner-1234abcd-seed-"); err != nil || !slices.Equal(hs, []string{"owner-1234abcd-seed-s1-1"}) {
		t.Fatalf("Holders: %v, %v", hs, err)
	}
	if hs, err := c.Holders("owner-ffffffff-"); err != nil || len(hs) != 0 {
		t.Fatalf("Holders of another prefix: %v, %v", hs, err)
	}
	if _, err := tiny.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lookup(img.Digest); err != nil {
		t.Fatalf("a held image after a prune over the bound: %v", err)
	}
	if err := c.Release("owner-1234abcd-seed-s1-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := tiny.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lookup(img.Digest); !errors.Is(err, ErrNotCached) {
		t.Fatalf("a released image after a prune over the bound: %v, want ErrNotCached", err)
	}
}

// A Get that unpacks while others are at work leaves the prune pending;
// the next Get, even of a cached image, does it.
func TestPendingPruneIsDoneByTheNextGet(t *testing.T) {
	ctx := context.Background()
	defer func(d time.Duration) { pruneWait = d }(pruneWait)
	pruneWait = 50 * time.Millisecond
	c := openCache(t, Options{MaxBytes: 20 << 10}) // one of the two images
	dirA := writeLayout(t, []v1.Image{imageOf(t, v1.Config{}, layerOf(t, fileE("a", randomBody(t, 8<<10))))})
	dirB := writeLayout(t, []v1.Image{imageOf(t, v1.Config{}, layerOf(t, fileE("b", randomBody(t, 8<<10))))})
	a, err := c.Get(ctx, dirA)
	if err != nil {
		t.Fatal(err)
	}
	unlock, err := c.lockShared() // another Get, or a Rootfs, at work
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, dirB); err != nil {
		t.Fatal(err)
	}
	unlock()
	if _, err := os.Lstat(filepath.Join(c.dir, pendingFile)); err != nil {
		t.Fatalf("no prune pending after a busy Get: %v", err)
	}
	if _, err := c.Lookup(a.Digest); err != nil {
		t.Fatalf("A pruned while the cache was busy: %v", err)
	}
	if _, err := c.Get(ctx, dirB); err != nil { // cached: unpacks nothing
		t.Fatal(err)
	}
	if _, err := c.Lookup(a.Digest); !errors.Is(err, ErrNotCached) {
		t.Fatalf("A after the pending prune: %v, want ErrNotCached", err)
	}
	if _, err := os.Lstat(filepath.Join(c.dir, pendingFile)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the prune is still pending: %v", err)
	}
}

// Prune deletes the layers it removes after it unlocks: Gets and Holds
// go on while a large layer is deleted.
func TestPruneDeletesAfterUnlock(t *testing.T) {
	ctx := context.Background()
	c := openCache(t, Options{})
	a, err := c.Get(ctx, writeLayout(t, []v1.Image{imageOf(t, v1.Config{}, layerOf(t, fileE("a", randomBody(t, 8<<10))))}))
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	pruneUnlocked = func(gone []string) {
		seen = gone
		f, err := lock(filepath.Join(c.dir, lockFile), unix.LOCK_SH|unix.LOCK_NB)
		if err != nil {
			t.Errorf("the cache's lock is held while the layers are deleted: %v", err)
			return
		}
		f.Close()
		for _, g := range gone {
			if _, err := os.Stat(filepath.Join(g, filepath.Base(a.Layers[0]))); err != nil {
				t.Errorf("the layer is not staged for deletion in %s: %v", g, err)
			}
		}
	}
	defer func() { pruneUnlocked = nil }()
	tiny, err := Open(c.dir, Options{MaxBytes: 1, Logger: c.opts.Logger})
	if err != nil {
		t.Fatal(err)
	}
	freed, err := tiny.Prune(ctx)
	if err != nil || freed == 0 || len(seen) != 1 {
		t.Fatalf("Prune: freed %d, %v; staged %v", freed, err, seen)
	}
	if left := cacheEntries(t, c); len(left) != 0 {
		t.Fatalf("after the prune the cache holds %v", left)
	}
}

// A layer that unpacks to more than the cache's bound (a compression
// bomb: a few KiB of gzip for 4 MiB of zeros) is refused, naming it,
// and leaves nothing behind.
func TestLayerOverTheBoundIsRefused(t *testing.T) {
	c := openCache(t, Options{MaxBytes: 1 << 20})
	bomb := layerOf(t, dirE("d"), fileE("d/zeros", string(make([]byte, 4<<20))))
	if d, _ := bomb.Digest(); d.String() == "" {
		t.Fatal("no digest")
	}
	_, err := c.Get(context.Background(), writeLayout(t, []v1.Image{imageOf(t, v1.Config{}, bomb)}))
	wantBad(t, c, err, layerDigest(t, bomb).String(), "d/zeros", "size bound")
}

// A whiteout hides the lower layers' entry only: an entry of its own
// layer of the same name stays, whichever comes first in the tar, and a
// directory there shows its own entries, not the lower ones'.
func TestWhiteoutLeavesItsOwnLayer(t *testing.T) {
	lower := layerOf(t, fileE("foo", "lower"), fileE("bar", "lower"), fileE("gone", "lower"),
		dirE("d"), fileE("d/x", "lower"), dirE("e"), fileE("e/x", "lower"))
	upper := layerOf(t,
		fileE("foo", "upper"), fileE(".wh.foo", ""), // entry, then whiteout
		fileE(".wh.bar", ""), fileE("bar", "upper"), // whiteout, then entry
		fileE(".wh.gone", ""),
		fileE(".wh.d", ""), dirE("d"), fileE("d/y", "upper"),
		dirE("e"), fileE("e/y", "upper"), fileE(".wh.e", ""))
	c := openCache(t, Options{})
	img, err := c.Get(context.Background(), writeLayout(t, []v1.Image{imageOf(t, v1.Config{}, lower, upper)}))
	if err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := c.Rootfs(context.Background(), img, dst); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]string{"foo": "upper", "bar": "upper", "d/y": "upper", "e/y": "upper"} {
		if b, err := os.ReadFile(filepath.Join(dst, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	for _, p := range []string{"gone", "d/x", "e/x"} {
		if _, err := os.Lstat(filepath.Join(dst, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want it hidden by the whiteout", p, err)
		}
	}
}

// Rootfs mounts with the classic lowerdir=a:b option (every kernel) and
// with lowerdir+ (Linux 6.8, any number of layers) alike.
func TestRootfsBothMountOptions(t *testing.T) {
	c := openCache(t, Options{})
	img, err := c.Get(context.Background(), writeLayout(t, []v1.Image{richImage(t)}))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { lowerdirPlus = nil }()
	for _, plus := range []bool{false, true} {
		var asked string
		lowerdirPlus = func(classic string) bool { asked = classic; return plus }
		dst := filepath.Join(t.TempDir(), "root")
		if err := os.Mkdir(dst, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := c.Rootfs(context.Background(), img, dst); err != nil {
			t.Fatalf("lowerdir+ %v: %v", plus, err)
		}
		if want := img.Layers[1] + ":" + img.Layers[0] + ":"; !strings.HasPrefix(asked, want) {
			t.Errorf("classic lowerdir %q, want it to start %q (top first)", asked, want)
		}
		checkMerged(t, dst)
	}
}
