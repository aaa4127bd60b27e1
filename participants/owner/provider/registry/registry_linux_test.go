//go:build linux

package registry

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm"
	"github.com/stillpoint/stillpoint/participants/owner/provider/overlay"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

func TestMain(m *testing.M) { leak.VerifyTestMain(m) }

func TestDefaultPicksOverlayAsRoot(t *testing.T) {
	providertest.RequireRoot(t)
	state := t.TempDir()
	p, reason, err := Default(state, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { providertest.Cleanup(t, p) })
	ov, ok := p.(*overlay.Provider)
	if !ok || p.Name() != "overlay" || !strings.HasPrefix(reason, "overlay:") {
		t.Fatalf("Default = %s (%s)", p.Name(), reason)
	}
	ents, _ := os.ReadDir(state)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".probe") {
			t.Errorf("probe left %s", e.Name())
		}
	}
	ents, _ = os.ReadDir(ov.Config().CgroupParent)
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".probe") {
			t.Errorf("probe left cgroup %s", e.Name())
		}
	}
	providertest.CheckNoMounts(t, state)
}

// Open opens the provider a name names, and refuses any other name.
func TestOpen(t *testing.T) {
	d, _, err := Open("dir", t.TempDir(), microvm.Config{}, nil)
	if err != nil || d.Name() != "dir" {
		t.Fatalf("Open(dir) = %v, %v", d, err)
	}
	if _, _, err := Open("docker", t.TempDir(), microvm.Config{}, nil); !errors.Is(err, provider.ErrInvalid) {
		t.Fatalf("Open(docker): %v, want ErrInvalid", err)
	}
}

// noImages is an image cache that holds nothing.
type noImages struct{}

func (noImages) Lookup(d string) (*provider.Image, error) {
	return nil, fmt.Errorf("%s: not cached", d)
}
func (noImages) Hold(string, string) error        { return nil }
func (noImages) Release(string) error             { return nil }
func (noImages) Holders(string) ([]string, error) { return nil, nil }

// The overlay provider Open and Default make gets the image cache.
func TestOpenPassesImages(t *testing.T) {
	providertest.RequireRoot(t)
	for _, name := range []string{"overlay", "auto"} {
		state := t.TempDir()
		p, _, err := Open(name, state, microvm.Config{}, noImages{})
		if err != nil {
			t.Fatalf("Open(%s): %v", name, err)
		}
		ov, ok := p.(*overlay.Provider)
		if !ok {
			t.Fatalf("Open(%s) = %s, want overlay", name, p.Name())
		}
		if ov.Config().Images != (noImages{}) {
			t.Errorf("Open(%s): Images = %v, want the cache given", name, ov.Config().Images)
		}
	}
}
