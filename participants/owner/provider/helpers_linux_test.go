//go:build linux

package provider

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/internal/leak"
)

func TestMain(m *testing.M) {
	if state := os.Getenv(microvmOwnerEnv); state != "" {
		os.Exit(microvmOwnerMain(state))
	}
	leak.VerifyTestMain(m)
}

// requireRoot fails (never skips) a test that needs root, with a hint.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("this test needs root (overlay mounts, namespaces, cgroup v2): run it as root, e.g. sudo -E go test ./participants/owner/provider/")
	}
	for _, tool := range []string{"nsenter", "sh", "cp"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: install util-linux and coreutils (apt-get install util-linux coreutils)", tool)
		}
	}
}

// newOverlay returns an overlay provider with its own state dir and its
// own cgroup parent, and registers a cleanup that stops what is left,
// deletes every snapshot and then checks that nothing is left anywhere.
func newOverlay(t testing.TB) *Overlay {
	t.Helper()
	requireRoot(t)
	cgMount, err := cgroup.Mount()
	if err != nil {
		t.Fatal(err)
	}
	parent := filepath.Join(cgMount, DefaultCgroupParentName, fmt.Sprintf("test-%d-%d", os.Getpid(), rand.Uint32()))
	ov, err := NewOverlay(OverlayConfig{StateDir: t.TempDir(), CgroupParent: parent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cleanupProvider(t, ov)
		checkNoMounts(t, ov.cfg.StateDir)
		if err := os.Remove(parent); err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("cgroup parent %s not empty after the test: %v", parent, err)
		}
	})
	return ov
}

// newDir returns a dir provider with its own state dir and the same
// cleanup as newOverlay.
func newDir(t testing.TB) *Dir {
	t.Helper()
	d, err := NewDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cleanupProvider(t, d) })
	return d
}

func cleanupProvider(t testing.TB, p Provider) {
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

func checkNoMounts(t testing.TB, dir string) {
	t.Helper()
	ms, err := mountsUnder(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) > 0 {
		t.Errorf("mounts left under %s: %v", dir, ms)
	}
}

// checkStopped checks that nothing of a stopped sandbox is left: its init,
// every pid in pids, its cgroup, its directory and any mount under it.
func checkStopped(t testing.TB, sb *Sandbox, pids ...int) {
	t.Helper()
	for _, pid := range append([]int{sb.InitPID}, pids...) {
		if alive(pid) {
			t.Errorf("sandbox %s: process %d still alive after Stop", sb.ID, pid)
		}
	}
	if sb.Cgroup != "" {
		if _, err := os.Lstat(sb.Cgroup); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("sandbox %s: cgroup %s still there (%v)", sb.ID, sb.Cgroup, err)
		}
	}
	if sb.Root == "" {
		return // a guest's disk (microvm): cleanupMicroVM checks the rest
	}
	dir := filepath.Dir(sb.Root)
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("sandbox %s: directory %s still there (%v)", sb.ID, dir, err)
	}
	checkNoMounts(t, dir)
}

// run runs a shell script in the sandbox and fails the test unless it
// exits 0; it returns stdout.
func run(t testing.TB, p Provider, id, script string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := p.Exec(ctx, id, []string{"sh", "-c", script}, ExecOptions{})
	if err != nil {
		t.Fatalf("exec in %s: %v", id, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("exec in %s: exit %d\nscript: %s\nstdout: %s\nstderr: %s", id, res.ExitCode, script, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

func start(t testing.TB, p Provider, spec Spec) *Sandbox {
	t.Helper()
	sb, err := p.Start(context.Background(), spec)
	if err != nil {
		t.Fatalf("start %s: %v", spec.ID, err)
	}
	return sb
}

func fork(t testing.TB, p Provider, snap string, spec Spec) *Sandbox {
	t.Helper()
	sb, err := p.Fork(context.Background(), snap, spec)
	if err != nil {
		t.Fatalf("fork %s from %s: %v", spec.ID, snap, err)
	}
	return sb
}

func snapshot(t testing.TB, p Provider, id, snap string) Snapshot {
	t.Helper()
	s, err := p.Snapshot(context.Background(), id, snap)
	if err != nil {
		t.Fatalf("snapshot %s of %s: %v", snap, id, err)
	}
	return s
}

func stop(t testing.TB, p Provider, sb *Sandbox, pids ...int) {
	t.Helper()
	if err := p.Stop(context.Background(), sb.ID); err != nil {
		t.Fatalf("stop %s: %v", sb.ID, err)
	}
	checkStopped(t, sb, pids...)
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// cgroupPids lists the pids in a cgroup and its children.
func cgroupPids(t testing.TB, cg string) []int {
	t.Helper()
	pids, err := cgroup.Dir(cg).AllProcs()
	if err != nil {
		t.Fatal(err)
	}
	return pids
}
