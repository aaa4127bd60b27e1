//go:build linux

package microvm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm/qemu"
)

// RootfsMaker writes a container image's merged tree into a directory: in
// an owner, the image cache (package image's Cache), from which the
// provider makes a root disk per image.
type RootfsMaker interface {
	// Rootfs writes img's merged tree (its layers applied bottom first,
	// whiteouts applied) into dst, an empty directory, keeping ownership,
	// modes, xattrs, hard links and device nodes.
	Rootfs(ctx context.Context, img *provider.Image, dst string) error
}

// guestMountPoints are the directories the guest's init mounts on or
// writes below (guest.Boot, sandboxd's state directory): an image's root
// disk gets those it lacks.
var guestMountPoints = []string{"proc", "sys", "dev", "tmp", "run", "var/lib", strings.TrimPrefix(BinDirInGuest, "/")}

// rootImage returns the raw root image a sandbox starts from: the
// provider's base (img nil), or the root disk of img (imageDisk).
func (m *Provider) rootImage(ctx context.Context, img *provider.Image) (string, error) {
	if img == nil {
		return m.baseImage(ctx)
	}
	return m.imageDisk(ctx, img)
}

// imageDigest is img's digest, "" for none.
func imageDigest(img *provider.Image) string {
	if img == nil {
		return ""
	}
	return img.Digest
}

// imageDiskName is the cache name (without extension) of the root disk of
// the image of manifest digest d: the digest and the free space the disk
// gets beyond the image's tree (BaseSize), which both decide its bytes.
func (m *Provider) imageDiskName(d string) (string, error) {
	hexd, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hexd) != 64 || strings.Trim(hexd, "0123456789abcdef") != "" {
		return "", fmt.Errorf("%q is not sha256:<64 lower-case hex digits>", d)
	}
	return fmt.Sprintf("image-%s-%d", hexd, m.cfg.BaseSize>>20), nil
}

// imageDisk returns the ext4 root disk of img, <cache>/images/image-<hex of
// the digest>-<BaseSize in MiB>.ext4, building it once: the merged tree
// from Config.Images, the mount points the guest needs, then mkfs with
// BaseSize of free space. Providers sharing the cache build it once (the
// image's lock); a build that fails leaves nothing of it in the cache,
// and its error names the image's reference and digest.
func (m *Provider) imageDisk(ctx context.Context, img *provider.Image) (string, error) {
	name, err := m.imageDiskName(img.Digest)
	if err != nil {
		return "", provider.InvalidField("spec.Image.Digest", "image %s: %v", img.Ref, err)
	}
	if m.cfg.Images == nil {
		return "", provider.InvalidField("spec.Image", "image %s (%s): this microvm provider has no image cache (Config.Images) to make its root disk of", img.Ref, img.Digest)
	}
	imgs := filepath.Join(m.cache, "images")
	disk := filepath.Join(imgs, name+".ext4")
	if _, err := os.Stat(disk); err == nil {
		return disk, nil
	}
	if err := os.MkdirAll(imgs, 0o700); err != nil {
		return "", err
	}
	unlock, err := lockFile(filepath.Join(imgs, name+".lock"))
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(disk); err == nil {
		return disk, nil // built by the provider this one waited for
	}
	fail := func(what string, err error) (string, error) {
		return "", fmt.Errorf("microvm: image %s (%s): %s: %w", img.Ref, img.Digest, what, err)
	}
	t0 := time.Now()
	stage := filepath.Join(imgs, name+".stage")
	if err := os.RemoveAll(stage); err != nil { // a dead builder's
		return fail("its staging directory", err)
	}
	defer os.RemoveAll(stage)
	if err := os.Mkdir(stage, 0o755); err != nil {
		return fail("its staging directory", err)
	}
	if err := m.cfg.Images.Rootfs(ctx, img, stage); err != nil {
		return fail("its root tree", err)
	}
	if err := hasShell(stage); err != nil {
		return fail("its root tree", err)
	}
	for _, d := range guestMountPoints {
		if err := mkdirInTree(stage, d); err != nil {
			return fail("the guest's mount points", err)
		}
	}
	size, err := diskSize(stage)
	if err != nil {
		return fail("its root tree", err)
	}
	if err := qemu.Ext4Image(ctx, m.assets.MkfsExt4, stage, disk, "sp-image", img.Digest, size+m.cfg.BaseSize); err != nil {
		return fail("its root disk", err)
	}
	m.log.Info().Str("image", img.Ref).Str("digest", img.Digest).Str("disk", disk).Dur("took", time.Since(t0)).Msg("microvm: image root disk built")
	return disk, nil
}

// hasShell checks that the tree at root has /bin/sh (links resolved
// inside the tree): the guest runs every launch with /bin/sh -c.
func hasShell(root string) error {
	fd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	sh, err := unix.Openat2(fd, "bin/sh", &unix.OpenHow{Flags: unix.O_PATH | unix.O_CLOEXEC, Resolve: unix.RESOLVE_IN_ROOT})
	if err != nil {
		return fmt.Errorf("no /bin/sh (the guest runs launches with /bin/sh -c): %w", err)
	}
	return unix.Close(sh)
}

// mkdirInTree makes the directory rel below root, and its missing
// parents, as root's own 0755 directories (tmp 1777). It never follows a
// link: where a component is a link or a file, it leaves the rest to the
// guest, which resolves it in its own root.
func mkdirInTree(root, rel string) error {
	p := root
	for _, c := range strings.Split(rel, "/") {
		p = filepath.Join(p, c)
		fi, err := os.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := os.Mkdir(p, 0o755); err != nil {
				return err
			}
			if err := os.Chown(p, 0, 0); err != nil {
				return err
			}
			if p == filepath.Join(root, "tmp") {
				if err := os.Chmod(p, 0o777|fs.ModeSticky); err != nil {
					return err
				}
			}
		case err != nil:
			return err
		case !fi.IsDir():
			return nil
		}
	}
	return nil
}

// diskSize is the room a tree takes on ext4, with margin: each entry's
// data in 4 KiB blocks, and 16 KiB an entry, mkfs's bytes per inode, so
// that a tree of many small files does not run out of inodes.
func diskSize(root string) (int64, error) {
	var n int64
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		n += 16 << 10
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += (fi.Size() + 4095) &^ 4095
		}
		return nil
	})
	return n, err
}
