package owner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/overlay"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

// mapResolver stands in for the image cache: images by reference, and
// the references asked for.
type mapResolver struct {
	mu     sync.Mutex
	images map[string]*provider.Image
	asked  []string
}

func (m *mapResolver) Get(_ context.Context, ref string) (*provider.Image, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.asked = append(m.asked, ref)
	img, ok := m.images[ref]
	if !ok {
		return nil, fmt.Errorf("image %s: no such image", ref)
	}
	return img, nil
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
	res := &mapResolver{images: map[string]*provider.Image{img.Ref: img}}
	env := jstest.Start(t)
	cfg := baseConfig(t, env, ov, "o1")
	cfg.TaskKind, cfg.Images = imageTaskKind(), res
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

	info, err := c.SeedSession(ctx, ownerapi.SeedRequest{SessionID: "s1", Episode: "r1",
		Task: json.RawMessage(`{"image":"` + img.Ref + `","env":["BOTH=task"]}`)})
	if err != nil {
		t.Fatalf("seed with a good image: %v", err)
	}
	got := sh(t, ov, info.SandboxID, `pwd; cat top.txt /keep.txt; echo "$FROM_IMAGE $BOTH"; cat `+LaunchUserFile)
	if want := "/app\ntop\ntop\nimage task\n1000:1000\n"; got != want {
		t.Errorf("in the image's sandbox:\n%s\nwant:\n%s", got, want)
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
