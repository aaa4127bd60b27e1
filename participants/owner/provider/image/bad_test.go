//go:build linux

package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// wantBad checks that err is ErrBadImage naming every one of names, and
// that the cache holds nothing: no layer, record, size or staging.
func wantBad(t *testing.T, c *Cache, err error, names ...string) {
	t.Helper()
	if !errors.Is(err, ErrBadImage) {
		t.Fatalf("error %v, want ErrBadImage", err)
	}
	for _, n := range names {
		if !strings.Contains(err.Error(), n) {
			t.Errorf("error %q does not name %q", err, n)
		}
	}
	if left := cacheEntries(t, c); len(left) != 0 {
		t.Errorf("a bad image left %v in the cache", left)
	}
}

func layerDigest(t *testing.T, l v1.Layer) v1.Hash {
	t.Helper()
	d, err := l.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestUnsafeLayersAreRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ents  []ent
		entry string
		why   string
	}{
		{"dotdot", []ent{fileE("../etc/x", "x")}, "../etc/x", "climbs out"},
		{"dotdot inside", []ent{dirE("a/"), fileE("a/../../x", "x")}, "a/../../x", "climbs out"},
		{"absolute", []ent{fileE("/abs", "x")}, "/abs", "absolute"},
		{"through a symlink", []ent{symlinkE("etc", "/etc"), fileE("etc/x", "x")}, "etc/x", "symbolic link"},
		{"through a relative symlink", []ent{dirE("d/"), symlinkE("d/up", ".."), fileE("d/up/x", "x")}, "d/up/x", "symbolic link"},
		{"hard link out", []ent{linkE("h", "../../etc/passwd")}, "h", "outside the layer"},
		{"hard link absolute", []ent{linkE("h", "/etc/passwd")}, "h", "outside the layer"},
		{"hard link to nothing", []ent{linkE("h", "etc/passwd")}, "h", "not in the layer"},
		{"hard link through a symlink", []ent{symlinkE("e", "/etc"), linkE("h", "e/passwd")}, "h", "symbolic link"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := openCache(t, Options{})
			good := layerOf(t, fileE("ok", "fine"))
			bad := layerOf(t, tc.ents...)
			dir := writeLayout(t, []v1.Image{imageOf(t, v1.Config{}, good, bad)})
			_, err := c.Get(context.Background(), dir)
			wantBad(t, c, err, dir, layerDigest(t, bad).String(), tc.entry, tc.why)
			if _, err := os.Stat("/abs"); err == nil && tc.name == "absolute" {
				t.Error("/abs was written on the host")
			}
		})
	}
}

func TestBrokenLayoutsAreRefused(t *testing.T) {
	bottom := layerOf(t, fileE("a", strings.Repeat("a", 4096)))
	top := layerOf(t, fileE("b", strings.Repeat("b", 4096)))
	img := imageOf(t, v1.Config{}, bottom, top)
	blob := func(dir string, h v1.Hash) string { return filepath.Join(dir, "blobs", h.Algorithm, h.Hex) }

	t.Run("missing blob", func(t *testing.T) {
		c := openCache(t, Options{})
		dir := writeLayout(t, []v1.Image{img})
		if err := os.Remove(blob(dir, layerDigest(t, top))); err != nil {
			t.Fatal(err)
		}
		_, err := c.Get(context.Background(), dir)
		wantBad(t, c, err, dir, "missing blob "+layerDigest(t, top).String())
	})
	t.Run("bad digest", func(t *testing.T) {
		c := openCache(t, Options{})
		dir := writeLayout(t, []v1.Image{img})
		corrupt(t, blob(dir, layerDigest(t, top)))
		_, err := c.Get(context.Background(), dir)
		wantBad(t, c, err, dir, "the manifest says "+layerDigest(t, top).String())
	})
	t.Run("bad config", func(t *testing.T) {
		c := openCache(t, Options{})
		dir := writeLayout(t, []v1.Image{img})
		cn, _ := img.ConfigName()
		corrupt(t, blob(dir, cn))
		_, err := c.Get(context.Background(), dir)
		wantBad(t, c, err, dir, cn.String())
	})
	t.Run("bad diff id", func(t *testing.T) {
		// A config whose diff id is not the layer's: the blob is intact.
		c := openCache(t, Options{})
		other := layerOf(t, fileE("c", "c"))
		cf, _ := img.ConfigFile()
		cf = cf.DeepCopy()
		d, _ := other.DiffID()
		cf.RootFS.DiffIDs[1] = d
		liar, err := mutate.ConfigFile(img, cf)
		if err != nil {
			t.Fatal(err)
		}
		dir := writeLayout(t, []v1.Image{liar})
		_, err = c.Get(context.Background(), dir)
		wantBad(t, c, err, dir, "the config says "+d.String())
	})
}

