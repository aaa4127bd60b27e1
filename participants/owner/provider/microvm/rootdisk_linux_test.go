//go:build linux

package microvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/copytree"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm/qemu"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

// layerRootfs makes an image's merged tree the way the kernel merges
// layers: a read-only overlay of the image's layer directories (their
// whiteouts in overlayfs form), copied into dst. It counts its calls; with
// fail set it fails instead, as the image cache does for a broken image.
type layerRootfs struct {
	calls atomic.Int32
	fail  error
}

func (l *layerRootfs) Rootfs(ctx context.Context, img *provider.Image, dst string) error {
	l.calls.Add(1)
	if l.fail != nil {
		return l.fail
	}
	src := img.Layers[0]
	if len(img.Layers) > 1 {
		src = dst + ".merged"
		if err := os.Mkdir(src, 0o755); err != nil {
			return err
		}
		defer os.Remove(src)
		var lower []string
		for i := len(img.Layers) - 1; i >= 0; i-- {
			lower = append(lower, img.Layers[i])
		}
		if err := unix.Mount("overlay", src, "overlay", unix.MS_RDONLY, "lowerdir="+strings.Join(lower, ":")); err != nil {
			return fmt.Errorf("mount the layers: %w", err)
		}
		defer unix.Unmount(src, unix.MNT_DETACH)
	}
	if err := os.Remove(dst); err != nil {
		return err
	}
	_, err := copytree.Copy(ctx, src, dst)
	return err
}

// twoLayers splits the tree at base into two layers under dir: the lower
// holds all of it but usr/, with /etc/gone and /data/keep ("lower"); the
// upper holds usr/, a whiteout of /etc/gone, /data/keep ("upper") and
// /data/new. The image's digest is the hash of what the layers hold.
func twoLayers(t *testing.T, base, dir string) *provider.Image {
	t.Helper()
	lower, upper := filepath.Join(dir, "lower"), filepath.Join(dir, "upper")
	if _, err := copytree.Copy(context.Background(), base, lower); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(upper, 0o755); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(lower, "usr")); err == nil && fi.IsDir() {
		if err := os.Rename(filepath.Join(lower, "usr"), filepath.Join(upper, "usr")); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"lower/etc", "lower/data", "upper/etc", "upper/data"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for p, data := range map[string]string{"lower/etc/gone": "whited out\n", "lower/data/keep": "lower\n", "upper/data/keep": "upper\n", "upper/data/new": "new\n"} {
		if err := os.WriteFile(filepath.Join(dir, p), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mknod(filepath.Join(upper, "etc", "gone"), unix.S_IFCHR|0o000, 0); err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	for _, l := range []string{lower, upper} {
		sum, err := treeHash(l)
		if err != nil {
			t.Fatal(err)
		}
		h.Write([]byte(sum))
	}
	return &provider.Image{Ref: "/images/two-layers:test", Digest: "sha256:" + hex.EncodeToString(h.Sum(nil)), Layers: []string{lower, upper}}
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
	l := &layerRootfs{}
	m := diskProvider(t, l)
	tree := t.TempDir()
	for _, d := range []string{"bin", "etc"} {
		if err := os.Mkdir(filepath.Join(tree, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(tree, "bin", "sh"), []byte("#!/bin/true\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	img := twoLayers(t, tree, t.TempDir())
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
	l := &layerRootfs{fail: errors.New("layer sha256:abc: missing blob")}
	m := diskProvider(t, l)
	empty := t.TempDir()
	img := &provider.Image{Ref: "/images/broken:1", Digest: "sha256:" + strings.Repeat("ab", 32), Layers: []string{empty}}
	_, err := m.imageDisk(context.Background(), img)
	if err == nil || !strings.Contains(err.Error(), img.Ref) || !strings.Contains(err.Error(), img.Digest) || !strings.Contains(err.Error(), "missing blob") {
		t.Fatalf("a broken image: %v, want an error naming %s, %s and the cause", err, img.Ref, img.Digest)
	}
	l.fail = nil
	_, err = m.imageDisk(context.Background(), img) // an empty tree: no /bin/sh
	if err == nil || !strings.Contains(err.Error(), img.Ref) || !strings.Contains(err.Error(), "/bin/sh") {
		t.Fatalf("an image without /bin/sh: %v, want an error naming %s and /bin/sh", err, img.Ref)
	}
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
// default root tree, split, with a whiteout): a command in it sees the
// merged tree, the image's Env and Workdir reach its init (the default
// one, a sleep that PID 1 starts with the identity's environment), and a
// second sandbox of the image shares the root disk built once; a snapshot
// records the disk and the image's digest, and a fork of it runs on its
// disk.
func TestMicroVMStartsFromAnImage(t *testing.T) {
	tier.Long(t)
	requireMicroVM(t)
	l := &layerRootfs{}
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
	img := twoLayers(t, base, t.TempDir())
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
