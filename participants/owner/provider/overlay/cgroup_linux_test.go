//go:build linux

package overlay

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

// An owner that chooses the overlay provider (registry.Default, after a
// Probe) and never starts a sandbox leaves no cgroup behind, nor does one
// whose last sandbox is stopped.
func TestDefaultParentGoesWhenEmpty(t *testing.T) {
	providertest.RequireRoot(t)
	p := probed(t)
	t.Cleanup(func() { providertest.Cleanup(t, p) })
	parent := p.cfg.CgroupParent
	if _, err := os.Stat(parent); !os.IsNotExist(err) {
		t.Errorf("the probe left the cgroup parent %s (%v)", parent, err)
	}
	sb := providertest.Start(t, p, provider.Spec{ID: "a"})
	if filepath.Dir(sb.Cgroup) != parent {
		t.Fatalf("sandbox cgroup %s is not in %s", sb.Cgroup, parent)
	}
	if v, err := xattr(parent); err != nil || !markAlive(v) {
		t.Errorf("the parent in use is marked %q, %v", v, err)
	}
	providertest.Stop(t, p, sb)
	if _, err := os.Stat(parent); !os.IsNotExist(err) {
		t.Errorf("the last Stop left the cgroup parent %s (%v)", parent, err)
	}
}

// A provider dropping its default parent also removes the parents beside
// it that an owner that is gone left empty; it leaves one that still holds
// a cgroup (a sandbox for its state directory's next owner to stop), one
// of a live owner, and one without a mark.
func TestLeftoverParentsOfGoneOwnersReaped(t *testing.T) {
	providertest.RequireRoot(t)
	p := probed(t)
	t.Cleanup(func() { providertest.Cleanup(t, p) })
	self, err := selfMark()
	if err != nil {
		t.Fatal(err)
	}
	var pid, since int
	if _, err := fmt.Sscanf(self, "%d:%d", &pid, &since); err != nil {
		t.Fatal(err)
	}
	gone := fmt.Sprintf("%d:%d", pid, since+1) // that pid, another process
	dir := filepath.Dir(p.cfg.CgroupParent)
	mk := func(name, mark string) string {
		t.Helper()
		path := filepath.Join(dir, fmt.Sprintf("test-%s-%d-%d", name, os.Getpid(), rand.Uint32()))
		if err := os.Mkdir(path, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = os.Remove(filepath.Join(path, "sandbox"))
			_ = os.Remove(path)
		})
		if mark != "" {
			if err := unix.Setxattr(path, ownerXattr, []byte(mark), 0); err != nil {
				t.Fatalf("cgroupfs keeps no user xattrs here (Linux 5.7 or later has them): %v", err)
			}
		}
		return path
	}
	leftover := mk("gone", gone)
	busy := mk("busy", gone)
	if err := os.Mkdir(filepath.Join(busy, "sandbox"), 0o755); err != nil {
		t.Fatal(err)
	}
	alive := mk("alive", self)
	unmarked := mk("unmarked", "")

	sb := providertest.Start(t, p, provider.Spec{ID: "a"})
	providertest.Stop(t, p, sb) // drops the parent
	if _, err := os.Stat(leftover); !os.IsNotExist(err) {
		t.Errorf("%s, empty and its owner gone, is still there (%v)", leftover, err)
	}
	for _, path := range []string{busy, alive, unmarked} {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("%s was removed: %v", path, err)
		}
	}
}

func xattr(path string) (string, error) {
	buf := make([]byte, 64)
	n, err := unix.Getxattr(path, ownerXattr, buf)
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// probed returns a provider with the default cgroup parent, after the
// Probe registry.Default runs.
func probed(t *testing.T) *Provider {
	t.Helper()
	providertest.RequireRoot(t)
	p, err := New(Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Probe(); err != nil {
		t.Fatalf("Probe: %v", err)
	}
	return p
}
