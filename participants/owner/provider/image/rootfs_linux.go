//go:build linux

package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/copytree"
)

// Rootfs writes img's merged tree into the empty directory dst: the
// layers stacked as a read-only overlay (a detached mount, seen by this
// process only) and copied out with owners, modes, times, xattrs (those of
// overlay itself excepted: overlay does not show them), hard links and
// device nodes. A Prune waits for it. It is what the microvm provider makes a disk of. dst ends
// with the mode and owner of the image's root.
func (c *Cache) Rootfs(ctx context.Context, img *provider.Image, dst string) error {
	if img == nil || len(img.Layers) == 0 {
		return fmt.Errorf("image: rootfs: no layers")
	}
	f, err := os.Open(dst)
	if err != nil {
		return fmt.Errorf("image %s: rootfs: %w", img.Ref, err)
	}
	_, err = f.Readdirnames(1)
	f.Close()
	if !errors.Is(err, io.EOF) {
		return fmt.Errorf("image %s: rootfs: %s is not an empty directory", img.Ref, dst)
	}
	unlock, err := c.lockShared() // no Prune while the layers are read
	if err != nil {
		return fmt.Errorf("image %s: rootfs: %w", img.Ref, err)
	}
	defer unlock()
	empty, err := os.MkdirTemp(filepath.Join(c.dir, tmpDir), "rootfs-")
	if err != nil {
		return fmt.Errorf("image %s: rootfs: %w", img.Ref, err)
	}
	defer os.Remove(empty)
	mfd, err := mountLayers(img.Layers, empty)
	if err != nil {
		return fmt.Errorf("image %s: rootfs: %w", img.Ref, err)
	}
	defer unix.Close(mfd) // the detached mount goes with its last fd
	if err := os.Remove(dst); err != nil {
		return fmt.Errorf("image %s: rootfs: %w", img.Ref, err)
	}
	if _, err := copytree.Copy(ctx, fmt.Sprintf("/proc/self/fd/%d/.", mfd), dst); err != nil {
		return fmt.Errorf("image %s: rootfs: %w", img.Ref, err)
	}
	return nil
}

// mountLayers mounts layers (bottom first) as a read-only overlay, with
// the empty directory below them (overlay wants two lower layers when it
// has no upper one), and returns the detached mount's fd. The new mount
// API takes each layer on its own (lowerdir+), with no bound on their
// number or the length of their paths.
func mountLayers(layers []string, empty string) (int, error) {
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fsfd)
	for i := len(layers) - 1; i >= 0; i-- {
		if err := unix.FsconfigSetString(fsfd, "lowerdir+", layers[i]); err != nil {
			return -1, fmt.Errorf("overlay lowerdir+ %s: %w", layers[i], err)
		}
	}
	if err := unix.FsconfigSetString(fsfd, "lowerdir+", empty); err != nil {
		return -1, fmt.Errorf("overlay lowerdir+ %s: %w", empty, err)
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("overlay create: %w", err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_RDONLY)
	if err != nil {
		return -1, fmt.Errorf("fsmount overlay: %w", err)
	}
	return mfd, nil
}
