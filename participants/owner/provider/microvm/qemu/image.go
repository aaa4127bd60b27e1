package qemu

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// Ext4Image builds a raw ext4 image of size bytes at dst whose root holds
// dir's tree (mkfs.ext4 -d), owned by root, labelled label. id names the
// tree's content (a hash of it): the file system's UUID and directory hash
// seed derive from it, so that the same tree and id give the same bytes.
//
// The image is built under a temporary name and then linked at dst,
// never renamed over it: dst is whole or absent, and once there it never
// changes. A guest that booted on an image (a warm template) holds the
// file system's state in its RAM, checksums seeded from the UUID among it;
// another process that built the same image at the same time must not
// put different bytes under it. When dst is there already, the one built
// here is dropped.
func Ext4Image(ctx context.Context, mkfs, dir, dst, label, id string, size int64) error {
	f, err := os.CreateTemp(filepath.Dir(dst), ".tmp-"+filepath.Base(dst)+"-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	f.Close()
	defer os.Remove(tmp)
	pinAccessTimes(dir)
	uuid := contentUUID(id + "\x00" + label)
	cmd := exec.CommandContext(ctx, mkfs, "-q", "-F", "-t", "ext4", "-L", label, "-d", dir, "-U", uuid,
		"-E", "root_owner=0:0,hash_seed="+uuid, "-O", "^has_journal", "-m", "0", tmp, strconv.FormatInt(size/1024, 10)+"k")
	cmd.Env = append(os.Environ(), "E2FSPROGS_FAKE_TIME=1") // no clock in the image either
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("mkfs.ext4 -d %s: %w: %s", dir, err, out)
	}
	if err := os.Link(tmp, dst); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

// contentUUID returns a UUID (version 4's layout) made from the hash of s.
func contentUUID(s string) string {
	h := sha256.Sum256([]byte(s))
	h[6] = h[6]&0x0f | 0x40
	h[8] = h[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// Overlay creates a qcow2 image at dst whose backing file is base (format
// "raw" or "qcow2"): writes go to dst, reads of what it does not hold go
// to base, which must not change afterwards.
func Overlay(ctx context.Context, qemuImg, base, baseFormat, dst string) error {
	out, err := exec.CommandContext(ctx, qemuImg, "create", "-q", "-f", "qcow2", "-b", base, "-F", baseFormat, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("qemu-img create %s on %s: %w: %s", dst, base, err, out)
	}
	return nil
}

// pinnedAccess is the access time pinAccessTimes gives the tree: later
// than any modification or change of it, and within ext4's 32-bit seconds.
var pinnedAccess = time.Date(2037, 1, 1, 0, 0, 0, 0, time.UTC)

// pinAccessTimes sets the access time of every file and directory under
// dir to pinnedAccess, best effort, so that two builds of one tree are the
// same bytes. mkfs copies each entry's access, modification and change
// times into the image, and reading the tree moves an access time that is
// not later than the entry's modification and change (relatime): the
// first build's reads would show in the second. An entry pinned already is
// left alone, since setting a time moves the change time.
func pinAccessTimes(dir string) {
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Atim.Sec == pinnedAccess.Unix() {
			return nil
		}
		_ = os.Chtimes(p, pinnedAccess, fi.ModTime())
		return nil
	})
}
