//go:build linux

package image

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// unsafeEntry is a layer entry refused: it would land outside its layer
// or be written through a symbolic link.
type unsafeEntry struct {
	entry string
	why   string
}

func (e *unsafeEntry) Error() string { return fmt.Sprintf("entry %q: %s", e.entry, e.why) }

// tooLarge is a layer refused for unpacking to more than its bound: the
// cache's MaxBytes less what the image's other new layers took.
type tooLarge struct {
	entry string
	limit int64
}

func (e *tooLarge) Error() string {
	return fmt.Sprintf("unpacks to more than %d bytes (at entry %q), over the cache's size bound", e.limit, e.entry)
}

const (
	whiteoutPrefix = ".wh."
	opaqueMarker   = ".wh..wh..opq"
	xattrPAX       = "SCHILY.xattr."
	overlayXattr   = "trusted.overlay."
	opaqueXattr    = "trusted.overlay.opaque"
)

// cleanEntry returns a tar entry's name relative to the layer's root, or
// an unsafeEntry for an absolute name or one that climbs out with "..".
func cleanEntry(name string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", &unsafeEntry{name, "absolute path"}
	}
	p := path.Clean(name)
	if p == ".." || strings.HasPrefix(p, "../") {
		return "", &unsafeEntry{name, "climbs out of the layer"}
	}
	return p, nil
}

// layerDir extracts into one layer's directory. Every parent is resolved
// with openat2(RESOLVE_BENEATH|RESOLVE_NO_SYMLINKS) from the root's file
// descriptor and every entry is made relative to its parent's descriptor,
// so that nothing is ever written through a symbolic link or outside.
type layerDir struct {
	root  int
	path  string
	size  int64
	limit int64     // on size: a layer (a decompression bomb) never fills the disk
	dirs  []dirTime // mtimes of directories, set last
	files int
	// whited are the entries this layer whites out: a directory of the
	// same name in this layer is made opaque instead.
	whited map[string]bool
}

type dirTime struct {
	rel   string
	atime unix.Timespec
	mtime unix.Timespec
}

// openDir opens the directory rel beneath the root, making it and its
// parents (0755) when create is set and they are missing.
func (d *layerDir) openDir(entry, rel string, create bool) (int, error) {
	if rel == "." {
		return unix.Dup(d.root)
	}
	how := unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	}
	for {
		fd, err := unix.Openat2(d.root, rel, &how)
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.EINTR) || errors.Is(err, unix.EAGAIN):
			continue
		case errors.Is(err, unix.ELOOP):
			return -1, &unsafeEntry{entry, "written through a symbolic link"}
		case errors.Is(err, unix.EXDEV):
			return -1, &unsafeEntry{entry, "climbs out of the layer"}
		case errors.Is(err, unix.ENOTDIR):
			return -1, &unsafeEntry{entry, d.notDir(rel)}
		case errors.Is(err, unix.ENOENT) && create:
			pfd, err := d.openDir(entry, path.Dir(rel), true)
			if err != nil {
				return -1, err
			}
			err = unix.Mkdirat(pfd, path.Base(rel), 0o755)
			if err == nil {
				err = unix.Fchmodat(pfd, path.Base(rel), 0o755, 0)
				d.size += 4096
			}
			unix.Close(pfd)
			if err != nil && !errors.Is(err, unix.EEXIST) {
				return -1, &os.PathError{Op: "mkdir", Path: path.Join(d.path, rel), Err: err}
			}
			create = false
			continue
		default:
			return -1, &os.PathError{Op: "openat2", Path: path.Join(d.path, rel), Err: err}
		}
	}
}

// notDir says why rel is not a directory: the first of its parts, from
// the top, that is a symbolic link or not a directory.
func (d *layerDir) notDir(rel string) string {
	parts := strings.Split(rel, "/")
	for i := range parts {
		var st unix.Stat_t
		p := strings.Join(parts[:i+1], "/")
		if err := unix.Fstatat(d.root, p, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			break
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFLNK:
			return fmt.Sprintf("written through a symbolic link (%s)", p)
		case unix.S_IFDIR:
		default:
			return fmt.Sprintf("%s is not a directory", p)
		}
	}
	return "a parent is not a directory"
}

