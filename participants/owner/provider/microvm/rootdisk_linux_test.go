//go:build linux

package microvm

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/image"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm/qemu"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

// countingRootfs is the image cache as the provider sees it, counting the
// trees it makes; with fail set it fails instead, as the cache does for a
// broken image.
type countingRootfs struct {
	RootfsMaker
	calls atomic.Int32
	fail  error
}

func (c *countingRootfs) Rootfs(ctx context.Context, img *provider.Image, dst string) error {
	c.calls.Add(1)
	if c.fail != nil {
		return c.fail
	}
	return c.RootfsMaker.Rootfs(ctx, img, dst)
}

// The owner's image cache makes the trees.
var _ RootfsMaker = (*image.Cache)(nil)

// tarEntry is one entry of a test layer: a file of the tree at src (its
// owner, mode, link target and data), or, with src "", a file of body.
type tarEntry struct {
	name, src, body string
	dir             bool
}

// layerOf is a layer of entries.
func layerOf(t *testing.T, ents []tarEntry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(e.body)), ModTime: time.Unix(1e9, 0), Format: tar.FormatPAX}
		data := []byte(e.body)
		if e.dir {
			h = &tar.Header{Name: e.name + "/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(1e9, 0), Format: tar.FormatPAX}
		}
		if e.src != "" {
			fi, err := os.Lstat(e.src)
			if err != nil {
				t.Fatal(err)
			}
			link := ""
			if fi.Mode()&fs.ModeSymlink != 0 {
				if link, err = os.Readlink(e.src); err != nil {
					t.Fatal(err)
				}
			}
			if h, err = tar.FileInfoHeader(fi, link); err != nil {
				t.Fatal(err)
			}
			h.Name, h.Format, data = e.name, tar.FormatPAX, nil
			if fi.IsDir() {
				h.Name += "/"
			}
			if fi.Mode().IsRegular() {
				if data, err = os.ReadFile(e.src); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(data); err != nil {
			t.Fatal(err)
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

// twoLayers makes an OCI layout of the tree at base split into two layers
// and returns it as the image cache (under dir) resolves it: the lower
// layer holds all of the tree but usr/, with /etc/gone and /data/keep
// ("lower"); the upper holds usr/, a whiteout of /etc/gone, /data/keep
// ("upper") and /data/new.
func twoLayers(t *testing.T, base, dir string) (*image.Cache, *provider.Image) {
	t.Helper()
	var lower, upper []tarEntry
	err := filepath.WalkDir(base, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == base {
			return err
		}
		rel, _ := filepath.Rel(base, p)
		if rel == "usr" || strings.HasPrefix(rel, "usr/") {
			upper = append(upper, tarEntry{name: rel, src: p})
		} else {
			lower = append(lower, tarEntry{name: rel, src: p})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	lower = append(lower, tarEntry{name: "etc", dir: true}, tarEntry{name: "etc/gone", body: "whited out\n"},
		tarEntry{name: "data", dir: true}, tarEntry{name: "data/keep", body: "lower\n"})
	upper = append(upper, tarEntry{name: "etc", dir: true}, tarEntry{name: "etc/.wh.gone"},
		tarEntry{name: "data", dir: true}, tarEntry{name: "data/keep", body: "upper\n"}, tarEntry{name: "data/new", body: "new\n"})
	img, err := mutate.AppendLayers(empty.Image, layerOf(t, lower), layerOf(t, upper))
	if err != nil {
		t.Fatal(err)
	}
	ref := filepath.Join(dir, "layout")
	lp, err := layout.Write(ref, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	cache, err := image.Open(filepath.Join(dir, "cache"), image.Options{})
	if err != nil {
		t.Fatal(err)
	}
	pi, err := cache.Get(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	return cache, pi
}

// diskProvider is a provider that builds disks and boots nothing: enough
// for imageDisk and pruneCache.
func diskProvider(t *testing.T, images RootfsMaker) *Provider {
	t.Helper()
	providertest.RequireRoot(t)
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		t.Fatalf("mkfs.ext4: %v (apt-get install e2fsprogs)", err)
	}
	if _, err := exec.LookPath("debugfs"); err != nil {
		t.Fatalf("debugfs: %v (apt-get install e2fsprogs)", err)
	}
	return &Provider{cfg: Config{StateDir: t.TempDir(), BaseSize: 16 << 20, Images: images}, cache: t.TempDir(), assets: qemu.Assets{MkfsExt4: mkfs}}
}

// shTree is a tree with a /bin/sh (a script: no guest runs it).
func shTree(t *testing.T) string {
	t.Helper()
	tree := t.TempDir()
	if err := os.Mkdir(filepath.Join(tree, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "bin", "sh"), []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return tree
}

// debugfsLs lists a directory of an ext4 image, one name a line.
func debugfsLs(t *testing.T, disk, dir string) []string {
	t.Helper()
	out, err := exec.Command("debugfs", "-R", "ls -p "+dir, disk).CombinedOutput()
	if err != nil {
		t.Fatalf("debugfs ls %s: %v: %s", dir, err, out)
	}
	var names []string
	for _, l := range strings.Split(string(out), "\n") {
		// /inode/mode/uid/gid/name/size/
		if f := strings.Split(l, "/"); len(f) >= 6 && f[5] != "." && f[5] != ".." {
			names = append(names, f[5])
		}
	}
	return names
}

// TestMicroVMImageDiskIsBuiltOnce: the root disk of an image is its merged
// tree (the lower layer's whited-out file gone), with the guest's mount
// points added, built once for any number of starts, concurrent or not.
func TestMicroVMImageDiskIsBuiltOnce(t *testing.T) {
	cache, img := twoLayers(t, shTree(t), t.TempDir())
	l := &countingRootfs{RootfsMaker: cache}
	m := diskProvider(t, l)
	var wg sync.WaitGroup
	disks := make([]string, 3)
	errs := make([]error, 3)
	for i := range disks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			disks[i], errs[i] = m.imageDisk(context.Background(), img)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if disk, err := m.imageDisk(context.Background(), img); err != nil || disk != disks[0] || disks[1] != disks[0] || disks[2] != disks[0] {
		t.Fatalf("the disks of one image: %v and %s, %v", disks, disk, err)
	}
	if n := l.calls.Load(); n != 1 {
		t.Errorf("the image's tree was made %d times for four starts, want once", n)
	}
	ents, _ := os.ReadDir(filepath.Join(m.cache, "images"))
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if len(names) != 2 || !strings.HasSuffix(disks[0], ".ext4") || names[0] != filepath.Base(disks[0]) || !strings.HasSuffix(names[1], ".lock") {
		t.Errorf("the cache's images hold %v, want the disk %s and its lock", names, filepath.Base(disks[0]))
	}
	if got := strings.Join(debugfsLs(t, disks[0], "/etc"), " "); got != "" {
		t.Errorf("the disk's /etc holds %q, want nothing: /etc/gone is whited out", got)
	}
	if got := strings.Join(debugfsLs(t, disks[0], "/data"), " "); got != "keep new" && got != "new keep" {
		t.Errorf("the disk's /data holds %q, want keep and new", got)
	}
	root := strings.Join(debugfsLs(t, disks[0], "/"), " ")
	for _, d := range []string{"proc", "sys", "dev", "tmp", "run", "var", "opt"} {
		if !strings.Contains(" "+root+" ", " "+d+" ") {
			t.Errorf("the disk's root %q lacks the guest's mount point /%s", root, d)
		}
	}
	if got := strings.Join(debugfsLs(t, disks[0], "/opt/stillpoint"), " "); got != "bin" {
		t.Errorf("the disk's /opt/stillpoint holds %q, want bin", got)
	}
}

// TestMicroVMBadImageLeavesNothing: an image whose tree cannot be made,
// or that has no /bin/sh, fails with an error naming its reference and
// digest, and leaves nothing of the build in the cache; a malformed
// digest is refused.
func TestMicroVMBadImageLeavesNothing(t *testing.T) {
	cache, img := twoLayers(t, shTree(t), t.TempDir())
	l := &countingRootfs{RootfsMaker: cache}
	m := diskProvider(t, l)
	if err := os.RemoveAll(img.Layers[1]); err != nil { // a layer gone from under the cache
		t.Fatal(err)
	}
	_, err := m.imageDisk(context.Background(), img)
	if err == nil || !strings.Contains(err.Error(), img.Ref) || !strings.Contains(err.Error(), img.Digest) {
		t.Fatalf("a broken image: %v, want an error naming %s and %s", err, img.Ref, img.Digest)
	}
	t.Logf("a broken image: %v", err)
	cache, noSh := twoLayers(t, t.TempDir(), t.TempDir())
	l.RootfsMaker = cache
	_, err = m.imageDisk(context.Background(), noSh)
	if err == nil || !strings.Contains(err.Error(), noSh.Ref) || !strings.Contains(err.Error(), "/bin/sh") {
		t.Fatalf("an image without /bin/sh: %v, want an error naming %s and /bin/sh", err, noSh.Ref)
	}
	l.fail = errors.New("layer sha256:abc: missing blob")
	if _, err = m.imageDisk(context.Background(), noSh); err == nil || !strings.Contains(err.Error(), "missing blob") {
		t.Fatalf("an image the cache cannot make: %v, want its error", err)
	}
	empty := t.TempDir()
	ents, _ := os.ReadDir(filepath.Join(m.cache, "images"))
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".lock") {
			t.Errorf("a failed build left %s in the cache", e.Name())
		}
	}
	bad := &provider.Image{Ref: "/images/bad", Digest: "sha256:../../x", Layers: []string{empty}}
	if _, err := m.imageDisk(context.Background(), bad); !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), bad.Ref) {
		t.Errorf("a malformed digest: %v, want ErrInvalid naming %s", err, bad.Ref)
	}
	m.cfg.Images = nil
	if _, err := m.imageDisk(context.Background(), img); !errors.Is(err, provider.ErrInvalid) {
		t.Errorf("an image without Config.Images: %v, want ErrInvalid", err)
	}
}

// TestMicroVMPruneKeepsTheImageDisksSandboxesStandOn: pruning the cache
// keeps an image's root disk that a kept snapshot of another state
// directory, or a running sandbox, stands on, however old; it removes an
// old one nothing stands on and a dead build's staging directory, but not
// one a live build holds the lock of.
func TestMicroVMPruneKeepsTheImageDisksSandboxesStandOn(t *testing.T) {
	m := diskProvider(t, nil)
	other := &Provider{cfg: Config{StateDir: t.TempDir()}, cache: m.cache}
	imgs := filepath.Join(m.cache, "images")
	old := time.Now().Add(-2 * PruneUnused)
	disk := func(i int) string {
		return filepath.Join(imgs, fmt.Sprintf("image-%s-1024.ext4", strings.Repeat(fmt.Sprint(i), 64)))
	}
	for i := range 4 {
		if err := os.MkdirAll(imgs, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(disk(i), []byte("disk"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	deadStage := strings.TrimSuffix(disk(2), ".ext4") + ".stage"
	liveStage := strings.TrimSuffix(disk(3), ".ext4") + ".stage"
	for _, s := range []string{deadStage, liveStage} {
		if err := os.MkdirAll(filepath.Join(s, "usr"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	_ = os.Remove(disk(3)) // being built
	unlock, err := lockFile(strings.TrimSuffix(disk(3), ".ext4") + ".lock")
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	for _, p := range []string{disk(0), disk(1), disk(2), deadStage, liveStage} {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	snap := filepath.Join(other.cfg.StateDir, "snapshots", "s1")
	box := filepath.Join(m.cfg.StateDir, "sandboxes", "vm1")
	for d, base := range map[string]string{snap: disk(0), box: disk(1)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := vmFile(d).Write(vmMeta{Chain: []string{filepath.Join(d, "x.qcow2")}, Base: base, Image: "sha256:..."}); err != nil {
			t.Fatal(err)
		}
	}
	if err := other.registerCacheUser(); err != nil {
		t.Fatal(err)
	}
	if err := m.pruneCache(); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]bool{disk(0): true, disk(1): true, disk(2): false, deadStage: false, liveStage: true} {
		if got := providertest.Exists(p); got != want {
			t.Errorf("after pruning, %s exists: %v, want %v", filepath.Base(p), got, want)
		}
	}
}

// TestMicroVMStartsFromAnImage boots a guest from a two-layer image (the
// default root tree, split, with a whiteout, in an OCI layout the image
// cache resolves): a command in it sees the
// merged tree, the image's Env and Workdir reach its init (the default
// one, a sleep that PID 1 starts with the identity's environment), and a
// second sandbox of the image shares the root disk built once; a snapshot
// records the disk and the image's digest, and a fork of it runs on its
// disk.
func TestMicroVMStartsFromAnImage(t *testing.T) {
	tier.Long(t)
	requireMicroVM(t)
	l := &countingRootfs{}
	sd := build.StaticForTest(t, build.Sandboxd)[build.Sandboxd]
	m, err := New(Config{StateDir: t.TempDir(), CacheDir: t.TempDir(), Sandboxd: sd, Accel: "tcg", Lease: 20 * time.Second, Images: l})
	if err != nil {
		t.Fatal(err)
	}
	defer cleanupMicroVM(t, m)
	base, err := m.defaultBaseTree(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	cache, img := twoLayers(t, base, t.TempDir())
	l.RootfsMaker = cache
	spec := func(id string) provider.Spec {
		return provider.Spec{ID: id, Image: img, Workdir: "/srv/app", Env: []string{"FROM_IMAGE=yes", "PATH=/usr/bin:/bin"}}
	}
	t0 := time.Now()
	providertest.Start(t, m, spec("img1"))
	t.Logf("start from the image (disk and template included) took %s", time.Since(t0))
	got := providertest.Sh(t, m, "img1", `pwd; cat /data/keep /data/new; test -e /etc/gone && echo gone-is-there; ls /usr/bin/setsid; echo "$FROM_IMAGE"; tr '\0' '\n' </proc/$(pidof sleep)/environ | grep FROM_IMAGE`)
	if want := "/srv/app\nupper\nnew\n/usr/bin/setsid\nyes\nFROM_IMAGE=yes\n"; got != want {
		t.Fatalf("in the image's guest: %q, want %q", got, want)
	}
	t1 := time.Now()
	providertest.Start(t, m, spec("img2"))
	t.Logf("second start from the image took %s", time.Since(t1))
	if got := providertest.Sh(t, m, "img2", "cat /data/keep"); got != "upper\n" {
		t.Fatalf("the second sandbox reads %q", got)
	}
	if n := l.calls.Load(); n != 1 {
		t.Errorf("the image's tree was made %d times for two sandboxes, want once", n)
	}
	disks, _ := filepath.Glob(filepath.Join(m.cache, "images", "image-*.ext4"))
	if len(disks) != 1 {
		t.Fatalf("the cache holds the image disks %v, want one", disks)
	}
	providertest.Sh(t, m, "img1", "echo written > /data/written")
	if _, err := m.Snapshot(context.Background(), "img1", "s1"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Fork(context.Background(), "s1", spec("img3")); err != nil {
		t.Fatal(err)
	}
	if got := providertest.Sh(t, m, "img3", "cat /data/keep /data/written"); got != "upper\nwritten\n" {
		t.Errorf("a fork of the image's sandbox reads %q", got)
	}
	sdir, _, release, err := m.snaps.Open("s1")
	if err != nil {
		t.Fatal(err)
	}
	meta, err := vmFile(sdir).Read()
	release()
	if err != nil || meta.Base != disks[0] || meta.Image != img.Digest {
		t.Errorf("the snapshot's vm.json: base %s image %s (%v), want %s and %s", meta.Base, meta.Image, err, disks[0], img.Digest)
	}
}
