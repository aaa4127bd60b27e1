package cli

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/participants/owner"
	"github.com/stillpoint/stillpoint/participants/owner/provider/image"
)

// The image cache opens where it is asked; a default that cannot be made
// leaves the owner without one (every image refused, saying why), and a
// directory given that cannot be made is an error.
func TestOpenImageCache(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "images")
	c, r, err := openImageCache(dir, true, 1<<30, zerolog.Nop())
	if rc, ok := r.(*image.Cache); !ok || c == nil || rc != c || imageFinder(c) == nil || err != nil {
		t.Fatalf("openImageCache(%s) = %v, %T, %v", dir, c, r, err)
	}
	bad := "/dev/null/images"
	c, r, err = openImageCache(bad, false, 0, zerolog.Nop())
	if err != nil || c != nil || imageFinder(c) != nil {
		t.Fatalf("default that cannot be made: %v, cache %v", err, c)
	}
	if _, err := r.GetHeld(context.Background(), "/srv/img", "owner-x-seed-s"); !errors.Is(err, owner.ErrBadTask) || !strings.Contains(err.Error(), bad) {
		t.Errorf("GetHeld without a cache: %v, want ErrBadTask naming %s", err, bad)
	}
	if _, _, err := openImageCache(bad, true, 0, zerolog.Nop()); err == nil || !strings.Contains(err.Error(), "--image-cache") {
		t.Errorf("--image-cache that cannot be made: %v", err)
	}
}
