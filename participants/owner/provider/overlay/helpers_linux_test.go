//go:build linux

package overlay

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/image"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

func TestMain(m *testing.M) { leak.VerifyTestMain(m) }

// newOverlay returns an overlay provider with its own state dir and its
// own cgroup parent, and registers a cleanup that stops what is left,
// deletes every snapshot and then checks that nothing is left anywhere.
func newOverlay(t testing.TB) *Provider {
	t.Helper()
	return newOverlayOn(t, "")
}

// newOverlayOn is newOverlay over the base dir base ("": the host's root).
func newOverlayOn(t testing.TB, base string) *Provider {
	t.Helper()
	providertest.RequireRoot(t)
	cgMount, err := cgroup.Mount()
	if err != nil {
		t.Fatal(err)
	}
	parent := filepath.Join(cgMount, DefaultCgroupParentName, fmt.Sprintf("test-%d-%d", os.Getpid(), rand.Uint32()))
	ov, err := New(Config{StateDir: t.TempDir(), BaseDir: base, CgroupParent: parent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		providertest.Cleanup(t, ov)
		providertest.CheckNoMounts(t, ov.cfg.StateDir)
		if err := os.Remove(parent); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("cgroup parent %s not empty after the test: %v", parent, err)
		}
	})
	return ov
}

// cgroupPids lists the pids in a cgroup and its children.
func cgroupPids(t testing.TB, cg string) []int {
	t.Helper()
	pids, err := cgroup.Dir(cg).AllProcs()
	if err != nil {
		t.Fatal(err)
	}
	return pids
}

// The overlay provider keeps the contract.
func TestContract(t *testing.T) {
	providertest.Run(t, func(t *testing.T) provider.Provider { return newOverlay(t) })
}

// Several sandboxes at once: start, exec, snapshot, fork and stop in
// parallel, then nothing is left.
func TestOverlayConcurrent(t *testing.T) {
	providertest.Concurrent(t, newOverlay(t))
}

func newBench(b testing.TB) provider.Provider { return newOverlay(b) }

func BenchmarkSnapshot(b *testing.B) { providertest.BenchSnapshot(b, newBench) }

func BenchmarkFork(b *testing.B) { providertest.BenchFork(b, newBench) }

func BenchmarkStart(b *testing.B) { providertest.BenchStart(b, newBench) }

func BenchmarkStartImage(b *testing.B) {
	providertest.BenchStartImage(b, func(tb testing.TB) (provider.Provider, providertest.ImageCache) {
		c, err := image.Open(filepath.Join(tb.TempDir(), "images"), image.Options{})
		if err != nil {
			tb.Fatal(err)
		}
		ov := newOverlay(tb)
		ov.cfg.Images = c
		return ov, c
	})
}

func BenchmarkCopyBaseline(b *testing.B) { providertest.BenchCopyBaseline(b) }

// It has the shape of every provider.
var _ provider.Provider = (*Provider)(nil)
