//go:build linux

package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

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

// maxMountData is what mount(2) copies of its options: one page.
const maxMountData = 4095

// lowerdirPlus says how mountLayers passes the lower directories: nil
// (the default) picks the classic lowerdir=a:b:c option of mount(2) when
// it fits in a page and no path holds , : \ or a newline, which every
// kernel takes, and fsconfig's lowerdir+ (Linux 6.8 or later, no bound)
// otherwise. Tests force either way.
var lowerdirPlus func(classic string) bool

// mountLayers mounts layers (bottom first) as a read-only overlay, with
// the empty directory below them (overlay wants two lower layers when it
// has no upper one), and returns the detached mount's fd.
func mountLayers(layers []string, empty string) (int, error) {
	lowers := slices.Clone(layers)
	slices.Reverse(lowers) // top first
	lowers = append(lowers, empty)
	classic := strings.Join(lowers, ":")
	// A path with a separator or an escape cannot go in the classic option.
	plus := len("lowerdir=")+len(classic) > maxMountData || strings.ContainsAny(strings.Join(layers, ""), ",:\\\n")
	if lowerdirPlus != nil {
		plus = lowerdirPlus(classic)
	}
	if !plus {
		return mountClassic(classic, empty)
	}
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fsfd)
	for _, l := range lowers {
		if err := unix.FsconfigSetString(fsfd, "lowerdir+", l); err != nil {
			return -1, fmt.Errorf("overlay lowerdir+ %s (%d layers: Linux 6.8 or later): %w%s", l, len(layers), err, fsMessages(fsfd))
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("overlay create: %w%s", err, fsMessages(fsfd))
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_RDONLY)
	if err != nil {
		return -1, fmt.Errorf("fsmount overlay: %w", err)
	}
	return mfd, nil
}

// mountClassic mounts the overlay of lowerdir (a:b:c, top first) with
// mount(2) on a directory next to empty, clones it as a detached mount
// (open_tree) and unmounts the directory: the caller gets a detached
// mount as from fsmount. fsconfig takes no string over 256 bytes, so the
// classic option goes through mount(2).
func mountClassic(lowerdir, empty string) (int, error) {
	mnt, err := os.MkdirTemp(filepath.Dir(empty), "rootfs-mnt-")
	if err != nil {
		return -1, err
	}
	defer os.Remove(mnt)
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+lowerdir); err != nil {
		return -1, fmt.Errorf("mount overlay lowerdir=%s: %w", lowerdir, err)
	}
	mfd, err := unix.OpenTree(unix.AT_FDCWD, mnt, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC)
	if uerr := unix.Unmount(mnt, unix.MNT_DETACH); uerr != nil && err == nil {
		unix.Close(mfd)
		return -1, fmt.Errorf("unmount %s: %w", mnt, uerr)
	}
	if err != nil {
		return -1, fmt.Errorf("open_tree %s: %w", mnt, err)
	}
	return mfd, nil
}

// fsMessages returns what the kernel logged on the file system context
// fsfd (read from it, one message a read), as ": msg; msg", or "".
func fsMessages(fsfd int) string {
	var out []string
	buf := make([]byte, 1024)
	for range 8 {
		n, err := unix.Read(fsfd, buf)
		if err != nil || n <= 0 {
			break
		}
		out = append(out, strings.TrimSpace(string(buf[:n])))
	}
	if len(out) == 0 {
		return ""
	}
	return ": " + strings.Join(out, "; ")
}
