package cli

import (
	"context"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/participants/owner"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/image"
	"github.com/stillpoint/stillpoint/participants/owner/provider/overlay"
)

// defaultImageCache is --image-cache's default: the host's image cache,
// which owners may share.
const defaultImageCache = "/var/cache/stillpoint/images"

// The image cache is what the owner resolves images with and what the
// overlay provider finds and holds them in.
var (
	_ owner.ImageResolver = (*image.Cache)(nil)
	_ overlay.ImageFinder = (*image.Cache)(nil)
)

// openImageCache opens the owner's image cache at dir, bounded by max
// bytes (0: image.DefaultMaxBytes), and returns it with the owner's
// resolver. When the default directory cannot be made (an owner that is
// not root), the owner runs without a cache: cache is nil and the
// resolver refuses every image, saying why. A directory given explicitly
// must open.
func openImageCache(dir string, explicit bool, max int64, log zerolog.Logger) (*image.Cache, owner.ImageResolver, error) {
	c, err := image.Open(dir, image.Options{MaxBytes: max, Logger: log})
	if err == nil {
		return c, c, nil
	}
	if explicit {
		return nil, nil, fmt.Errorf("--image-cache %s: %w", dir, err)
	}
	log.Warn().Err(err).Str("dir", dir).Msg("no image cache: tasks that name an image are refused (set --image-cache)")
	return nil, noImageCache{fmt.Errorf("no image cache: --image-cache %s: %w", dir, err)}, nil
}

// imageFinder is the cache as the overlay provider's finder: a nil
// interface, not a nil *image.Cache, when there is none.
func imageFinder(c *image.Cache) overlay.ImageFinder {
	if c == nil {
		return nil
	}
	return c
}

// noImageCache is the resolver of an owner without an image cache: it
// refuses every image as Config.Images nil does (owner.ErrBadTask).
type noImageCache struct{ err error }

func (n noImageCache) GetHeld(context.Context, string, string) (*provider.Image, error) {
	return nil, fmt.Errorf("%w: %w", owner.ErrBadTask, n.err)
}

func (noImageCache) Release(string) error { return nil }

func (noImageCache) Holders(string) ([]string, error) { return nil, nil }