// extract writes the tar stream r into the new directory dst and returns
// its disk usage; a layer that would take more than limit bytes is
// refused (tooLarge) before the entry that passes it is written.
func extract(ctx context.Context, r io.Reader, dst string, limit int64) (int64, error) {
	if err := os.Mkdir(dst, 0o755); err != nil {
		return 0, err
	}
	if err := os.Chmod(dst, 0o755); err != nil {
		return 0, err
	}
	root, err := unix.Open(dst, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: dst, Err: err}
	}
	defer unix.Close(root)
	d := &layerDir{root: root, path: dst, size: 4096, limit: limit}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
		if d.files++; d.files%256 == 0 && ctx.Err() != nil {
			return 0, ctx.Err()
		}
		if d.size+max(h.Size, 0) > d.limit {
			return 0, &tooLarge{h.Name, d.limit}
		}
		if err := d.entry(h, tr); err != nil {
			return 0, err
		}
	}
	for i := len(d.dirs) - 1; i >= 0; i-- { // children first
		t := d.dirs[i]
		pfd, err := d.openDir(t.rel, path.Dir(t.rel), false)
		if err != nil {
			return 0, err
		}
		err = unix.UtimesNanoAt(pfd, path.Base(t.rel), []unix.Timespec{t.atime, t.mtime}, unix.AT_SYMLINK_NOFOLLOW)
		unix.Close(pfd)
		if err != nil {
			return 0, &os.PathError{Op: "utimes", Path: path.Join(dst, t.rel), Err: err}
		}
	}
	return d.size, nil
}

// entry extracts one tar entry.
func (d *layerDir) entry(h *tar.Header, r io.Reader) error {
	rel, err := cleanEntry(h.Name)
	if err != nil {
		return err
	}
	switch h.Typeflag {
	case tar.TypeXGlobalHeader:
		return nil
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink, tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
	default:
		return &unsafeEntry{h.Name, fmt.Sprintf("unsupported entry type %q", h.Typeflag)}
	}
	if rel == "." {
		if h.Typeflag != tar.TypeDir {
			return &unsafeEntry{h.Name, "the layer's root is not a directory"}
		}
		return d.meta(h, d.root, ".", rel)
	}
	pfd, err := d.openDir(h.Name, path.Dir(rel), true)
	if err != nil {
		return err
	}
	defer unix.Close(pfd)
	base := path.Base(rel)
	full := path.Join(d.path, rel)

	if base == opaqueMarker {
		if err := unix.Fsetxattr(pfd, opaqueXattr, []byte("y"), 0); err != nil {
			return &os.PathError{Op: "setxattr " + opaqueXattr, Path: path.Dir(full), Err: err}
		}
		return nil
	}
	if strings.HasPrefix(base, whiteoutPrefix) {
		name := strings.TrimPrefix(base, whiteoutPrefix)
		if name == "" || name == "." || name == ".." {
			return &unsafeEntry{h.Name, "a whiteout of nothing"}
		}
		return d.whiteout(pfd, path.Join(path.Dir(rel), name), name, path.Join(path.Dir(full), name))
	}
	if err := d.clear(pfd, base, h.Typeflag == tar.TypeDir, full); err != nil {
		return err
	}
	perm := uint32(h.Mode) & 0o7777
	switch h.Typeflag {
	case tar.TypeDir:
		if err := unix.Mkdirat(pfd, base, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
			return &os.PathError{Op: "mkdir", Path: full, Err: err}
		}
		d.size += 4096
		if d.whited[rel] { // hides the lower layers' directory, not its own entries
			if err := d.setOpaque(pfd, base, full); err != nil {
				return err
			}
		}
	case tar.TypeReg:
		fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return &os.PathError{Op: "create", Path: full, Err: err}
		}
		f := os.NewFile(uintptr(fd), full)
		_, err = io.Copy(f, r)
		var st unix.Stat_t
		if err == nil {
			err = unix.Fstat(fd, &st)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		d.size += st.Blocks * 512
	case tar.TypeSymlink:
		if err := unix.Symlinkat(h.Linkname, pfd, base); err != nil {
			return &os.PathError{Op: "symlink", Path: full, Err: err}
		}
	case tar.TypeLink:
		return d.link(h, pfd, base, full)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		mode := map[byte]uint32{tar.TypeChar: unix.S_IFCHR, tar.TypeBlock: unix.S_IFBLK, tar.TypeFifo: unix.S_IFIFO}[h.Typeflag]
		dev := int(unix.Mkdev(uint32(h.Devmajor), uint32(h.Devminor)))
		if err := unix.Mknodat(pfd, base, mode|perm, dev); err != nil {
			return &os.PathError{Op: "mknod", Path: full, Err: err}
		}
	}
	return d.meta(h, pfd, base, rel)
}

// whiteout hides rel (name in the directory pfd) of the lower layers: a
// 0/0 character device, overlay's whiteout. Per the OCI image spec a
// whiteout hides only lower layers' entries: an entry of this layer at
// rel, whichever comes first in the tar, stays, and a directory there is
// made opaque (its lower namesakes hidden, its own entries shown).
func (d *layerDir) whiteout(pfd int, rel, name, full string) error {
	if d.whited == nil {
		d.whited = map[string]bool{}
	}
	d.whited[rel] = true
	var st unix.Stat_t
	err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	switch {
	case errors.Is(err, unix.ENOENT):
		if err := unix.Mknodat(pfd, name, unix.S_IFCHR, 0); err != nil {
			return &os.PathError{Op: "mknod whiteout", Path: full, Err: err}
		}
		return nil
	case err != nil:
		return &os.PathError{Op: "stat", Path: full, Err: err}
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return d.setOpaque(pfd, name, full)
	}
	return nil // this layer's own entry (or whiteout) already hides the lower ones
}

