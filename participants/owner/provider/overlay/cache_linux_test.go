//go:build linux

package overlay

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/image"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

// tarLayer is a layer of entries: name -> content for files, "->target"
// for symbolic links, "/" for directories.
func tarLayer(t *testing.T, ents [][2]string) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e[0], Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(e[1]))}
		switch {
		case e[1] == "/":
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		case len(e[1]) > 2 && e[1][:2] == "->":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, e[1][2:], 0
		case e[0] == "bin/busybox":
			h.Mode = 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write([]byte(e[1])); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// The image cache and the overlay provider together: an OCI layout of
// two layers (a whiteout, an opaque directory) resolved by the cache
// starts a sandbox on its layers; its snapshots and sandboxes hold the
// image against a prune down to nothing, a fork finds it by the digest
// its snapshot records, and once nothing holds it a prune removes it.
func TestOverlayOnImageCache(t *testing.T) {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatalf("needs a static busybox: apt-get install busybox-static (%v)", err)
	}
	bbData, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	bottom := [][2]string{{"bin", "/"}, {"bin/busybox", string(bbData)}, {"app", "/"}, {"app/README", "bottom readme\n"},
		{"gone.txt", "gone\n"}, {"d", "/"}, {"d/old.txt", "old\n"}, {"keep.txt", "bottom\n"}}
	for _, a := range []string{"sh", "cat", "ls", "test"} {
		bottom = append(bottom, [2]string{"bin/" + a, "->busybox"})
	}
	top := [][2]string{{".wh.gone.txt", ""}, {"d", "/"}, {"d/.wh..wh..opq", ""}, {"d/new.txt", "new\n"}, {"keep.txt", "top\n"}}
	img, err := mutate.AppendLayers(empty.Image, tarLayer(t, bottom), tarLayer(t, top))
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.Config(img, v1.Config{Env: []string{"PATH=/bin"}, WorkingDir: "/app"}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	cacheDir := filepath.Join(t.TempDir(), "cache")
	cache, err := image.Open(cacheDir, image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// The same directory bounded to nothing: its Prune removes all it may.
	tiny, err := image.Open(cacheDir, image.Options{MaxBytes: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	im, err := cache.Get(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	ov := newOverlay(t)
	ov.cfg.Images = cache

	providertest.Start(t, ov, provider.Spec{ID: "a", Image: im, Env: im.Env, Workdir: im.WorkingDir})
	if got, want := providertest.Sh(t, ov, "a", "pwd; cat README /keep.txt; ls /d; test ! -e /gone.txt && echo no-gone; echo w > w.txt"),
		"/app\nbottom readme\ntop\nnew.txt\nno-gone\n"; got != want {
		t.Fatalf("on the cached image: %q, want %q", got, want)
	}
	providertest.Snapshot(t, ov, "a", "s1")
	if err := ov.Stop(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := tiny.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	b := providertest.Fork(t, ov, "s1", provider.Spec{ID: "b", Workdir: "/app"})
	if got := providertest.Sh(t, ov, "b", "cat w.txt; echo $PATH"); got != "w\n/bin\n" {
		t.Errorf("fork on the cached image: %q", got)
	}
	if err := ov.DeleteSnapshot(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := tiny.Prune(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := cache.Lookup(im.Digest); err != nil {
		t.Errorf("the image a running fork stands on was pruned: %v", err)
	}
	if err := ov.Stop(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if freed, err := tiny.Prune(ctx); err != nil || freed == 0 {
		t.Errorf("prune with nothing holding the image: freed %d, %v", freed, err)
	}
	if _, err := cache.Lookup(im.Digest); !errors.Is(err, image.ErrNotCached) {
		t.Errorf("Lookup after the prune: %v, want ErrNotCached", err)
	}
}
