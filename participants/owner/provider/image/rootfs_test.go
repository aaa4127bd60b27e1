//go:build linux

package image

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"
)

// checkMerged checks the merged tree of richImage at root.
func checkMerged(t *testing.T, root string) {
	t.Helper()
	for _, gone := range []string{"etc/removed", "cache/lower"} {
		if _, err := os.Lstat(filepath.Join(root, gone)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %v, want it gone (whiteout / opaque dir)", gone, err)
		}
	}
	for p, want := range map[string]string{"cache/upper": "shown", "etc/hostname": "top\n", "old/gone": "lower", "home/u/notes": "mine"} {
		if b, err := os.ReadFile(filepath.Join(root, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", p, b, err, want)
		}
	}
	if a, b := lstat(t, filepath.Join(root, "bin/su")), lstat(t, filepath.Join(root, "bin/su-again")); a.Ino != b.Ino || a.Mode&0o7777 != 0o4755 {
		t.Errorf("bin/su: inode %d vs %d, mode %o: want one inode, 4755", a.Ino, b.Ino, a.Mode&0o7777)
	}
	if st := lstat(t, filepath.Join(root, "home/u/notes")); st.Uid != 1000 || st.Gid != 1001 {
		t.Errorf("home/u/notes owner %d:%d, want 1000:1001", st.Uid, st.Gid)
	}
	if v := xattr(t, filepath.Join(root, "home/u/notes"), "user.origin"); v != "test" {
		t.Errorf("user.origin = %q", v)
	}
	if st := lstat(t, filepath.Join(root, "dev/null")); st.Rdev != unix.Mkdev(1, 3) {
		t.Errorf("dev/null rdev %d", st.Rdev)
	}
	if st := lstat(t, filepath.Join(root, "tmp")); st.Mode&0o7777 != 0o1777 {
		t.Errorf("tmp mode %o", st.Mode&0o7777)
	}
	if _, err := unix.Lgetxattr(filepath.Join(root, "cache"), opaqueXattr, nil); err == nil {
		t.Error("the merged tree shows trusted.overlay.opaque")
	}
}

// TestLayersStackAsOverlayLowerdirs mounts the unpacked layers the way the
// overlay provider does (lowerdir=top:bottom) and reads the merged tree.
func TestLayersStackAsOverlayLowerdirs(t *testing.T) {
	c := openCache(t, Options{})
	img, err := c.Get(context.Background(), writeLayout(t, []v1.Image{richImage(t)}))
	if err != nil {
		t.Fatal(err)
	}
	mnt := t.TempDir()
	lower := img.Layers[1] + ":" + img.Layers[0]
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+lower); err != nil {
		t.Fatalf("mount overlay lowerdir=%s: %v", lower, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			t.Errorf("unmount: %v", err)
		}
	})
	checkMerged(t, mnt)
}

func TestRootfsWritesTheMergedTree(t *testing.T) {
	c := openCache(t, Options{})
	img, err := c.Get(context.Background(), writeLayout(t, []v1.Image{richImage(t)}))
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
	checkMerged(t, dst)
	if st := lstat(t, dst); st.Mode&0o777 != 0o755 {
		t.Errorf("root mode %o, want the image's 755", st.Mode&0o777)
	}
	if err := c.Rootfs(context.Background(), img, dst); err == nil || !strings.Contains(err.Error(), "not an empty directory") {
		t.Fatalf("Rootfs into a full dir: %v", err)
	}
	if ents, _ := os.ReadDir(filepath.Join(c.dir, tmpDir)); len(ents) != 0 {
		t.Fatalf("Rootfs left %v in tmp", ents)
	}
}
