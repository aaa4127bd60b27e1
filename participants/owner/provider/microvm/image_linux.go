//go:build linux

package microvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/copytree"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm/qemu"
)

// initrdPath is the guests' initramfs, named for what it holds.
func (m *Provider) initrdPath() string {
	return filepath.Join(m.cache, "initrd-"+m.initrdKey)
}

// buildInitrd writes the initramfs (busybox, the modules, sandboxd as
// /init) unless it is there.
func (m *Provider) buildInitrd(ctx context.Context) error {
	h := sha256.New()
	for _, p := range []string{m.cfg.Sandboxd, m.assets.Busybox} {
		if err := hashFile(h, p); err != nil {
			return err
		}
	}
	fmt.Fprintf(h, "%s\n%v\n", m.assets.KernelVersion, m.assets.Load)
	m.initrdKey = hex.EncodeToString(h.Sum(nil))[:16]
	if _, err := os.Stat(m.initrdPath()); err == nil {
		return nil
	}
	return qemu.Initramfs{Assets: m.assets, Sandboxd: m.cfg.Sandboxd}.Write(ctx, m.initrdPath())
}

// baseImage returns the root image every sandbox's disk starts from,
// building it once: from BaseDir, or from a tree of busybox applets.
func (m *Provider) baseImage(ctx context.Context) (string, error) {
	m.imgMu.Lock()
	defer m.imgMu.Unlock()
	if m.base != "" {
		return m.base, nil
	}
	dir := m.cfg.BaseDir
	if dir == "" {
		var err error
		if dir, err = m.defaultBaseTree(ctx); err != nil {
			return "", err
		}
	}
	img, err := m.imageOf(ctx, "base", dir, m.cfg.BaseSize)
	if err == nil {
		m.base = img
	}
	return img, err
}

// harnessMount is where the guest mounts the harness disk for binds: ""
// (BinDirInGuest) for at most the one bind there, else HarnessRootInGuest,
// the disk then holding every bind at its place below it.
func harnessMount(binds []provider.Bind) string {
	for _, b := range binds {
		if rel, _ := provider.CleanRel("", b.SandboxDir); "/"+rel != BinDirInGuest {
			return HarnessRootInGuest
		}
	}
	return ""
}

