package qemu

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// busybox's cpio, which reads the kernel's newc format, extracts what the
// writer wrote: files with their modes and data, directories, links.
func TestCPIOExtractsWithBusybox(t *testing.T) {
	bb, err := exec.LookPath("busybox")
	if err != nil {
		t.Fatalf("busybox not found: apt-get install busybox-static")
	}
	var buf bytes.Buffer
	c := NewCPIO(&buf)
	for _, err := range []error{
		c.Dir("etc", 0o755),
		c.File("etc/stillpoint/modules", 0o644, []byte("virtio_mmio\next4\n")),
		c.File("init", 0o755, []byte("#!/bin/sh\n")),
		c.File("odd", 0o600, []byte("12345")), // a size that needs padding
		c.Symlink("bin/sh", "/bin/busybox"),
		c.Close(),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	if buf.Len()%4 != 0 {
		t.Fatalf("archive of %d bytes is not padded to 4", buf.Len())
	}
	dir := t.TempDir()
	cmd := exec.Command(bb, "cpio", "-i", "-d")
	cmd.Dir, cmd.Stdin = dir, &buf
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("busybox cpio -i: %v: %s", err, out)
	}
	for name, want := range map[string]string{"etc/stillpoint/modules": "virtio_mmio\next4\n", "init": "#!/bin/sh\n", "odd": "12345"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || string(b) != want {
			t.Errorf("%s: %q, %v; want %q", name, b, err, want)
		}
	}
	if fi, err := os.Stat(filepath.Join(dir, "init")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("init mode: %v %v", fi, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "odd")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("odd mode: %v %v", fi, err)
	}
	if target, err := os.Readlink(filepath.Join(dir, "bin/sh")); err != nil || target != "/bin/busybox" {
		t.Errorf("bin/sh: %q %v", target, err)
	}
}
