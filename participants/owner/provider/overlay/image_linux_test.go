//go:build linux

package overlay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/snapstore"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

// mapImages is an image cache over a map, standing in for *image.Cache:
// images by digest, and the holds.
type mapImages struct {
	mu     sync.Mutex
	images map[string]*provider.Image
	holds  map[string]string // holder -> digest
}

func newMapImages(imgs ...*provider.Image) *mapImages {
	m := &mapImages{images: map[string]*provider.Image{}, holds: map[string]string{}}
	for _, img := range imgs {
		m.images[img.Digest] = img
	}
	return m
}

func (m *mapImages) Lookup(digest string) (*provider.Image, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	img, ok := m.images[digest]
	if !ok {
		return nil, fmt.Errorf("image %s is not cached", digest)
	}
	return img, nil
}

func (m *mapImages) Hold(holder, digest string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.images[digest]; !ok {
		return fmt.Errorf("hold %s: image %s is not cached", holder, digest)
	}
	m.holds[holder] = digest
	return nil
}

func (m *mapImages) Release(holder string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.holds, holder)
	return nil
}

func (m *mapImages) Holders(prefix string) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for h := range m.holds {
		if strings.HasPrefix(h, prefix) {
			out = append(out, h)
		}
	}
	slices.Sort(out)
	return out, nil
}

// holders returns the holders, sorted, with the state hash cut out.
func (m *mapImages) holders(ov *Provider) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for h := range maps.Keys(m.holds) {
		out = append(out, strings.Replace(h, "-"+stateHash(ov.cfg.StateDir)+"-", "-", 1))
	}
	slices.Sort(out)
	return out
}

