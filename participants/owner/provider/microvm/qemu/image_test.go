package qemu

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"
)

// An image is the same bytes for the same tree and id, and once at its
// path it is never replaced: a guest booted on it (a warm template) keeps
// the file system's checksums, seeded from its UUID, in its RAM, and a
// second build of the same image by another process beside the first
// must not put other bytes under it.
func TestExt4ImageIsFixedOnceThere(t *testing.T) {
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		t.Fatal("mkfs.ext4 not found: apt-get install -y --no-install-recommends e2fsprogs")
	}
	tree := filepath.Join(t.TempDir(), "tree")
	if err := os.MkdirAll(filepath.Join(tree, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tree, "bin", "harness"), bytes.Repeat([]byte("x"), 100<<10), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	out := t.TempDir()
	build := func(dst, id string) {
		t.Helper()
		if err := Ext4Image(ctx, mkfs, tree, dst, "sp-test", id, 8<<20); err != nil {
			t.Fatal(err)
		}
	}
	ino := func(p string) uint64 {
		t.Helper()
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		return fi.Sys().(*syscall.Stat_t).Ino
	}
	a, b, other := filepath.Join(out, "a.ext4"), filepath.Join(out, "b.ext4"), filepath.Join(out, "other.ext4")
	// The tree's files were just written, so a build's reads move their
	// access times (relatime); with a second between the builds, an image
	// that copied them would differ (a loaded CI machine found this).
	time.Sleep(1100 * time.Millisecond)
	build(a, "tree-1")
	time.Sleep(1100 * time.Millisecond)
	build(b, "tree-1")
	build(other, "tree-2")
	ab, _ := os.ReadFile(a)
	bb, _ := os.ReadFile(b)
	ob, _ := os.ReadFile(other)
	if !bytes.Equal(ab, bb) {
		t.Error("two images of the same tree and id differ")
	}
	if bytes.Equal(ab, ob) {
		t.Error("images of two ids are the same bytes: the UUID does not follow the id")
	}

	// Builds of an image already there, one after another and several at
	// once, leave the first one's file in place.
	first := ino(a)
	build(a, "tree-1")
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			if err := Ext4Image(ctx, mkfs, tree, a, "sp-test", "tree-1", 8<<20); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if ino(a) != first {
		t.Error("a build of an image already there replaced its file")
	}
	if left, _ := filepath.Glob(filepath.Join(out, ".tmp-*")); len(left) > 0 {
		t.Errorf("builds left %v", left)
	}
}
