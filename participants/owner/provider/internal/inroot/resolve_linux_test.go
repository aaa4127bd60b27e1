//go:build linux

package inroot

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// linkTree builds a root with directories, a file and symbolic links of
// every kind Resolve meets.
func linkTree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for _, d := range []string{"srv/task", "run/job", "var"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "srv/task/f.txt"), []byte("f\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{
		"abs":      "/srv",
		"rel":      "srv",
		"var/run":  "../run",
		"var/lib":  "/srv/task",
		"chain":    "abs/task",
		"up":       "/srv/task/../../srv",
		"srv/back": "..",
		"fresh":    "srv/nope/../task",
		"dangling": "/srv/new/deeper",
		"loop1":    "loop2",
		"loop2":    "/loop1",
		"self":     "self",
		"out":      "../etc",
		"deepout":  "srv/../../x",
		"file":     "srv/task/f.txt",
	} {
		if err := os.Symlink(target, filepath.Join(root, link)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// Resolve follows links inside the root as a process rooted there does:
// where the path exists, the kernel's openat2(RESOLVE_IN_ROOT) lands in
// the same directory or fails the same way; a link whose ".." climbs
// above the root is refused, though the kernel stops at the root.
func TestResolve(t *testing.T) {
	root := linkTree(t)
	real, err := filepath.EvalSymlinks(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		p, want string
		err     error // nil: want is the answer
		missing bool  // the answer does not exist in root (yet)
	}{
		{p: "/", want: "/"},
		{p: "/srv/task", want: "/srv/task"},
		{p: "/abs/task", want: "/srv/task"},
		{p: "/rel/task", want: "/srv/task"},
		{p: "/var/run/job", want: "/run/job"},
		{p: "/var/lib", want: "/srv/task"},
		{p: "/chain", want: "/srv/task"},
		{p: "/up/task", want: "/srv/task"},
		{p: "/srv/back", want: "/"},
		{p: "/srv/back/srv/back/run", want: "/run"},
		{p: "/abs/missing/x", want: "/srv/missing/x", missing: true},
		{p: "/fresh", want: "/srv/task", missing: true}, // the kernel fails on nope/..
		{p: "/dangling", want: "/srv/new/deeper", missing: true},
		{p: "/loop1", err: unix.ELOOP},
		{p: "/self/x", err: unix.ELOOP},
		{p: "/out", err: ErrClimbsOut},
		{p: "/abs/../deepout/y", err: ErrClimbsOut},
		{p: "/file", err: unix.ENOTDIR},
		{p: "/file/x", err: unix.ENOTDIR},
		{p: "/srv/task/f.txt", err: unix.ENOTDIR},
	} {
		got, err := Resolve(root, c.p)
		if c.err != nil {
			if !errors.Is(err, c.err) {
				t.Errorf("Resolve(%s) = %q, %v; want %v", c.p, got, err, c.err)
			}
		} else if err != nil || got != c.want {
			t.Errorf("Resolve(%s) = %q, %v; want %q", c.p, got, err, c.want)
		}
		if c.missing || errors.Is(c.err, ErrClimbsOut) {
			continue
		}
		kgot, kerr := kernelResolve(real, c.p)
		if c.err != nil {
			if !errors.Is(kerr, c.err) {
				t.Errorf("the kernel resolves %s to %q, %v; want %v as Resolve", c.p, kgot, kerr, c.err)
			}
		} else if kerr != nil || kgot != c.want {
			t.Errorf("the kernel resolves %s to %q, %v; Resolve to %q", c.p, kgot, kerr, c.want)
		}
	}
}

// An error names the path inside the root, and for a link that climbs
// out, the link and its target.
func TestResolveErrorsNamePaths(t *testing.T) {
	root := linkTree(t)
	for p, want := range map[string]string{
		"/file":   "/srv/task/f.txt:",
		"/out/a":  "/out -> ../etc:",
		"/loop1":  "/loop",
		"/self/y": "/self:",
	} {
		if _, err := Resolve(root, p); err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), root) {
			t.Errorf("Resolve(%s): %v; want an error naming %q, not the host's %s", p, err, want, root)
		}
	}
}

// kernelResolve opens p under root with RESOLVE_IN_ROOT and returns where
// it landed, inside root.
func kernelResolve(root, p string) (string, error) {
	rfd, err := unix.Open(root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", err
	}
	defer unix.Close(rfd)
	fd, err := unix.Openat2(rfd, p, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	at, err := os.Readlink(fmt.Sprintf("/proc/self/fd/%d", fd))
	if err != nil {
		return "", err
	}
	if at == root {
		return "/", nil
	}
	rel, ok := strings.CutPrefix(at, root+"/")
	if !ok {
		return "", fmt.Errorf("%s landed at %s, outside %s", p, at, root)
	}
	return "/" + rel, nil
}
