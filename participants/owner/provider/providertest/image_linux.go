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

// HostImage builds, once per call, an image of two layers copied from the
// host's own Debian-like tree: the bottom one holds /etc, /usr/sbin,
// /usr/lib64 and the shared libraries /usr/bin/sh, ls and cat load, with
// the root's bin, lib, lib64 and sbin links; the top one holds /usr/bin
// and removes /etc/motd (a whiteout); under -short only sh, ls and cat of
// it. It is a realistic root a sandbox can run a shell in, for the start
// benchmark.
func HostImage(tb testing.TB) *provider.Image {
	tb.Helper()
	root := tb.TempDir()
	bottom, top := filepath.Join(root, "l0"), filepath.Join(root, "l1")
	copyIn := func(layer string, paths ...string) {
		for _, p := range paths {
			dst := filepath.Join(layer, p)
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				tb.Fatal(err)
			}
			if out, err := exec.Command("cp", "-a", p, dst).CombinedOutput(); err != nil {
				tb.Fatalf("cp -a %s %s: %v\n%s", p, dst, err, out)
			}
		}
	}
	copyIn(bottom, "/etc", "/usr/sbin")
	if _, err := os.Stat("/usr/lib64"); err == nil {
		copyIn(bottom, "/usr/lib64")
	}
	out, err := exec.Command("ldd", "/usr/bin/sh", "/usr/bin/ls", "/usr/bin/cat").Output()
	if err != nil {
		tb.Fatalf("ldd (apt-get install libc-bin): %v", err)
	}
	seen := map[string]bool{}
	for _, f := range strings.Fields(string(out)) {
		if strings.HasPrefix(f, "/") && !strings.HasSuffix(f, ":") && !seen[f] {
			seen[f] = true
			// The library's link (in its directory, the root's links
			// resolved) and the file it names.
			dir, err := filepath.EvalSymlinks(filepath.Dir(f))
			if err != nil {
				tb.Fatal(err)
			}
			real, err := filepath.EvalSymlinks(f)
			if err != nil {
				tb.Fatal(err)
			}
			copyIn(bottom, real)
			if link := filepath.Join(dir, filepath.Base(f)); link != real {
				copyIn(bottom, link)
			}
		}
	}
	for _, l := range []string{"bin", "lib", "lib64", "sbin"} {
		if target, err := os.Readlink("/" + l); err == nil {
			if err := os.Symlink(target, filepath.Join(bottom, l)); err != nil {
				tb.Fatal(err)
			}
		}
	}
	if testing.Short() {
		// make test's one run of each benchmark (bench-once, -short):
		// the three programs the benchmark runs, not the host's whole
		// /usr/bin, whose copy (and unpack, through an image cache) took
		// most of a minute.
		sh, err := filepath.EvalSymlinks("/usr/bin/sh")
		if err != nil {
			tb.Fatal(err)
		}
		copyIn(top, "/usr/bin/sh", sh, "/usr/bin/ls", "/usr/bin/cat")
	} else {
		copyIn(top, "/usr/bin")
	}
	if err := os.MkdirAll(filepath.Join(top, "etc"), 0o755); err != nil {
		tb.Fatal(err)
	}
	if err := unix.Mknod(filepath.Join(top, "etc/motd"), unix.S_IFCHR, 0); err != nil {
		tb.Fatal(err)
	}
	return &provider.Image{Ref: "host-copy", Digest: "sha256:" + strings.Repeat("0", 64), Layers: []string{bottom, top},
		Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}}
}
