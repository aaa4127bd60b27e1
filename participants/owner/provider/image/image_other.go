//go:build !linux

package image

import (
	"context"
	"errors"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

func (c *Cache) lockShared() (func(), error) { return nil, errors.ErrUnsupported }

func (c *Cache) unpackImage(ctx context.Context, src *source) (record, bool, error) {
	return record{}, false, errors.ErrUnsupported
}

// Prune is Linux only.
func (c *Cache) Prune(ctx context.Context) (int64, error) { return 0, errors.ErrUnsupported }

func (c *Cache) pruneAfterGet(ctx context.Context, src *source, unpacked bool) {}

// Rootfs is Linux only.
func (c *Cache) Rootfs(ctx context.Context, img *provider.Image, dst string) error {
	return errors.ErrUnsupported
}
