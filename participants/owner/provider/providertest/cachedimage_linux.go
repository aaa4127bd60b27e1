//go:build linux

package providertest

import (
	"compress/gzip"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// ImageCache is what the benchmarks need of an image cache
// (*image.Cache, which this package cannot import: the tests of image's
// own dependencies import this package).
type ImageCache interface {
	Get(ctx context.Context, ref string) (*provider.Image, error)
	Holders(prefix string) ([]string, error)
}

// CachedHostImage is HostImage put through a real image cache: its two
// layers tarred, written as an OCI image layout and unpacked by
// cache.Get, so that a provider given cache as its image finder holds
// the image in it on every start, as an owner's does.
func CachedHostImage(tb testing.TB, cache ImageCache) *provider.Image {
	tb.Helper()
	host := HostImage(tb)
	tmp := tb.TempDir()
	var layers []v1.Layer
	for i, dir := range host.Layers {
		file := filepath.Join(tmp, fmt.Sprintf("layer%d.tar", i))
		if out, err := exec.Command("tar", "--xattrs", "--numeric-owner", "-C", dir, "-cf", file, ".").CombinedOutput(); err != nil {
			tb.Fatalf("tar of %s (apt-get install tar): %v\n%s", dir, err, out)
		}
		l, err := tarball.LayerFromFile(file, tarball.WithCompressionLevel(gzip.BestSpeed))
		if err != nil {
			tb.Fatal(err)
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err == nil {
		img, err = mutate.Config(img, v1.Config{Env: host.Env})
	}
	if err != nil {
		tb.Fatal(err)
	}
	dir := filepath.Join(tmp, "layout")
	p, err := layout.Write(dir, empty.Index)
	if err == nil {
		err = p.AppendImage(img)
	}
	if err != nil {
		tb.Fatalf("OCI layout of the host image: %v", err)
	}
	got, err := cache.Get(context.Background(), dir)
	if err != nil {
		tb.Fatal(err)
	}
	return got
}
