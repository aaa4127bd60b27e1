//go:build linux

package copytree

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"
)

// Stats counts what Copy copied.
type Stats struct {
	Bytes   int64 // regular file data, each inode once
	Entries int   // everything below the top directory
}

type devIno struct{ dev, ino uint64 }

// copier copies a directory tree exactly: file data (reflinked when the
// file system can), modes including setuid/setgid/sticky, owners, access
// and modification times, extended attributes in every namespace
// (trusted.overlay.* marks overlay's opaque directories), hard links
// within the tree, symbolic links, and device nodes, fifos and sockets
// (overlay's whiteouts are character devices 0/0). Its cost follows the
// size of the tree it copies.
type copier struct {
	ctx     context.Context
	links   map[devIno]string // first copy of each inode with more than one link
	noClone bool              // FICLONE failed once: the file system cannot reflink
	strict  bool              // as root every attribute must be kept
	live    bool              // the tree may change under the copy: skip what vanishes
	buf     []byte            // xattr names and values
	stats   Stats
}

// Copy copies the directory src to dst, which must not exist. As root
// every attribute is kept or the copy fails; otherwise owners and the
// xattr namespaces an unprivileged user cannot set are left as the
// process makes them.
func Copy(ctx context.Context, src, dst string) (Stats, error) {
	return copyTreeOf(ctx, src, dst, false)
}

// CopyLive is Copy of a tree whose processes may still write in it
// (a dir sandbox, which nothing freezes): an entry removed between the
// directory read and its copy is skipped, as it is gone.
func CopyLive(ctx context.Context, src, dst string) (Stats, error) {
	return copyTreeOf(ctx, src, dst, true)
}

