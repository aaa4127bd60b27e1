//go:build linux

package nosnapshot_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/dir"
	"github.com/stillpoint/stillpoint/participants/owner/provider/nosnapshot"
	"github.com/stillpoint/stillpoint/participants/owner/provider/overlay"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

func TestMain(m *testing.M) { leak.VerifyTestMain(m) }

// newNoSnapshot wraps a dir provider of its own, with the cleanup that
// checks nothing is left.
func newNoSnapshot(t *testing.T) *nosnapshot.Provider {
	t.Helper()
	d, err := dir.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p := nosnapshot.New(d)
	t.Cleanup(func() { providertest.Cleanup(t, p) })
	return p
}

// The nosnapshot variant runs sandboxes but refuses snapshots with
// ErrNoSnapshot, and says so in Caps.
func TestNoSnapshot(t *testing.T) {
	p := newNoSnapshot(t)
	if p.Caps().Snapshot || p.Caps().KeepsProcesses || p.Name() != "nosnapshot" {
		t.Fatalf("caps %+v name %s", p.Caps(), p.Name())
	}
	sb := providertest.Start(t, p, provider.Spec{ID: "ns"})
	if got := providertest.Sh(t, p, "ns", "echo hi"); got != "hi\n" {
		t.Errorf("exec: %q", got)
	}
	if _, err := p.Snapshot(context.Background(), "ns", "s"); !errors.Is(err, provider.ErrNoSnapshot) {
		t.Errorf("Snapshot: %v", err)
	}
	if _, err := p.Fork(context.Background(), "s", provider.Spec{ID: "f"}); !errors.Is(err, provider.ErrNoSnapshot) {
		t.Errorf("Fork: %v", err)
	}
	if err := p.DeleteSnapshot(context.Background(), "s"); err != nil {
		t.Errorf("DeleteSnapshot: %v", err)
	}
	if got := p.Sandboxes(); !slices.Equal(got, []string{"ns"}) {
		t.Errorf("Sandboxes() = %v", got)
	}
	providertest.Stop(t, p, sb)
}

// A sandbox on an image goes through to the wrapped provider: overlay
// starts it on the image's layers.
func TestNoSnapshotImage(t *testing.T) {
	providertest.RequireRoot(t)
	ov, err := overlay.New(overlay.Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	p := nosnapshot.New(ov)
	t.Cleanup(func() { providertest.Cleanup(t, p) })
	img := providertest.TwoLayerImage(t)
	sb := providertest.Start(t, p, provider.Spec{ID: "ns", Image: img, Env: img.Env, Workdir: img.WorkingDir})
	if got := providertest.Sh(t, p, "ns", "cat top.txt /keep.txt"); got != "top\ntop\n" {
		t.Errorf("in the image: %q", got)
	}
	providertest.Stop(t, p, sb)
}

// It has the shape of every provider.
var _ provider.Provider = (*nosnapshot.Provider)(nil)
