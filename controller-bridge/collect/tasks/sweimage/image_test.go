package sweimage

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/stillpoint/stillpoint/internal/tier"
)

// The base is built (or found) in the cache, and two images over it go
// into one layout, each named by its annotation, with the repository at
// /testbed owned by root and the config's WorkingDir; writing them again
// replaces them, fast, and the base's blob is the cached file itself.
func TestWriteImagesOverTheBase(t *testing.T) {
	tier.Long(t)
	ctx := t.Context()
	t0 := time.Now()
	base, err := EnsureBase(ctx, "", testWriter{t})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("base ready in %s: %s, layer %s (%d bytes)", time.Since(t0), base.Rootfs, base.LayerInfo.Digest, base.LayerInfo.Size)
	for _, p := range []string{"usr/bin/python3", "usr/bin/git", "usr/lib/python3/dist-packages/pytest"} {
		if _, err := os.Stat(filepath.Join(base.Rootfs, p)); err != nil {
			t.Fatalf("the base lacks %s: %v", p, err)
		}
	}
	repo := t.TempDir()
	if err := os.WriteFile(filepath.Join(repo, "a.py"), []byte("x = 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("git", "-C", repo, "init", "-q").CombinedOutput(); err != nil {
		t.Fatalf("git init: %v %s", err, out)
	}
	dir := filepath.Join(t.TempDir(), "oci")
	for range 2 {
		t1 := time.Now()
		refs, err := Write(ctx, base, dir, []Spec{{Name: "one", Repo: repo}, {Name: "two", Repo: repo}})
		if err != nil {
			t.Fatal(err)
		}
		if refs["one"] != dir+":one" || refs["two"] != dir+":two" {
			t.Fatalf("refs %v", refs)
		}
		t.Logf("two images written in %s", time.Since(t1))
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	ii, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := ii.IndexManifest()
	if err != nil || len(im.Manifests) != 2 {
		t.Fatalf("index %+v, %v: want the two images once each", im, err)
	}
	i := slices.IndexFunc(im.Manifests, func(d v1.Descriptor) bool { return d.Annotations[RefNameAnnotation] == "one" })
	if i < 0 {
		t.Fatalf("no image named one: %+v", im.Manifests)
	}
	imgs, err := ii.Image(im.Manifests[i].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := imgs.ConfigFile()
	if err != nil || cfg.Config.WorkingDir != Workdir || !slices.Contains(cfg.Config.Env, "PATH="+ImagePath) || len(cfg.RootFS.DiffIDs) != 2 {
		t.Fatalf("config %+v, %v", cfg, err)
	}
	layers, err := imgs.Layers()
	if err != nil || len(layers) != 2 {
		t.Fatalf("layers %v, %v", layers, err)
	}
	if d, _ := layers[0].Digest(); d.String() != base.LayerInfo.Digest {
		t.Fatalf("base layer %s, want %s", d, base.LayerInfo.Digest)
	}
	var a, b os.FileInfo
	if a, err = os.Stat(base.Layer); err == nil {
		b, err = os.Stat(filepath.Join(dir, "blobs", "sha256", base.LayerInfo.Digest[len("sha256:"):]))
	}
	if err != nil || !os.SameFile(a, b) {
		t.Errorf("the layout's base blob is not the cached layer: %v", err)
	}
	rc, err := layers[1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	seen := map[string]bool{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s owned by %d:%d, want root", h.Name, h.Uid, h.Gid)
		}
		seen[h.Name] = true
	}
	if !seen["testbed/"] || !seen["testbed/a.py"] || !seen["testbed/.git/HEAD"] {
		t.Fatalf("repository layer: %v", seen)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s", p)
	return len(p), nil
}

// .ci/swe-base builds the base CI caches before the tests: its names and
// packages must be these, or EnsureBase builds its own again.
func TestCIScriptAgrees(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "..", "..", ".ci", "swe-base"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"name=" + baseName + "\n", "packages=" + strings.Join(Packages, ",") + "\n", "mirror=" + Mirror + "\n",
		"cache=${1:-" + DefaultCache + "}\n", `"$cache/.lock"`, `"$cache/$name.done"`, " " + Suite + " "} {
		if !strings.Contains(string(b), want) {
			t.Errorf(".ci/swe-base does not hold %q", want)
		}
	}
}
