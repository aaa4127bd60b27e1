package owner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/image"
	"github.com/stillpoint/stillpoint/participants/owner/provider/overlay"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

// mapResolver stands in for the image cache: images by reference, the
// references asked for, and the holds (holder: digest). A reference in
// faults fails with that error.
type mapResolver struct {
	mu     sync.Mutex
	images map[string]*provider.Image
	faults map[string]error
	asked  []string
	holds  map[string]string
}

func (m *mapResolver) GetHeld(_ context.Context, ref, holder string) (*provider.Image, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.asked = append(m.asked, ref)
	if err := m.faults[ref]; err != nil {
		return nil, fmt.Errorf("image %s: %w", ref, err)
	}
	img, ok := m.images[ref]
	if !ok {
		return nil, fmt.Errorf("image %s: %w: no such image", ref, image.ErrNotFound)
	}
	if m.holds == nil {
		m.holds = map[string]string{}
	}
	m.holds[holder] = img.Digest
	return img, nil
}

func (m *mapResolver) Release(holder string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.holds, holder)
	return nil
}

func (m *mapResolver) Holders(prefix string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for h := range m.holds {
		if strings.HasPrefix(h, prefix) {
			out = append(out, h)
		}
	}
	sort.Strings(out)
	return out, nil
}

// imageTaskKind is a kind whose task names its image and, optionally,
// its workdir and environment.
func imageTaskKind() TaskFuncs {
	return TaskFuncs{SpecFn: func(_ string, _ events.Episode, task json.RawMessage) (provider.Spec, error) {
		var tk struct {
			Image, Workdir string
			Env            []string
		}
		if err := json.Unmarshal(task, &tk); err != nil {
			return provider.Spec{}, err
		}
		return provider.Spec{ImageRef: tk.Image, Workdir: tk.Workdir, Env: tk.Env}, nil
	}}
}

// A seed whose image does not resolve is refused (400) naming the
// reference, and no sandbox is made; one whose image resolves gets a
// sandbox on the image with its config applied: the image's Env under
// the task's own entries, its WorkingDir, its User for sandboxd.
func TestSeedResolvesTheImage(t *testing.T) {
	providertest.RequireRoot(t)
	ov, err := overlay.New(overlay.Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatalf("overlay provider (run as root on Linux with overlayfs and cgroup v2): %v", err)
	}
	t.Cleanup(func() { checkEmpty(t, ov) })
	img := providertest.TwoLayerImage(t)
	img.User = "1000:1000"
	flaky := "registry.example:5000/flaky:1"
	res := &mapResolver{images: map[string]*provider.Image{img.Ref: img},
		faults: map[string]error{flaky: fmt.Errorf("layer sha256:00: write: %w", syscall.ENOSPC)}}
	env := jstest.Start(t)
	cfg := baseConfig(t, env, ov, "o1")
	cfg.TaskKind, cfg.Images = imageTaskKind(), res
	// While the sandbox starts and its setup runs, the owner holds the
	// image under its seed holder: no prune can take it before the
	// provider holds it.
	var heldInSetup []string
	kind := cfg.TaskKind.(TaskFuncs)
	kind.SetupFn = func(context.Context, Execer, *Session, json.RawMessage) (json.RawMessage, error) {
		heldInSetup, _ = res.Holders(seedHolderPrefix(cfg))
		return nil, nil
	}
	cfg.TaskKind = kind
	c := serve(t, env, newOwner(t, cfg))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	var se *jetstream.ServiceError
	bad := "/srv/images/missing:latest"
	_, err = c.SeedSession(ctx, ownerapi.SeedRequest{SessionID: "s0", Episode: "r0", Task: json.RawMessage(`{"image":"` + bad + `"}`)})
	if !errors.As(err, &se) || se.Status != 400 || !strings.Contains(se.Error(), bad) || !strings.Contains(se.Error(), "no such image") {
		t.Fatalf("seed with a bad image: %v, want a 400 naming %s and the cause", err, bad)
	}
	if sbs := ov.Sandboxes(); len(sbs) != 0 {
		t.Fatalf("a refused image made sandboxes %v", sbs)
	}
	// A host's fault (a full disk, a registry's 5xx) is no bad task: the
	// owner answers 500, and the rollout is not failed for it.
	_, err = c.SeedSession(ctx, ownerapi.SeedRequest{SessionID: "s0", Episode: "r0", Task: json.RawMessage(`{"image":"` + flaky + `"}`)})
	if !errors.As(err, &se) || se.Status != 500 || !strings.Contains(se.Error(), flaky) || !strings.Contains(se.Error(), "no space left") {
		t.Fatalf("seed on a full disk: %v, want a 500 naming %s and the cause", err, flaky)
	}
	if sbs := ov.Sandboxes(); len(sbs) != 0 {
		t.Fatalf("a failed image made sandboxes %v", sbs)
	}

	info, err := c.SeedSession(ctx, ownerapi.SeedRequest{SessionID: "s1", Episode: "r1",
		Task: json.RawMessage(`{"image":"` + img.Ref + `","env":["BOTH=task"]}`)})
	if err != nil {
		t.Fatalf("seed with a good image: %v", err)
	}
	got := sh(t, ov, info.SandboxID, `pwd; cat top.txt /keep.txt; echo "$FROM_IMAGE $BOTH"; cat `+LaunchUserFile)
	if want := "/app\ntop\ntop\nimage task\n1000:1000\n"; got != want {
		t.Errorf("in the image's sandbox:\n%s\nwant:\n%s", got, want)
	}
	if len(heldInSetup) != 1 || !strings.HasPrefix(heldInSetup[0], seedHolderPrefix(cfg)+"s1-") {
		t.Errorf("seed holds while the sandbox started: %v, want one of session s1", heldInSetup)
	}
	if hs, _ := res.Holders(""); len(hs) != 0 {
		t.Errorf("holds left after the seeds: %v", hs)
	}
	if err := c.CloseSession(ctx, "s1"); err != nil {
		t.Fatal(err)
	}

	// An owner without an image cache refuses every image.
	o2cfg := baseConfig(t, env, ov, "o2")
	o2cfg.TaskKind = imageTaskKind()
	o2 := newOwner(t, o2cfg)
	_, err = o2.SeedSession(ctx, "s2", events.Episode{Rollout: "r2"}, json.RawMessage(`{"image":"`+img.Ref+`"}`))
	if !errors.Is(err, ErrBadTask) || !strings.Contains(err.Error(), img.Ref) {
		t.Errorf("seed without an image cache: %v, want ErrBadTask naming %s", err, img.Ref)
	}
	if sbs := ov.Sandboxes(); len(sbs) != 0 {
		t.Fatalf("sandboxes left: %v", sbs)
	}
}