// treeOf lists a directory's entries with their contents, to tell a layer
// unchanged.
func treeOf(t testing.TB, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		v := fi.Mode().String()
		if fi.Mode().IsRegular() && fi.Size() < 1<<16 {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + string(b)
		}
		out[rel] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func newOverlayImages(t testing.TB, imgs *mapImages) *Provider {
	t.Helper()
	ov := newOverlay(t)
	ov.cfg.Images = imgs
	return ov
}

// A sandbox from a two-layer image sees the merged tree (whiteout and
// opaque directory applied, the host's root nowhere), writes go to its
// upper layer and the layers stay as they were; its snapshot records the
// image's digest and holds the image, a fork finds the image in the cache
// and gets its environment, and every hold goes with what held it.
func TestOverlayImageSnapshotFork(t *testing.T) {
	img := providertest.TwoLayerImage(t)
	before := []map[string]string{treeOf(t, img.Layers[0]), treeOf(t, img.Layers[1])}
	imgs := newMapImages(img)
	ov := newOverlayImages(t, imgs)

	a := providertest.Start(t, ov, provider.Spec{ID: "a", Image: img, Workdir: "/app", Env: img.Env,
		Files: map[string][]byte{"app/seed.txt": []byte("seed\n")}})
	got := providertest.Sh(t, ov, "a", `pwd; cat README top.txt seed.txt /keep.txt; ls /d; test ! -e /gone.txt && echo no-gone;
		test ! -e /usr && echo no-host; echo "$FROM_IMAGE"; echo w > w.txt; echo changed > /keep.txt`)
	want := "/app\nbottom readme\ntop\nseed\ntop\nnew.txt\nno-gone\nno-host\nimage\n"
	if got != want {
		t.Fatalf("inside the image:\n%s\nwant:\n%s", got, want)
	}
	upper := filepath.Join(filepath.Dir(a.Root), "upper")
	if got := providertest.ReadFile(t, filepath.Join(upper, "app/w.txt")); got != "w\n" {
		t.Errorf("w.txt in upper = %q", got)
	}
	if got := providertest.ReadFile(t, filepath.Join(upper, "keep.txt")); got != "changed\n" {
		t.Errorf("keep.txt in upper = %q", got)
	}
	if got, want := imgs.holders(ov), []string{"overlay-sandbox-a"}; !slices.Equal(got, want) {
		t.Errorf("holds after Start = %v, want %v", got, want)
	}

	providertest.Snapshot(t, ov, "a", "s1")
	var meta snapstore.Meta
	if err := readJSON(filepath.Join(ov.cfg.StateDir, "snapshots/s1/meta.json"), &meta); err != nil {
		t.Fatal(err)
	}
	if meta.Image != img.Digest || meta.Base != "" {
		t.Errorf("snapshot meta image %q base %q, want image %s and no base", meta.Image, meta.Base, img.Digest)
	}
	if got, want := imgs.holders(ov), []string{"overlay-sandbox-a", "overlay-snap-s1"}; !slices.Equal(got, want) {
		t.Errorf("holds after Snapshot = %v, want %v", got, want)
	}

	// The fork's spec names no image (a restore's does not): the snapshot
	// does, and the image's Env goes before the spec's.
	b := providertest.Fork(t, ov, "s1", provider.Spec{ID: "b", Workdir: "/app", Env: []string{"BOTH=spec"}})
	if got, want := providertest.Sh(t, ov, "b", `cat w.txt README /keep.txt; ls /d; echo "$FROM_IMAGE $BOTH"`),
		"w\nbottom readme\nchanged\nnew.txt\nimage spec\n"; got != want {
		t.Errorf("fork sees %q, want %q", got, want)
	}
	if got, want := imgs.holders(ov), []string{"overlay-sandbox-a", "overlay-sandbox-b", "overlay-snap-s1"}; !slices.Equal(got, want) {
		t.Errorf("holds after Fork = %v, want %v", got, want)
	}
	// A fork's spec that names another image is refused.
	other := *img
	other.Digest = "sha256:" + strings.Repeat("cd", 32)
	if _, err := ov.Fork(context.Background(), "s1", provider.Spec{ID: "x", Image: &other}); !errors.Is(err, provider.ErrInvalid) {
		t.Errorf("fork onto another image: %v, want ErrInvalid", err)
	}

	providertest.Stop(t, ov, a)
	providertest.Stop(t, ov, b)
	if err := ov.DeleteSnapshot(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	if got := imgs.holders(ov); len(got) != 0 {
		t.Errorf("holds left after Stop and DeleteSnapshot: %v", got)
	}
	for i, l := range img.Layers {
		if got := treeOf(t, l); !maps.Equal(got, before[i]) {
			t.Errorf("layer %d changed:\n%v\nwas:\n%v", i, got, before[i])
		}
	}
}

// A fork of a snapshot whose image the cache no longer has fails before
// anything is made, naming the snapshot and the image's digest.
func TestOverlayImageForkImageGone(t *testing.T) {
	img := providertest.TwoLayerImage(t)
	imgs := newMapImages(img)
	ov := newOverlayImages(t, imgs)
	providertest.Start(t, ov, provider.Spec{ID: "a", Image: img, Workdir: "/app"})
	providertest.Snapshot(t, ov, "a", "s1")
	imgs.mu.Lock()
	delete(imgs.images, img.Digest)
	imgs.mu.Unlock()

	_, err := ov.Fork(context.Background(), "s1", provider.Spec{ID: "b", Workdir: "/app"})
	want := "snapshot s1 stands on image " + img.Digest + "; it is not in the image cache: image " + img.Digest + " is not cached"
	if !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), want) {
		t.Fatalf("fork with the image gone: %v\nwant ErrInvalid with %q", err, want)
	}
	if got := ov.Sandboxes(); !slices.Equal(got, []string{"a"}) {
		t.Errorf("Sandboxes() = %v after the failed fork", got)
	}
	// Without any cache, the same.
	ov.cfg.Images = nil
	_, err = ov.Fork(context.Background(), "s1", provider.Spec{ID: "b", Workdir: "/app"})
	if !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), "snapshot s1 stands on image "+img.Digest) {
		t.Fatalf("fork without a cache: %v", err)
	}
	ov.cfg.Images = imgs
}

