//go:build linux

package providertest

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/procs"
)

// RequireRoot fails (never skips) a test that needs root, with a hint.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("this test needs root (overlay mounts, namespaces, cgroup v2): run it as root, e.g. sudo -E go test ./participants/owner/provider/...")
	}
	for _, tool := range []string{"nsenter", "sh", "cp"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: install util-linux and coreutils (apt-get install util-linux coreutils)", tool)
		}
	}
}

// Cleanup stops what p still lists, deletes every snapshot, and checks
// that nothing is left; a provider's test helper registers it.
func Cleanup(t testing.TB, p provider.Provider) {
	t.Helper()
	ctx := context.Background()
	for _, id := range p.Sandboxes() {
		if err := p.Stop(ctx, id); err != nil {
			t.Errorf("cleanup: stop %s: %v", id, err)
		}
	}
	snaps, err := p.Snapshots()
	if err != nil {
		t.Errorf("cleanup: snapshots: %v", err)
	}
	for _, id := range snaps {
		if err := p.DeleteSnapshot(ctx, id); err != nil {
			t.Errorf("cleanup: delete snapshot %s: %v", id, err)
		}
	}
	if left := p.Sandboxes(); len(left) > 0 {
		t.Errorf("sandboxes left: %v", left)
	}
	if left, _ := p.Snapshots(); len(left) > 0 {
		t.Errorf("snapshots left: %v", left)
	}
}

// CheckNoMounts fails the test if anything is mounted at or below dir.
func CheckNoMounts(t testing.TB, dir string) {
	t.Helper()
	ms, err := procfs.Mounts()
	if err != nil {
		t.Fatal(err)
	}
	var under []string
	for _, m := range ms {
		if m.Point == dir || strings.HasPrefix(m.Point, dir+"/") {
			under = append(under, m.Point)
		}
	}
	if len(under) > 0 {
		t.Errorf("mounts left under %s: %v", dir, under)
	}
}

// CheckStopped checks that nothing of a stopped sandbox is left: its init,
// every pid in pids, its cgroup, its directory and any mount under it.
func CheckStopped(t testing.TB, sb *provider.Sandbox, pids ...int) {
	t.Helper()
	for _, pid := range append([]int{sb.InitPID}, pids...) {
		if procs.Alive(pid) {
			t.Errorf("sandbox %s: process %d still alive after Stop", sb.ID, pid)
		}
	}
	if sb.Cgroup != "" {
		if _, err := os.Lstat(sb.Cgroup); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("sandbox %s: cgroup %s still there (%v)", sb.ID, sb.Cgroup, err)
		}
	}
	if sb.Root == "" {
		return // a guest's disk (microvm): its own cleanup checks the rest
	}
	dir := filepath.Dir(sb.Root)
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("sandbox %s: directory %s still there (%v)", sb.ID, dir, err)
	}
	CheckNoMounts(t, dir)
}

// Sh runs a shell script in the sandbox and fails the test unless it
// exits 0; it returns stdout.
func Sh(t testing.TB, p provider.Provider, id, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := p.Exec(ctx, id, []string{"sh", "-c", script}, provider.ExecOptions{})
	if err != nil {
		t.Fatalf("exec in %s: %v", id, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exec in %s: exit %d\nscript: %s\nstdout: %s\nstderr: %s", id, res.ExitCode, script, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

// Start starts spec on p or fails the test.
func Start(t testing.TB, p provider.Provider, spec provider.Spec) *provider.Sandbox {
	t.Helper()
	sb, err := p.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("start %s: %v", spec.ID, err)
	}
	return sb
}

// Fork forks snap into spec on p or fails the test.
func Fork(t testing.TB, p provider.Provider, snap string, spec provider.Spec) *provider.Sandbox {
	t.Helper()
	sb, err := p.Fork(context.Background(), snap, spec)
	if err != nil {
		t.Fatalf("fork %s from %s: %v", spec.ID, snap, err)
	}
	return sb
}

// Snapshot snapshots sandbox id as snap on p or fails the test.
func Snapshot(t testing.TB, p provider.Provider, id, snap string) provider.Snapshot {
	t.Helper()
	s, err := p.Snapshot(context.Background(), id, snap)
	if err != nil {
		t.Fatalf("snapshot %s of %s: %v", snap, id, err)
	}
	return s
}

// Stop stops sb on p and checks (CheckStopped) that nothing of it, nor
// any of pids, is left.
func Stop(t testing.TB, p provider.Provider, sb *provider.Sandbox, pids ...int) {
	t.Helper()
	if err := p.Stop(context.Background(), sb.ID); err != nil {
		t.Fatalf("stop %s: %v", sb.ID, err)
	}
	CheckStopped(t, sb, pids...)
}

// ReadFile returns the file at path or fails the test.
func ReadFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Exists reports whether something is at path (a link is not followed).
func Exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