// setOpaque marks the directory name (in pfd) opaque for overlay.
func (d *layerDir) setOpaque(pfd int, name, full string) error {
	at := fmt.Sprintf("/proc/self/fd/%d/%s", pfd, name)
	if err := unix.Lsetxattr(at, opaqueXattr, []byte("y"), 0); err != nil {
		return &os.PathError{Op: "setxattr " + opaqueXattr, Path: full, Err: err}
	}
	return nil
}

// clear removes what an earlier entry of this layer left at name, unless
// both are directories (a directory's later entry updates it).
func (d *layerDir) clear(pfd int, name string, dir bool, full string) error {
	var st unix.Stat_t
	err := unix.Fstatat(pfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		return &os.PathError{Op: "stat", Path: full, Err: err}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if dir {
			return nil
		}
		// Go's RemoveAll removes with *at calls and follows no link.
		return os.RemoveAll(fmt.Sprintf("/proc/self/fd/%d/%s", pfd, name))
	}
	if err := unix.Unlinkat(pfd, name, 0); err != nil {
		return &os.PathError{Op: "unlink", Path: full, Err: err}
	}
	return nil
}

// link makes a hard link to an entry earlier in the same layer.
func (d *layerDir) link(h *tar.Header, pfd int, base, full string) error {
	target, err := cleanEntry(h.Linkname)
	if err != nil {
		return &unsafeEntry{h.Name, fmt.Sprintf("hard link to %q outside the layer", h.Linkname)}
	}
	if target == "." {
		return &unsafeEntry{h.Name, "hard link to the layer's root"}
	}
	tfd, err := d.openDir(h.Name, path.Dir(target), false)
	var ue *unsafeEntry
	if errors.As(err, &ue) {
		return &unsafeEntry{h.Name, fmt.Sprintf("hard link to %q: %s", h.Linkname, ue.why)}
	}
	if err != nil {
		return &unsafeEntry{h.Name, fmt.Sprintf("hard link to %q, which is not in the layer", h.Linkname)}
	}
	defer unix.Close(tfd)
	var st unix.Stat_t
	if err := unix.Fstatat(tfd, path.Base(target), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &unsafeEntry{h.Name, fmt.Sprintf("hard link to %q, which is not in the layer", h.Linkname)}
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return &unsafeEntry{h.Name, fmt.Sprintf("hard link to directory %q", h.Linkname)}
	}
	if err := unix.Linkat(tfd, path.Base(target), pfd, base, 0); err != nil {
		return &os.PathError{Op: "link", Path: full, Err: err}
	}
	return nil
}

// meta sets an entry's owner, mode, extended attributes and times (a
// directory's times later, after its children are in). The owner comes
// first: chown clears setuid bits and file capabilities.
func (d *layerDir) meta(h *tar.Header, pfd int, base, rel string) error {
	full := path.Join(d.path, rel)
	if err := unix.Fchownat(pfd, base, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "chown", Path: full, Err: err}
	}
	if h.Typeflag != tar.TypeSymlink {
		if err := unix.Fchmodat(pfd, base, uint32(h.Mode)&0o7777, 0); err != nil {
			return &os.PathError{Op: "chmod", Path: full, Err: err}
		}
	}
	at := fmt.Sprintf("/proc/self/fd/%d/%s", pfd, base) // the entry, not followed
	for k, v := range h.PAXRecords {
		name, ok := strings.CutPrefix(k, xattrPAX)
		if !ok || strings.HasPrefix(name, overlayXattr) {
			continue // overlay's own marks come from whiteouts only
		}
		if err := unix.Lsetxattr(at, name, []byte(v), 0); err != nil {
			return &os.PathError{Op: "setxattr " + strconv.Quote(name), Path: full, Err: err}
		}
	}
	atime := h.AccessTime
	if atime.IsZero() {
		atime = h.ModTime
	}
	ts := []unix.Timespec{unix.NsecToTimespec(atime.UnixNano()), unix.NsecToTimespec(h.ModTime.UnixNano())}
	if h.Typeflag == tar.TypeDir {
		d.dirs = append(d.dirs, dirTime{rel: rel, atime: ts[0], mtime: ts[1]})
		return nil
	}
	if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimes", Path: full, Err: err}
	}
	return nil
}
