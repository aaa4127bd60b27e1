//go:build linux

package providertest

import (
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// BusyboxLayer makes dir a layer with a static busybox as /bin/busybox and
// the applets the tests run linked to it.
func BusyboxLayer(t testing.TB, dir string) {
	t.Helper()
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatalf("the image tests need a static busybox: apt-get install busybox-static (%v)", err)
	}
	f, err := elf.Open(bb)
	if err != nil {
		t.Fatalf("busybox %s: %v", bb, err)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Fatalf("busybox %s is dynamically linked; the image tests need a static one: apt-get install busybox-static", bb)
		}
	}
	f.Close()
	data, err := os.ReadFile(bb)
	if err != nil {
		t.Fatal(err)
	}
	WriteFile(t, filepath.Join(dir, "bin/busybox"), string(data), 0o755)
	for _, a := range []string{"sh", "cat", "ls", "echo", "test", "id", "mkdir", "rm", "env"} {
		if err := os.Symlink("busybox", filepath.Join(dir, "bin", a)); err != nil {
			t.Fatal(err)
		}
	}
}

// WriteFile writes data at p with mode, parents made, or fails the test.
func WriteFile(t testing.TB, p, data string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
}

// TwoLayerImage builds an image of two layers by hand under a test
// directory, as the image cache unpacks them (bottom first, whiteouts in
// overlayfs form): the bottom one holds a static busybox (BusyboxLayer),
// /etc/passwd, /app/README, /gone.txt, /d/old.txt and /keep.txt; the top
// one removes /gone.txt (a whiteout), makes /d opaque (with only
// /d/new.txt), overrides /keep.txt and adds /app/top.txt. Its Env sets
// PATH=/bin, FROM_IMAGE=image and BOTH=image; its WorkingDir is /app.
func TwoLayerImage(t testing.TB) *provider.Image {
	t.Helper()
	root := t.TempDir()
	bottom, top := filepath.Join(root, "l0"), filepath.Join(root, "l1")
	BusyboxLayer(t, bottom)
	WriteFile(t, filepath.Join(bottom, "etc/passwd"), "root:x:0:0::/root:/bin/sh\n", 0o644)
	WriteFile(t, filepath.Join(bottom, "app/README"), "bottom readme\n", 0o644)
	WriteFile(t, filepath.Join(bottom, "gone.txt"), "gone\n", 0o644)
	WriteFile(t, filepath.Join(bottom, "d/old.txt"), "old\n", 0o644)
	WriteFile(t, filepath.Join(bottom, "keep.txt"), "bottom\n", 0o644)

	WriteFile(t, filepath.Join(top, "keep.txt"), "top\n", 0o644)
	WriteFile(t, filepath.Join(top, "app/top.txt"), "top\n", 0o644)
	WriteFile(t, filepath.Join(top, "d/new.txt"), "new\n", 0o644)
	if err := unix.Setxattr(filepath.Join(top, "d"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(top, "gone.txt"), unix.S_IFCHR|0o000, 0); err != nil {
		t.Fatal(err)
	}
	return &provider.Image{
		Ref:        "/srv/images/two:latest",
		Digest:     "sha256:" + strings.Repeat("ab", 32),
		Layers:     []string{bottom, top},
		Env:        []string{"PATH=/bin", "FROM_IMAGE=image", "BOTH=image"},
		WorkingDir: "/app",
	}
}
