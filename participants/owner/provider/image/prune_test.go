//go:build linux

package image

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

func randomBody(t *testing.T, n int) string {
	t.Helper()
	b := make([]byte, n)
	rand.Read(b)
	return string(b)
}

func TestPruneDropsLeastRecentlyUsedAndKeepsHeld(t *testing.T) {
	ctx := context.Background()
	shared := layerOf(t, fileE("shared", randomBody(t, 64<<10)))
	la := layerOf(t, fileE("a", randomBody(t, 64<<10)))
	lb := layerOf(t, fileE("b", randomBody(t, 64<<10)))
	lc := layerOf(t, fileE("c", randomBody(t, 64<<10)))
	imgA := imageOf(t, v1.Config{}, shared, la)
	imgB := imageOf(t, v1.Config{}, shared, lb)
	imgC := imageOf(t, v1.Config{}, lc)
	dirA := writeLayout(t, []v1.Image{imgA})
	dirB := writeLayout(t, []v1.Image{imgB})
	dirC := writeLayout(t, []v1.Image{imgC})

	big := openCache(t, Options{})
	a, err := big.Get(ctx, dirA)
	if err != nil {
		t.Fatal(err)
	}
	b, err := big.Get(ctx, dirB)
	if err != nil {
		t.Fatal(err)
	}
	size := func(l v1.Layer) int64 { d, _ := l.DiffID(); return big.layerSize(d.String()) }
	sShared, sa, sb, sc := size(shared), size(la), size(lb), size(lc)
	if sShared < 64<<10 || sa < 64<<10 || sb < 64<<10 {
		t.Fatalf("measured sizes %d %d %d, want each >= 64 KiB", sShared, sa, sb)
	}

	// Bound: all four layers but one byte (C's layer is shaped as A's);
	// getting C must drop one image. A is
	// the least recently used but held: B goes, and the layer it shares
	// with A stays.
	bounded, err := Open(big.dir, Options{MaxBytes: sShared + sa + sb + sa - 1, Logger: big.opts.Logger})
	if err != nil {
		t.Fatal(err)
	}
	if err := bounded.Hold("sandbox-a", a.Digest); err != nil {
		t.Fatal(err)
	}
	c, err := bounded.Get(ctx, dirC)
	if err != nil {
		t.Fatal(err)
	}
	if sc = size(lc); sc < 64<<10 {
		t.Fatalf("C's layer measured %d", sc)
	}
	if _, err := bounded.Lookup(b.Digest); !errors.Is(err, ErrNotCached) {
		t.Fatalf("Lookup of B after the prune: %v, want ErrNotCached", err)
	}
	if _, err := os.Stat(b.Layers[1]); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("B's own layer is still there: %v", err)
	}
	for _, d := range []string{a.Digest, c.Digest} {
		if _, err := bounded.Lookup(d); err != nil {
			t.Fatalf("Lookup %s: %v", d, err)
		}
	}

	// Released, and A used less recently than C: A goes, shared layer
	// with it, down to a bound that holds C only.
	if err := bounded.Release("sandbox-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := bounded.Lookup(c.Digest); err != nil {
		t.Fatal(err)
	}
	small, err := Open(big.dir, Options{MaxBytes: sc, Logger: big.opts.Logger})
	if err != nil {
		t.Fatal(err)
	}
	freed, err := small.Prune(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if freed != sShared+sa {
		t.Fatalf("Prune freed %d, want %d (A's two layers)", freed, sShared+sa)
	}
	if _, err := small.Lookup(a.Digest); !errors.Is(err, ErrNotCached) {
		t.Fatalf("A after the prune: %v", err)
	}
	if _, err := small.Lookup(c.Digest); err != nil {
		t.Fatalf("C after the prune: %v", err)
	}

	// A held image is kept even over the bound; what a crash left in
	// tmp/ goes.
	leftover := filepath.Join(big.dir, tmpDir, "unpack-123", "half-a-layer")
	if err := os.MkdirAll(leftover, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := small.Hold("snapshot-c", c.Digest); err != nil {
		t.Fatal(err)
	}
	tiny, _ := Open(big.dir, Options{MaxBytes: 1, Logger: big.opts.Logger})
	if freed, err := tiny.Prune(ctx); err != nil || freed != 0 {
		t.Fatalf("Prune of a held image: freed %d, %v", freed, err)
	}
	if _, err := tiny.Lookup(c.Digest); err != nil {
		t.Fatalf("held C after the prune: %v", err)
	}
	if left := cacheEntries(t, tiny); len(left) != 3 {
		t.Fatalf("after the prunes the cache holds %v, want C's layer, size and record", left)
	}
}

// TestConcurrentGetsUnpackOnce runs Gets of one image at once, from two
// Caches on one directory (as two owners on one host would) and from two
// goroutines of each.
func TestConcurrentGetsUnpackOnce(t *testing.T) {
	img := richImage(t)
	dir := writeLayout(t, []v1.Image{img})
	c1 := openCache(t, Options{})
	c2, err := Open(c1.dir, Options{Logger: c1.opts.Logger})
	if err != nil {
		t.Fatal(err)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make([]error, 4)
	digests := make([]string, 4)
	for i, c := range []*Cache{c1, c2, c1, c2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			got, err := c.Get(context.Background(), dir)
			errs[i] = err
			if err == nil {
				digests[i] = got.Digest
			}
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil || digests[i] != digestOf(t, img) {
			t.Fatalf("Get %d: %s, %v", i, digests[i], err)
		}
	}
	if n := c1.unpacked.Load() + c2.unpacked.Load(); n != 2 {
		t.Fatalf("%d layer unpacks for a two-layer image, want 2", n)
	}
	mnt := t.TempDir()
	got, _ := c1.Lookup(digestOf(t, img))
	if err := os.Remove(mnt); err != nil {
		t.Fatal(err)
	}
	os.Mkdir(mnt, 0o755)
	if err := c1.Rootfs(context.Background(), got, mnt); err != nil {
		t.Fatal(err)
	}
	checkMerged(t, mnt)
}

// BenchmarkGet measures a Get of a cached image (a resolve and a record
// update) against a first Get (check and unpack) of the same image.
func BenchmarkGet(b *testing.B) {
	var ents []ent
	for i := range 200 {
		ents = append(ents, fileE(fmt.Sprintf("usr/lib/f%03d", i), strings.Repeat("x", 8<<10)))
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(tarOf(b, ents...))), nil
	})
	if err != nil {
		b.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		b.Fatal(err)
	}
	dir := filepath.Join(b.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		b.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("first", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			c, err := Open(filepath.Join(b.TempDir(), fmt.Sprint(i)), Options{})
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if _, err := c.Get(ctx, dir); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cached", func(b *testing.B) {
		c, err := Open(filepath.Join(b.TempDir(), "cache"), Options{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := c.Get(ctx, dir); err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			if _, err := c.Get(ctx, dir); err != nil {
				b.Fatal(err)
			}
		}
	})
}
