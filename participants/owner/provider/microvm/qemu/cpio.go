package qemu

import (
	"fmt"
	"io"
	"io/fs"
	"strings"
)

// CPIO writes a cpio archive in the "newc" format, the one the Linux
// kernel unpacks as an initramfs: a 110-byte ASCII header per entry, the
// name, the data, each padded to 4 bytes, and a TRAILER!!! entry at the
// end (Close).
type CPIO struct {
	w     io.Writer
	ino   uint32
	err   error
	dirs  map[string]bool
	files int
}

// NewCPIO returns a writer of a newc archive to w.
func NewCPIO(w io.Writer) *CPIO { return &CPIO{w: w, ino: 1, dirs: map[string]bool{}} }

// Dir adds a directory (and its parents not added yet).
func (c *CPIO) Dir(name string, perm fs.FileMode) error {
	name = strings.Trim(name, "/")
	if name == "" || c.dirs[name] {
		return c.err
	}
	if i := strings.LastIndexByte(name, '/'); i > 0 {
		if err := c.Dir(name[:i], 0o755); err != nil {
			return err
		}
	}
	c.dirs[name] = true
	return c.entry(name, 0o040000|uint32(perm.Perm()), nil)
}

// File adds a regular file with data, making its parent directories.
func (c *CPIO) File(name string, perm fs.FileMode, data []byte) error {
	name = strings.Trim(name, "/")
	if err := c.parent(name); err != nil {
		return err
	}
	return c.entry(name, 0o100000|uint32(perm.Perm()), data)
}

// Symlink adds a symbolic link name → target.
func (c *CPIO) Symlink(name, target string) error {
	name = strings.Trim(name, "/")
	if err := c.parent(name); err != nil {
		return err
	}
	return c.entry(name, 0o120000|0o777, []byte(target))
}

// Close writes the trailer. It does not close the underlying writer.
func (c *CPIO) Close() error { return c.entry("TRAILER!!!", 0, nil) }

func (c *CPIO) parent(name string) error {
	if i := strings.LastIndexByte(name, '/'); i > 0 {
		return c.Dir(name[:i], 0o755)
	}
	return c.err
}

func (c *CPIO) entry(name string, mode uint32, data []byte) error {
	if c.err != nil {
		return c.err
	}
	ino := c.ino
	c.ino++
	nlink := 1
	if mode&0o170000 == 0o040000 {
		nlink = 2
	}
	if name == "TRAILER!!!" {
		ino, nlink = 0, 1
	}
	// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize, check.
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	var b []byte
	b = append(b, hdr...)
	b = append(b, name...)
	b = append(b, 0)
	b = pad4(b)
	b = append(b, data...)
	b = pad4(b)
	if _, err := c.w.Write(b); err != nil {
		c.err = err
	}
	c.files++
	return c.err
}

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}