func copyTreeOf(ctx context.Context, src, dst string, live bool) (Stats, error) {
	c := &copier{
		live:   live,
		ctx:    ctx,
		links:  make(map[devIno]string),
		strict: os.Geteuid() == 0,
		buf:    make([]byte, 4096),
	}
	var st unix.Stat_t
	if err := unix.Lstat(src, &st); err != nil {
		return c.stats, &os.PathError{Op: "lstat", Path: src, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return c.stats, &os.PathError{Op: "copy", Path: src, Err: unix.ENOTDIR}
	}
	err := c.dir(src, dst, &st)
	return c.stats, err
}

func (c *copier) dir(src, dst string, st *unix.Stat_t) error {
	if err := unix.Mkdir(dst, 0o700); err != nil {
		return &os.PathError{Op: "mkdir", Path: dst, Err: err}
	}
	f, err := openNoatime(src, unix.O_DIRECTORY)
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, name := range names {
		if err := c.ctx.Err(); err != nil {
			return err
		}
		s, d := src+"/"+name, dst+"/"+name
		var est unix.Stat_t
		if err := unix.Lstat(s, &est); err != nil {
			if c.live && errors.Is(err, unix.ENOENT) {
				continue
			}
			return &os.PathError{Op: "lstat", Path: s, Err: err}
		}
		c.stats.Entries++
		if err := c.entry(s, d, &est); err != nil {
			if c.live && errors.Is(err, fs.ErrNotExist) {
				_ = os.RemoveAll(d)
				continue
			}
			return err
		}
	}
	// Attributes last: a read-only directory must take its entries first,
	// and adding them would change its times.
	return c.meta(src, dst, st)
}

func (c *copier) entry(s, d string, st *unix.Stat_t) error {
	kind := st.Mode & unix.S_IFMT
	if kind != unix.S_IFDIR && st.Nlink > 1 {
		key := devIno{uint64(st.Dev), st.Ino}
		if first, ok := c.links[key]; ok {
			err := unix.Linkat(unix.AT_FDCWD, first, unix.AT_FDCWD, d, 0)
			if err == nil {
				return nil
			}
			if !c.live || !errors.Is(err, unix.ENOENT) {
				return &os.LinkError{Op: "link", Old: first, New: d, Err: err}
			}
			// The first name vanished from the copy (a live tree): copy
			// this one instead.
		}
		c.links[key] = d
	}
	switch kind {
	case unix.S_IFDIR:
		return c.dir(s, d, st)
	case unix.S_IFREG:
		if err := c.file(s, d, st); err != nil {
			return err
		}
	case unix.S_IFLNK:
		target, err := os.Readlink(s)
		if err != nil {
			return err
		}
		if err := unix.Symlink(target, d); err != nil {
			return &os.LinkError{Op: "symlink", Old: target, New: d, Err: err}
		}
	case unix.S_IFCHR, unix.S_IFBLK, unix.S_IFIFO, unix.S_IFSOCK:
		if err := unix.Mknod(d, st.Mode, int(st.Rdev)); err != nil {
			return &os.PathError{Op: "mknod", Path: d, Err: err}
		}
	default:
		return &os.PathError{Op: "copy", Path: s, Err: errors.New("unknown file type")}
	}
	return c.meta(s, d, st)
}

// file copies a regular file's data: a reflink (FICLONE) where the file
// system shares extents, else copy_file_range through io.Copy.
func (c *copier) file(s, d string, st *unix.Stat_t) error {
	in, err := openNoatime(s, unix.O_NOFOLLOW)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(d, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	c.stats.Bytes += st.Size
	if !c.noClone && st.Size > 0 {
		err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
		if err == nil {
			return out.Close()
		}
		if !errors.Is(err, unix.EOPNOTSUPP) && !errors.Is(err, unix.EXDEV) &&
			!errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
			out.Close()
			return &os.PathError{Op: "clone", Path: d, Err: err}
		}
		c.noClone = true
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// openNoatime opens path for reading without updating its access time
// (O_NOATIME, allowed to root and to the file's owner), so that copying a
// sandbox does not change it.
func openNoatime(path string, flags int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOATIME|flags, 0)
	if errors.Is(err, unix.EPERM) {
		f, err = os.OpenFile(path, os.O_RDONLY|flags, 0)
	}
	return f, err
}

// meta sets owner, xattrs, mode and times, in that order: chown clears
// setuid bits and file capabilities, and a POSIX ACL set after the mode
// would change it.
func (c *copier) meta(s, d string, st *unix.Stat_t) error {
	if err := unix.Lchown(d, int(st.Uid), int(st.Gid)); err != nil && (c.strict || !errors.Is(err, unix.EPERM)) {
		return &os.PathError{Op: "lchown", Path: d, Err: err}
	}
	if err := c.xattrs(s, d); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFLNK {
		if err := unix.Chmod(d, st.Mode&0o7777); err != nil {
			return &os.PathError{Op: "chmod", Path: d, Err: err}
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, d, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "utimes", Path: d, Err: err}
	}
	return nil
}

func (c *copier) xattrs(s, d string) error {
	list, err := c.get(func(b []byte) (int, error) { return unix.Llistxattr(s, b) })
	if err != nil {
		if errors.Is(err, unix.ENOTSUP) {
			return nil
		}
		return &os.PathError{Op: "llistxattr", Path: s, Err: err}
	}
	if len(list) == 0 {
		return nil
	}
	names := string(list) // the buffer is reused for the values
	for len(names) > 0 {
		i := 0
		for i < len(names) && names[i] != 0 {
			i++
		}
		name := names[:i]
		names = names[min(i+1, len(names)):]
		if name == "" {
			continue
		}
		val, err := c.get(func(b []byte) (int, error) { return unix.Lgetxattr(s, name, b) })
		if err != nil {
			return &os.PathError{Op: "lgetxattr " + name, Path: s, Err: err}
		}
		if err := unix.Lsetxattr(d, name, val, 0); err != nil {
			if !c.strict && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.ENOTSUP)) {
				continue
			}
			return &os.PathError{Op: "lsetxattr " + name, Path: d, Err: err}
		}
	}
	return nil
}

// get calls an xattr read into c.buf, growing it on ERANGE.
func (c *copier) get(read func([]byte) (int, error)) ([]byte, error) {
	for {
		n, err := read(c.buf)
		if err == nil {
			return c.buf[:n], nil
		}
		if !errors.Is(err, unix.ERANGE) {
			return nil, err
		}
		size, err := read(nil) // ask for the size
		if err != nil {
			return nil, err
		}
		c.buf = make([]byte, max(size, 2*len(c.buf)))
	}
}