// The image's config goes under the spec's: its Env entries the spec
// does not set, its WorkingDir when the kind left none; root needs no
// user file.
func TestApplyImage(t *testing.T) {
	img := &provider.Image{Env: []string{"PATH=/opt/bin", "A=image", "B=image"}, WorkingDir: "/testbed", User: "root"}
	spec := provider.Spec{Env: []string{"B=spec"}, Files: map[string][]byte{"x": nil}}
	applyImage(&spec, img)
	if strings.Join(spec.Env, " ") != "PATH=/opt/bin A=image B=spec" || spec.Workdir != "/testbed" || spec.Image != img || len(spec.Files) != 1 {
		t.Errorf("applied: %+v", spec)
	}
	spec = provider.Spec{Workdir: "/work"}
	img.User = "app"
	applyImage(&spec, img)
	if spec.Workdir != "/work" || string(spec.Files[LaunchUserFile[1:]]) != "app\n" {
		t.Errorf("applied: %+v", spec)
	}
}

// A new owner releases the seed holds an earlier process of it left (it
// crashed between resolving an image and starting its sandbox), and no
// one else's.
func TestNewReleasesLeftSeedHolds(t *testing.T) {
	env := jstest.Start(t)
	cfg := baseConfig(t, env, newDir(t), "o1")
	other := cfg
	other.StateDir = t.TempDir()
	d := "sha256:" + strings.Repeat("a", 64)
	res := &mapResolver{holds: map[string]string{
		seedHolderPrefix(cfg) + "s1-1":   d,
		seedHolderPrefix(cfg) + "s2-7":   d,
		seedHolderPrefix(other) + "s1-1": d,
		"overlay-12345678-sandbox-s1":    d,
	}}
	cfg.Images = res
	newOwner(t, cfg)
	hs, _ := res.Holders("")
	if want := []string{"overlay-12345678-sandbox-s1", seedHolderPrefix(other) + "s1-1"}; !slices.Equal(hs, want) {
		t.Errorf("holds after New: %v, want %v", hs, want)
	}
}