// A bad image is refused before anything is made: a missing layer, a
// layer path overlay cannot take.
func TestOverlayImageRefused(t *testing.T) {
	img := providertest.TwoLayerImage(t)
	ov := newOverlayImages(t, newMapImages(img))
	for name, bad := range map[string]func(*provider.Image){
		"colon":     func(i *provider.Image) { i.Layers = []string{"/a:b"} },
		"no layers": func(i *provider.Image) { i.Layers = nil },
		"no digest": func(i *provider.Image) { i.Digest = "" },
	} {
		c := *img
		c.Layers = slices.Clone(img.Layers)
		bad(&c)
		if _, err := ov.Start(context.Background(), provider.Spec{ID: "a", Image: &c}); !errors.Is(err, provider.ErrInvalid) {
			t.Errorf("%s: Start = %v, want ErrInvalid", name, err)
		}
		if got := ov.Sandboxes(); len(got) != 0 {
			t.Fatalf("%s: Sandboxes() = %v", name, got)
		}
	}
}

// A layer the cache gave that is not on the host is the host's fault,
// not the spec's: a plain error naming the layer, no ErrInvalid.
func TestOverlayImageLayerMissing(t *testing.T) {
	img := providertest.TwoLayerImage(t)
	ov := newOverlayImages(t, newMapImages(img))
	c := *img
	c.Layers = append(slices.Clone(img.Layers), "/nonexistent/layer")
	_, err := ov.Start(context.Background(), provider.Spec{ID: "a", Image: &c})
	if err == nil || errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), "/nonexistent/layer") {
		t.Errorf("Start with a layer missing = %v, want a plain error naming it", err)
	}
	if got := ov.Sandboxes(); len(got) != 0 {
		t.Fatalf("Sandboxes() = %v", got)
	}
}

// A new provider mends the holds an earlier process left: a snapshot's
// hold whose snapshot is gone (killed while copying) and a sandbox's
// whose sandbox is gone are released, a snapshot that lost its hold
// holds its image again, and another state directory's holds stay.
func TestOverlayReconcilesHolds(t *testing.T) {
	img := providertest.TwoLayerImage(t)
	imgs := newMapImages(img)
	ov := newOverlayImages(t, imgs)
	providertest.Start(t, ov, provider.Spec{ID: "a", Image: img})
	providertest.Snapshot(t, ov, "a", "s1")
	for _, h := range []string{ov.snapshotHolder("half"), ov.sandboxHolder("gone"), "overlay-ffffffff-snap-x"} {
		if err := imgs.Hold(h, img.Digest); err != nil {
			t.Fatal(err)
		}
	}
	if err := imgs.Release(ov.snapshotHolder("s1")); err != nil {
		t.Fatal(err)
	}
	cfg := ov.cfg
	if _, err := New(cfg); err != nil {
		t.Fatal(err)
	}
	if got, want := imgs.holders(ov), []string{"overlay-ffffffff-snap-x", "overlay-sandbox-a", "overlay-snap-s1"}; !slices.Equal(got, want) {
		t.Errorf("holds after New = %v, want %v", got, want)
	}
}

// An image of more layers than one page of mount options can name is
// mounted too, every layer in its place.
func TestOverlayImageManyLayers(t *testing.T) {
	root := filepath.Join(t.TempDir(), strings.Repeat("long-directory-name-", 5))
	var layers []string
	for i := range 40 {
		l := filepath.Join(root, fmt.Sprintf("layer-%02d-%s", i, strings.Repeat("x", 40)))
		if i == 0 {
			providertest.BusyboxLayer(t, l)
		}
		providertest.WriteFile(t, filepath.Join(l, fmt.Sprintf("f%02d", i)), fmt.Sprintf("%d\n", i), 0o644)
		providertest.WriteFile(t, filepath.Join(l, "last"), fmt.Sprintf("%d\n", i), 0o644)
		layers = append(layers, l)
	}
	if n := len(strings.Join(layers, ":")); n <= maxMountData {
		t.Fatalf("layer paths take %d bytes: not enough to need the new mount API", n)
	}
	img := &provider.Image{Ref: "many", Digest: "sha256:" + strings.Repeat("ef", 32), Layers: layers}
	ov := newOverlayImages(t, newMapImages(img))
	providertest.Start(t, ov, provider.Spec{ID: "a", Image: img, Env: []string{"PATH=/bin"}})
	if got := providertest.Sh(t, ov, "a", "cat /f00 /f39 /last"); got != "0\n39\n39\n" {
		t.Errorf("many layers: %q", got)
	}
}

func readJSON(p string, v any) error {
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}
