//go:build linux

package overlay

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

// A working directory reached through a symbolic link of the base (an
// absolute one, /work -> /srv, and a relative one with "..", /var/run ->
// ../run) starts empty though the directory the link lands in holds the
// base's files: that directory is opaque in the upper layer, with the
// base's mode, the link stays the base's, the mark survives a snapshot
// and a fork, and the base is untouched.
func TestOverlayWorkdirThroughLink(t *testing.T) {
	base := t.TempDir()
	providertest.BusyboxLayer(t, base)
	providertest.WriteFile(t, filepath.Join(base, "srv/task/base.txt"), "base\n", 0o644)
	providertest.WriteFile(t, filepath.Join(base, "run/job/base.txt"), "base\n", 0o644)
	if err := os.Chmod(filepath.Join(base, "srv"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(base, "var"), 0o755); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"work": "/srv", "var/run": "../run"} {
		if err := os.Symlink(target, filepath.Join(base, link)); err != nil {
			t.Fatal(err)
		}
	}
	before := treeOf(t, base)
	ov := newOverlayOn(t, base)

	for _, c := range []struct{ id, workdir, link, lands string }{
		{"abs", "/work/task", "/work", "/srv/task"},
		{"rel", "/var/run/job", "/var/run", "/run/job"},
	} {
		providertest.Start(t, ov, provider.Spec{ID: c.id, Workdir: c.workdir,
			Files: map[string][]byte{c.workdir[1:] + "/seed.txt": []byte("seed\n")}})
		if got := providertest.Sh(t, ov, c.id, "ls -A; ls -A "+c.lands); got != "seed.txt\nseed.txt\n" {
			t.Fatalf("%s: the working directory %s (%s) holds %q, want only the spec's seed.txt", c.id, c.workdir, c.lands, got)
		}
		providertest.Sh(t, ov, c.id, "test -L "+c.link+" && echo mine > mine.txt")
		upper := filepath.Join(ov.dir(c.id), "upper")
		if providertest.Exists(filepath.Join(upper, c.link)) {
			t.Errorf("%s: the link %s was copied up; it should stay the base's", c.id, c.link)
		}
		snap := c.id + "-snap"
		providertest.Snapshot(t, ov, c.id, snap)
		fork := c.id + "-fork"
		providertest.Fork(t, ov, snap, provider.Spec{ID: fork, Workdir: c.workdir})
		if got := providertest.Sh(t, ov, fork, "ls -A"); got != "mine.txt\nseed.txt\n" {
			t.Errorf("%s: the fork's working directory holds %q, want mine.txt and seed.txt", c.id, got)
		}
		for _, u := range []string{upper, filepath.Join(ov.cfg.StateDir, "snapshots", snap, "upper"), filepath.Join(ov.dir(fork), "upper")} {
			if v, err := getxattr(u+c.lands, "trusted.overlay.opaque"); err != nil || v != "y" {
				t.Errorf("%s: opaque mark of %s in %s = %q, %v; want y", c.id, c.lands, u, v, err)
			}
		}
	}
	if fi, err := os.Stat(filepath.Join(ov.dir("abs"), "upper/srv")); err != nil || fi.Mode().Perm() != 0o750 {
		t.Errorf("the upper layer's /srv: %v, %v; want mode 0750 as in the base", fi, err)
	}
	if after := treeOf(t, base); !maps.Equal(after, before) {
		t.Errorf("the base changed:\nbefore: %v\nafter:  %v", before, after)
	}
}

// A working directory that lands on a file of the base, loops, or climbs
// out of the base through a link's ".." is refused, naming the path, and
// leaves nothing behind.
func TestOverlayWorkdirRefused(t *testing.T) {
	base := t.TempDir()
	providertest.WriteFile(t, filepath.Join(base, "srv/f.txt"), "f\n", 0o644)
	for link, target := range map[string]string{"file": "/srv/f.txt", "out": "../../etc", "srv/up": "../..", "loop": "/loop"} {
		if err := os.Symlink(target, filepath.Join(base, link)); err != nil {
			t.Fatal(err)
		}
	}
	ov := newOverlayOn(t, base)
	for workdir, want := range map[string]string{
		"/srv/f.txt":   "/srv/f.txt: not a directory",
		"/file/sub":    "/srv/f.txt: not a directory",
		"/out/x":       "/out -> ../../etc: symbolic link climbs out of the root",
		"/srv/up/etc":  "/srv/up -> ../..: symbolic link climbs out of the root",
		"/loop/inside": "/loop: more than 40 symbolic links (a loop)",
	} {
		sb, err := ov.Start(context.Background(), provider.Spec{ID: "bad", Workdir: workdir})
		if err == nil {
			t.Fatalf("Start with Workdir %s over a base where it is %s: started %s", workdir, want, sb.Root)
		}
		if !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), fmt.Sprintf("spec.Workdir %q", workdir)) ||
			!strings.Contains(err.Error(), want) {
			t.Errorf("Start with Workdir %s: %v; want ErrInvalid naming the workdir and %q", workdir, err, want)
		}
		if ids := ov.Sandboxes(); len(ids) != 0 || providertest.Exists(ov.dir("bad")) {
			t.Errorf("Start with Workdir %s failed but left %v, %s", workdir, ids, ov.dir("bad"))
		}
	}
}
