//go:build linux

package copytree

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

// makeTree builds a tree with every kind of entry the copier must keep.
func makeTree(t *testing.T, root string) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(root, "d/sub"), 0o755))
	must(os.WriteFile(filepath.Join(root, "d/file"), []byte("data\n"), 0o640))
	must(os.WriteFile(filepath.Join(root, "empty"), nil, 0o600))
	must(os.WriteFile(filepath.Join(root, "big"), bytes.Repeat([]byte("0123456789abcdef"), 1<<16), 0o644))
	must(os.Link(filepath.Join(root, "d/file"), filepath.Join(root, "link1")))
	must(os.Link(filepath.Join(root, "d/file"), filepath.Join(root, "d/sub/link2")))
	must(os.Symlink("d/file", filepath.Join(root, "sym")))
	must(os.Symlink("/does/not/exist", filepath.Join(root, "dangling")))
	must(unix.Mkfifo(filepath.Join(root, "fifo"), 0o620))
	must(unix.Mknod(filepath.Join(root, "whiteout"), unix.S_IFCHR, 0))
	must(unix.Mknod(filepath.Join(root, "d/sock"), unix.S_IFSOCK|0o755, 0))
	must(os.WriteFile(filepath.Join(root, "suid"), []byte("#!/bin/sh\n"), 0o755))
	must(os.Chown(filepath.Join(root, "suid"), 1000, 1000))
	must(os.Chmod(filepath.Join(root, "suid"), 0o4755|os.ModeSetuid))
	must(unix.Chmod(filepath.Join(root, "suid"), 0o4755))
	must(os.Mkdir(filepath.Join(root, "sticky"), 0o755))
	must(unix.Chmod(filepath.Join(root, "sticky"), 0o1777))
	must(os.Mkdir(filepath.Join(root, "opaque"), 0o755))
	must(unix.Lsetxattr(filepath.Join(root, "opaque"), "trusted.overlay.opaque", []byte("y"), 0))
	must(unix.Lsetxattr(filepath.Join(root, "d/file"), "user.a", []byte("1"), 0))
	must(unix.Lsetxattr(filepath.Join(root, "d/file"), "user.long", bytes.Repeat([]byte("v"), 3000), 0))
	must(unix.Lsetxattr(filepath.Join(root, "sym"), "trusted.on-link", []byte("l"), 0))
	must(unix.Lchown(filepath.Join(root, "sym"), 7, 8))
	must(os.WriteFile(filepath.Join(root, "d/sub/ro"), []byte("ro"), 0o444))
	must(os.Chmod(filepath.Join(root, "d/sub"), 0o555)) // read-only directory with entries
	old := time.Date(2003, 4, 5, 6, 7, 8, 123456789, time.UTC)
	for _, p := range []string{"d/file", "empty", "d/sub", "d", "fifo", "sticky", "opaque"} {
		must(os.Chtimes(filepath.Join(root, p), old, old))
	}
	ts := []unix.Timespec{unix.NsecToTimespec(old.UnixNano()), unix.NsecToTimespec(old.UnixNano())}
	must(unix.UtimesNanoAt(unix.AT_FDCWD, filepath.Join(root, "sym"), ts, unix.AT_SYMLINK_NOFOLLOW))
}

// describe lists every attribute the copy must keep, per path, with hard
// links described as groups.
func describe(t *testing.T, root string) string {
	t.Helper()
	var lines []string
	groups := map[uint64][]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		line := fmt.Sprintf("%s type=%o perm=%o owner=%d:%d nlink=%d rdev=%d mtime=%d",
			rel, st.Mode&unix.S_IFMT, st.Mode&0o7777, st.Uid, st.Gid, st.Nlink, st.Rdev, st.Mtim.Nano())
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFREG:
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			line += fmt.Sprintf(" size=%d sum=%x", len(b), fnv(b))
			if st.Nlink > 1 {
				groups[st.Ino] = append(groups[st.Ino], rel)
			}
		case unix.S_IFLNK:
			target, _ := os.Readlink(p)
			line += " -> " + target
		}
		names := make([]byte, 4096)
		n, _ := unix.Llistxattr(p, names)
		var xs []string
		for _, name := range strings.Split(string(names[:n]), "\x00") {
			if name == "" {
				continue
			}
			v := make([]byte, 16384)
			m, err := unix.Lgetxattr(p, name, v)
			if err != nil {
				return err
			}
			xs = append(xs, fmt.Sprintf("%s=%x", name, fnv(v[:m])))
		}
		slices.Sort(xs)
		lines = append(lines, line+" xattrs="+strings.Join(xs, ","))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		slices.Sort(g)
		lines = append(lines, "hardlinks "+strings.Join(g, " "))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

func fnv(b []byte) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range b {
		h = (h ^ uint64(c)) * 1099511628211
	}
	return h
}

// Copy keeps everything cp -a --preserve=all keeps, checked against
// cp itself on the same tree.
func TestCopyTreeMatchesCpA(t *testing.T) {
	providertest.RequireRoot(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	makeTree(t, src)
	want := describe(t, src)

	st, err := Copy(context.Background(), src, filepath.Join(dir, "ours"))
	if err != nil {
		t.Fatal(err)
	}
	if got := describe(t, filepath.Join(dir, "ours")); got != want {
		t.Errorf("Copy differs from the source:\n got:\n%s\nwant:\n%s", got, want)
	}
	if st.Entries != 16 || st.Bytes != 1<<20+5+10+2 {
		t.Errorf("stats = %+v, want 16 entries and %d bytes", st, 1<<20+5+10+2)
	}
	out, err := exec.Command("cp", "-a", "--preserve=all", src, filepath.Join(dir, "cp")).CombinedOutput()
	if err != nil {
		t.Fatalf("cp -a: %v\n%s", err, out)
	}
	if got := describe(t, filepath.Join(dir, "cp")); got != want {
		t.Errorf("cp -a differs from the source (the test's oracle is off):\n%s", got)
	}
	if _, err := Copy(context.Background(), src, filepath.Join(dir, "ours")); err == nil {
		t.Error("copy onto an existing directory succeeded")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Copy(ctx, src, filepath.Join(dir, "cancelled")); err != context.Canceled {
		t.Errorf("cancelled copy: %v", err)
	}
}

// A value larger than the copier's buffer makes it grow the buffer.
func TestCopierGrowsXattrBuffer(t *testing.T) {
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	val := bytes.Repeat([]byte("x"), 3000)
	if err := unix.Lsetxattr(p, "user.big", val, 0); err != nil {
		t.Fatal(err)
	}
	c := &copier{buf: make([]byte, 1)}
	got, err := c.get(func(b []byte) (int, error) { return unix.Lgetxattr(p, "user.big", b) })
	if err != nil || !bytes.Equal(got, val) {
		t.Fatalf("get = %d bytes, %v", len(got), err)
	}
}

// Copying does not change the source, not even an access time (symbolic
// links aside: reading one updates its access time, and nothing reads it).
func TestCopyTreeLeavesSourceAlone(t *testing.T) {
	providertest.RequireRoot(t)
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	makeTree(t, src)
	var paths []string
	err := filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type()&fs.ModeSymlink == 0 {
			paths = append(paths, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	old := time.Date(2003, 4, 5, 6, 7, 8, 0, time.UTC)
	for _, p := range paths {
		if err := os.Chtimes(p, old, old); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := Copy(context.Background(), src, filepath.Join(dir, "dst")); err != nil {
		t.Fatal(err)
	}
	for _, p := range paths {
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Atim.Sec != old.Unix() {
			t.Errorf("copy changed the access time of %s to %d", p, st.Atim.Sec)
		}
	}
}
