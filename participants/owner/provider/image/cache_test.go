//go:build linux

package image

import (
	"archive/tar"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

var noDigest = "sha256:" + strings.Repeat("0", 64)

var richConfig = v1.Config{
	Env:        []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"},
	WorkingDir: "/work",
	User:       "1000:1000",
}

// richImage is two layers with every kind of entry the cache must keep:
// owners, setuid and sticky modes, hard links, symbolic links, devices, a
// fifo, xattrs, a whiteout and an opaque directory.
func richImage(t *testing.T) v1.Image {
	bottom := layerOf(t,
		dirE("etc/"),
		ent{name: "etc/passwd", typ: tar.TypeReg, body: "root:x:0:0::/root:/bin/sh\n", mode: 0o644},
		ent{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		ent{name: "bin/su", typ: tar.TypeReg, body: "setuid", mode: 0o4755, uid: 0, gid: 0},
		linkE("bin/su-again", "bin/su"),
		symlinkE("bin/sh", "/bin/busybox"),
		ent{name: "home/", typ: tar.TypeDir},
		ent{name: "home/u/", typ: tar.TypeDir, mode: 0o750, uid: 1000, gid: 1001},
		ent{name: "home/u/notes", typ: tar.TypeReg, body: "mine", uid: 1000, gid: 1001,
			xattrs: map[string]string{"user.origin": "test", "trusted.overlay.opaque": "y"}},
		ent{name: "tmp/", typ: tar.TypeDir, mode: 0o1777},
		ent{name: "dev/", typ: tar.TypeDir},
		ent{name: "dev/null", typ: tar.TypeChar, mode: 0o666, major: 1, minor: 3},
		ent{name: "dev/loop9", typ: tar.TypeBlock, mode: 0o660, major: 7, minor: 9},
		ent{name: "dev/pipe", typ: tar.TypeFifo, mode: 0o600},
		fileE("old/gone", "lower"),
		fileE("cache/lower", "hidden"),
		fileE("etc/removed", "bye"),
	)
	top := layerOf(t,
		fileE("etc/.wh.removed", ""),
		dirE("cache/"),
		fileE("cache/.wh..wh..opq", ""),
		fileE("cache/upper", "shown"),
		fileE("etc/hostname", "top\n"),
		dirE("work/"),
	)
	return imageOf(t, richConfig, bottom, top)
}

func TestGetLayoutUnpacksEveryKindOfEntry(t *testing.T) {
	c := openCache(t, Options{})
	img := richImage(t)
	dir := writeLayout(t, []v1.Image{img})
	got, err := c.Get(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.Ref != dir || got.Digest != digestOf(t, img) || len(got.Layers) != 2 {
		t.Fatalf("image = %+v, want ref %s digest %s and 2 layers", got, dir, digestOf(t, img))
	}
	if !slices.Equal(got.Env, richConfig.Env) || got.WorkingDir != "/work" || got.User != "1000:1000" {
		t.Fatalf("config = %v %q %q", got.Env, got.WorkingDir, got.User)
	}
	bottom, top := got.Layers[0], got.Layers[1]
	ls, _ := img.Layers()
	diff, _ := ls[0].DiffID()
	if bottom != filepath.Join(c.dir, "layers", diff.Hex) {
		t.Fatalf("bottom layer at %s, want layers/%s", bottom, diff.Hex)
	}

	if st := lstat(t, filepath.Join(bottom, "bin/su")); st.Mode&0o7777 != 0o4755 || st.Nlink != 2 {
		t.Errorf("bin/su mode %o nlink %d, want 4755 and 2", st.Mode&0o7777, st.Nlink)
	}
	if a, b := lstat(t, filepath.Join(bottom, "bin/su")), lstat(t, filepath.Join(bottom, "bin/su-again")); a.Ino != b.Ino {
		t.Error("bin/su and its hard link are not one inode")
	}
	if l, err := os.Readlink(filepath.Join(bottom, "bin/sh")); err != nil || l != "/bin/busybox" {
		t.Errorf("bin/sh -> %q, %v", l, err)
	}
	if st := lstat(t, filepath.Join(bottom, "home/u")); st.Uid != 1000 || st.Gid != 1001 || st.Mode&0o7777 != 0o750 {
		t.Errorf("home/u %d:%d %o, want 1000:1001 750", st.Uid, st.Gid, st.Mode&0o7777)
	}
	if st := lstat(t, filepath.Join(bottom, "home/u/notes")); st.Uid != 1000 || st.Mtim.Sec != testTime.Unix() {
		t.Errorf("home/u/notes owner %d mtime %d", st.Uid, st.Mtim.Sec)
	}
	if st := lstat(t, filepath.Join(bottom, "home")); st.Mtim.Sec != testTime.Unix() {
		t.Errorf("home's mtime %d, want the tar's", st.Mtim.Sec)
	}
	if v := xattr(t, filepath.Join(bottom, "home/u/notes"), "user.origin"); v != "test" {
		t.Errorf("user.origin = %q", v)
	}
	if _, err := unix.Lgetxattr(filepath.Join(bottom, "home/u/notes"), opaqueXattr, nil); err == nil {
		t.Error("a layer's own trusted.overlay xattr was kept")
	}
	if st := lstat(t, filepath.Join(bottom, "tmp")); st.Mode&0o7777 != 0o1777 {
		t.Errorf("tmp mode %o, want 1777", st.Mode&0o7777)
	}
	if st := lstat(t, filepath.Join(bottom, "dev/null")); st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != unix.Mkdev(1, 3) {
		t.Errorf("dev/null mode %o rdev %d", st.Mode, st.Rdev)
	}
	if st := lstat(t, filepath.Join(bottom, "dev/loop9")); st.Mode&unix.S_IFMT != unix.S_IFBLK || st.Rdev != unix.Mkdev(7, 9) {
		t.Errorf("dev/loop9 mode %o rdev %d", st.Mode, st.Rdev)
	}
	if st := lstat(t, filepath.Join(bottom, "dev/pipe")); st.Mode&unix.S_IFMT != unix.S_IFIFO {
		t.Errorf("dev/pipe mode %o", st.Mode)
	}
	if st := lstat(t, filepath.Join(top, "etc/removed")); st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout etc/removed mode %o rdev %d, want a 0/0 character device", st.Mode, st.Rdev)
	}
	if v := xattr(t, filepath.Join(top, "cache"), opaqueXattr); v != "y" {
		t.Errorf("cache's opaque xattr %q", v)
	}
	if _, err := os.Lstat(filepath.Join(top, "cache/.wh..wh..opq")); err == nil {
		t.Error("the opaque marker was written as a file")
	}

	// Lookup finds it by digest; a second Get unpacks nothing.
	again, err := c.Lookup(got.Digest)
	if err != nil || !slices.Equal(again.Layers, got.Layers) || again.Ref != dir {
		t.Fatalf("Lookup = %+v, %v", again, err)
	}
	if _, err := c.Get(context.Background(), dir); err != nil || c.unpacked.Load() != 2 {
		t.Fatalf("second Get: %v, %d layers unpacked in all", err, c.unpacked.Load())
	}
	if _, err := c.Lookup(noDigest); !errors.Is(err, ErrNotCached) {
		t.Fatalf("Lookup of an unknown digest: %v, want ErrNotCached", err)
	}
}

func TestGetLayoutPicksAnImage(t *testing.T) {
	c := openCache(t, Options{})
	a := imageOf(t, v1.Config{WorkingDir: "/a"}, layerOf(t, fileE("a", "a")))
	b := imageOf(t, v1.Config{WorkingDir: "/b"}, layerOf(t, fileE("b", "b")))
	dir := writeLayout(t, []v1.Image{a, b}, "first", "second")
	ctx := context.Background()
	if _, err := c.Get(ctx, dir); !errors.Is(err, ErrBadImage) {
		t.Fatalf("Get of a two-image layout without a pick: %v, want ErrBadImage", err)
	}
	if got, err := c.Get(ctx, dir+":second"); err != nil || got.WorkingDir != "/b" {
		t.Fatalf("Get :second = %+v, %v", got, err)
	}
	if got, err := c.Get(ctx, dir+"@"+digestOf(t, a)); err != nil || got.WorkingDir != "/a" {
		t.Fatalf("Get @digest = %+v, %v", got, err)
	}
	if _, err := c.Get(ctx, dir+":third"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get :third: %v, want ErrNotFound", err)
	}
	if _, err := c.Get(ctx, "/no/such/layout"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of a missing path: %v, want ErrNotFound", err)
	}
}

func TestHoldAndRelease(t *testing.T) {
	c := openCache(t, Options{})
	img := imageOf(t, v1.Config{}, layerOf(t, fileE("a", "a")))
	got, err := c.Get(context.Background(), writeLayout(t, []v1.Image{img}))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Hold("overlay-abc-snapshot-1", got.Digest); err != nil {
		t.Fatal(err)
	}
	if held, _ := c.held(); !held[got.Digest] {
		t.Fatal("the hold is not seen")
	}
	for _, bad := range []string{"", "../x", "a/b", ".hidden"} {
		if err := c.Hold(bad, got.Digest); err == nil {
			t.Errorf("Hold(%q) was accepted", bad)
		}
	}
	if err := c.Hold("x", noDigest); !errors.Is(err, ErrNotCached) {
		t.Errorf("Hold of an uncached digest: %v, want ErrNotCached", err)
	}
	if err := c.Release("overlay-abc-snapshot-1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Release("overlay-abc-snapshot-1"); err != nil {
		t.Fatalf("a second Release: %v", err)
	}
	if held, _ := c.held(); len(held) != 0 {
		t.Fatalf("held after Release: %v", held)
	}
}