// corrupt flips bytes in the middle of a file, keeping its size.
func corrupt(t *testing.T, p string) {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	for i := len(b) / 2; i < len(b)/2+8 && i < len(b); i++ {
		b[i] ^= 0xff
	}
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// writeArchive writes imgs as one docker save archive, tagged.
func writeArchive(t *testing.T, imgs map[string]v1.Image) string {
	t.Helper()
	refs := map[name.Reference]v1.Image{}
	for tag, img := range imgs {
		tg, err := name.NewTag(tag)
		if err != nil {
			t.Fatal(err)
		}
		refs[tg] = img
	}
	p := filepath.Join(t.TempDir(), "image.tar")
	if err := tarball.MultiRefWriteToFile(p, refs); err != nil {
		t.Fatal(err)
	}
	return p
}

// rewriteArchive rewrites a tar file, passing each entry through edit
// (nil drops the entry).
func rewriteArchive(t *testing.T, p string, edit func(h *tar.Header, body []byte) []byte) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if body = edit(h, body); body == nil {
			continue
		}
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	tw.Close()
	if err := os.WriteFile(p, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestGetDockerSaveArchive(t *testing.T) {
	c := openCache(t, Options{})
	rich := richImage(t)
	other := imageOf(t, v1.Config{WorkingDir: "/other"}, layerOf(t, fileE("o", "o")))
	p := writeArchive(t, map[string]v1.Image{"example.com/team/rich:v1": rich, "other:latest": other})
	ctx := context.Background()
	if _, err := c.Get(ctx, p); !errors.Is(err, ErrBadImage) || !strings.Contains(err.Error(), "pick one") {
		t.Fatalf("Get of a two-image archive without a pick: %v", err)
	}
	got, err := c.Get(ctx, p+":example.com/team/rich:v1")
	if err != nil {
		t.Fatal(err)
	}
	cn, _ := rich.ConfigName()
	if got.Digest != cn.String() || got.WorkingDir != "/work" || len(got.Layers) != 2 {
		t.Fatalf("image = %+v, want digest %s (the config's)", got, cn)
	}
	mnt := filepath.Join(t.TempDir(), "root")
	os.Mkdir(mnt, 0o755)
	if err := c.Rootfs(ctx, got, mnt); err != nil {
		t.Fatal(err)
	}
	checkMerged(t, mnt)
	if got, err := c.Get(ctx, p+":other"); err != nil || got.WorkingDir != "/other" {
		t.Fatalf("Get :other = %+v, %v", got, err)
	}
	if _, err := c.Get(ctx, p+":nope:v9"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a missing tag: %v, want ErrNotFound", err)
	}
}

func TestBrokenArchivesAreRefused(t *testing.T) {
	bottom := layerOf(t, fileE("a", strings.Repeat("a", 4096)))
	top := layerOf(t, fileE("b", strings.Repeat("b", 4096)))
	img := imageOf(t, v1.Config{}, bottom, top)
	topFile := layerDigest(t, top).Hex + ".tar.gz"

	t.Run("missing blob", func(t *testing.T) {
		c := openCache(t, Options{})
		p := writeArchive(t, map[string]v1.Image{"x:v1": img})
		rewriteArchive(t, p, func(h *tar.Header, b []byte) []byte {
			if h.Name == topFile {
				return nil
			}
			return b
		})
		_, err := c.Get(context.Background(), p)
		wantBad(t, c, err, p, "missing blob "+topFile)
	})
	t.Run("bad digest", func(t *testing.T) {
		c := openCache(t, Options{})
		p := writeArchive(t, map[string]v1.Image{"x:v1": img})
		rewriteArchive(t, p, func(h *tar.Header, b []byte) []byte {
			if h.Name == topFile {
				for i := len(b) / 2; i < len(b)/2+8; i++ {
					b[i] ^= 0xff
				}
			}
			return b
		})
		_, err := c.Get(context.Background(), p)
		wantBad(t, c, err, p, "the manifest says "+layerDigest(t, top).String())
	})
	t.Run("unsafe path", func(t *testing.T) {
		c := openCache(t, Options{})
		bad := layerOf(t, fileE("../../escape", "x"))
		p := writeArchive(t, map[string]v1.Image{"x:v1": imageOf(t, v1.Config{}, bottom, bad)})
		_, err := c.Get(context.Background(), p)
		wantBad(t, c, err, p, "../../escape", "climbs out")
	})
}