// harnessImage returns the read-only image of what the guest shows at
// BinDirInGuest: the one bound directory and the files Spec.CopyIn puts
// there (an empty image without either), cached by content. With binds
// elsewhere below HarnessRootInGuest (harnessMount), the image holds each
// bind at its place below that root instead, the files too.
func (m *Provider) harnessImage(ctx context.Context, binds []provider.Bind, copyIn []provider.CopyIn) (string, error) {
	m.imgMu.Lock()
	defer m.imgMu.Unlock()
	root := BinDirInGuest
	if harnessMount(binds) != "" {
		root = HarnessRootInGuest
	}
	var files []provider.CopyIn
	for _, c := range copyIn {
		if rel, _ := provider.CleanRel("", c.SandboxPath); strings.HasPrefix("/"+rel+"/", root+"/") {
			files = append(files, c)
		}
	}
	dir := ""
	switch {
	case len(files) > 0 || root != BinDirInGuest:
		// Staged: the bound tree and the files, in a directory of their
		// own, remembered by what they are made of.
		key := sha256.New()
		for _, b := range binds {
			fmt.Fprintf(key, "bind %s %s\n", b.HostDir, b.SandboxDir)
			if root != BinDirInGuest {
				// What the tree holds (names, sizes, times): a bind whose
				// files change gets a new image.
				if err := filepath.WalkDir(b.HostDir, func(p string, d fs.DirEntry, err error) error {
					if err != nil {
						return err
					}
					fi, err := os.Stat(p) // through links, as copyTree reads them
					if err != nil {
						return err
					}
					fmt.Fprintf(key, " %s %d %d %o\n", p, fi.Size(), fi.ModTime().UnixNano(), fi.Mode())
					return nil
				}); err != nil {
					return "", provider.InvalidField("spec.Binds", "%v", err)
				}
			}
		}
		for _, c := range files {
			fi, err := os.Stat(c.HostPath)
			if err != nil {
				return "", provider.InvalidField("spec.CopyIn", "%v", err)
			}
			fmt.Fprintf(key, "file %s %s %d %d %o\n", c.HostPath, c.SandboxPath, fi.Size(), fi.ModTime().UnixNano(), c.Mode)
		}
		k := hex.EncodeToString(key.Sum(nil))
		if img, ok := m.staged[k]; ok {
			return img, nil
		}
		stage, err := os.MkdirTemp(m.cache, ".stage-")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(stage)
		switch {
		case root != BinDirInGuest:
			if err := os.Mkdir(stage+"/t", 0o755); err != nil {
				return "", err
			}
			for _, b := range binds {
				rel, _ := provider.CleanRel("", b.SandboxDir)
				dst := filepath.Join(stage, "t", strings.TrimPrefix("/"+rel, root))
				if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
					return "", err
				}
				if _, err := copytree.Copy(ctx, b.HostDir, dst); err != nil {
					return "", err
				}
			}
		case len(binds) == 1:
			if _, err := copytree.Copy(ctx, binds[0].HostDir, stage+"/t"); err != nil {
				return "", err
			}
		default:
			if err := os.Mkdir(stage+"/t", 0o755); err != nil {
				return "", err
			}
		}
		for _, c := range files {
			rel, _ := provider.CleanRel("", c.SandboxPath)
			dst := filepath.Join(stage, "t", strings.TrimPrefix("/"+rel, root))
			b, err := os.ReadFile(c.HostPath)
			if err != nil {
				return "", err
			}
			mode := os.FileMode(c.Mode)
			if mode == 0 {
				mode = 0o755
			}
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return "", err
			}
			if err := os.WriteFile(dst, b, mode); err != nil {
				return "", err
			}
		}
		img, err := m.sizedImage(ctx, stage+"/t")
		if err == nil {
			m.staged[k] = img
		}
		return img, err
	case len(binds) == 1:
		dir = binds[0].HostDir
	default:
		dir = filepath.Join(m.cache, "empty")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
	}
	return m.sizedImage(ctx, dir)
}

// sizedImage is the harness image of dir, sized for its files.
func (m *Provider) sizedImage(ctx context.Context, dir string) (string, error) {
	size, err := treeSize(dir)
	if err != nil {
		return "", err
	}
	return m.imageOf(ctx, "harness", dir, size+size/4+16<<20)
}

// imageOf builds (once) the ext4 image of dir's tree, named for its
// content, in cache/images.
func (m *Provider) imageOf(ctx context.Context, kind, dir string, size int64) (string, error) {
	sum, err := treeHash(dir)
	if err != nil {
		return "", err
	}
	imgs := filepath.Join(m.cache, "images")
	if err := os.MkdirAll(imgs, 0o700); err != nil {
		return "", err
	}
	img := filepath.Join(imgs, fmt.Sprintf("%s-%s-%d.ext4", kind, sum[:16], size>>20))
	if _, err := os.Stat(img); err == nil {
		return img, nil
	}
	if err := qemu.Ext4Image(ctx, m.assets.MkfsExt4, dir, img, "sp-"+kind, sum, size); err != nil {
		return "", err
	}
	return img, nil
}

// treeHash hashes a directory tree: every entry's path, type, mode and
// size, the contents of files and the targets of links.
func treeHash(dir string) (string, error) {
	h := sha256.New()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		fi, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%s\x00%o\x00%d\x00", rel, fi.Mode(), fi.Size())
		switch {
		case fi.Mode().IsRegular():
			return hashFile(h, p)
		case fi.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			fmt.Fprintf(h, "%s\x00", t)
			return err
		}
		return nil
	})
	return hex.EncodeToString(h.Sum(nil)), err
}

func hashFile(w io.Writer, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// treeSize sums the sizes of a tree's regular files.
func treeSize(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			n += fi.Size() + 4096
		}
		return nil
	})
	return n, err
}
