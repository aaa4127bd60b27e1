//go:build linux

package overlay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/procs"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

// The main path: a file written inside lands in Root and in upper, a
// snapshot holds it, a later write does not reach the snapshot, and a fork
// starts from the snapshot.
func TestOverlaySnapshotFork(t *testing.T) {
	ov := newOverlay(t)
	a := providertest.Start(t, ov, provider.Spec{ID: "a", Workdir: "/srv/task", Files: map[string][]byte{"srv/task/seed.txt": []byte("seed\n")}})
	if a.Workdir != "/srv/task" || a.InitPID <= 0 || a.Cgroup == "" {
		t.Fatalf("sandbox = %+v", a)
	}
	if got := providertest.Sh(t, ov, "a", "pwd; cat seed.txt; echo one > one.txt"); got != "/srv/task\nseed\n" {
		t.Fatalf("pwd and seed = %q", got)
	}
	if got := providertest.ReadFile(t, filepath.Join(a.Root, "srv/task/one.txt")); got != "one\n" {
		t.Fatalf("one.txt in Root = %q", got)
	}
	upper := filepath.Join(filepath.Dir(a.Root), "upper")
	if got := providertest.ReadFile(t, filepath.Join(upper, "srv/task/one.txt")); got != "one\n" {
		t.Fatalf("one.txt in upper = %q", got)
	}

	s := providertest.Snapshot(t, ov, "a", "s1")
	if s.ID != "s1" || s.Files < 3 || s.Size < 9 || s.Took <= 0 {
		t.Errorf("snapshot = %+v", s)
	}
	if _, err := ov.Snapshot(context.Background(), "a", "s1"); !errors.Is(err, provider.ErrExists) {
		t.Errorf("second snapshot s1: err = %v, want ErrExists", err)
	}
	providertest.Sh(t, ov, "a", "echo two > two.txt; echo changed > one.txt")
	// The sandbox runs on after its snapshot: it was thawed.
	if ev, _ := cgroup.Dir(a.Cgroup).Events(); ev.Frozen {
		t.Error("sandbox still frozen after Snapshot")
	}

	b := providertest.Fork(t, ov, "s1", provider.Spec{ID: "b", Workdir: "/srv/task"})
	if got := providertest.Sh(t, ov, "b", "cat one.txt seed.txt; test ! -e two.txt && echo no-two"); got != "one\nseed\nno-two\n" {
		t.Fatalf("fork sees %q", got)
	}
	// The fork is a sandbox of its own: its writes do not reach a.
	providertest.Sh(t, ov, "b", "echo fork > three.txt")
	if providertest.Exists(filepath.Join(a.Root, "srv/task/three.txt")) {
		t.Error("fork's write visible in the original")
	}
	if got, _ := ov.Snapshots(); !slices.Equal(got, []string{"s1"}) {
		t.Errorf("Snapshots() = %v", got)
	}
	if got := ov.Sandboxes(); !slices.Equal(got, []string{"a", "b"}) {
		t.Errorf("Sandboxes() = %v", got)
	}
	providertest.Stop(t, ov, a)
	providertest.Stop(t, ov, b)
	if err := ov.Stop(context.Background(), "a"); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	if err := ov.DeleteSnapshot(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
	if err := ov.DeleteSnapshot(context.Background(), "s1"); err != nil {
		t.Errorf("second DeleteSnapshot: %v", err)
	}
	if _, err := ov.Fork(context.Background(), "s1", provider.Spec{ID: "c"}); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("fork of a deleted snapshot: err = %v, want ErrNotFound", err)
	}
	if left := ov.Sandboxes(); len(left) > 0 {
		t.Errorf("failed fork left %v", left)
	}
}

// Deleting an image file leaves a whiteout, replacing an image directory
// leaves an opaque directory; both survive snapshot and fork.
func TestOverlayWhiteoutAndOpaqueDir(t *testing.T) {
	ov := newOverlay(t)
	file := firstExisting(t, "/etc/hostname", "/etc/issue", "/etc/debian_version", "/etc/passwd")
	dir := ""
	for _, d := range []string{"/etc/skel", "/etc/default", "/etc/profile.d", "/etc/apt"} {
		if ents, err := os.ReadDir(d); err == nil && len(ents) > 0 {
			dir = d
			break
		}
	}
	if dir == "" {
		t.Fatal("no non-empty directory in the image to replace (looked in /etc)")
	}
	providertest.Start(t, ov, provider.Spec{ID: "wo"})
	providertest.Sh(t, ov, "wo", "rm "+file+" && rm -rf "+dir+" && mkdir "+dir+" && echo x > "+dir+"/only")
	providertest.Snapshot(t, ov, "wo", "wo-snap")

	snapUpper := filepath.Join(ov.cfg.StateDir, "snapshots", "wo-snap", "upper")
	var st unix.Stat_t
	if err := unix.Lstat(snapUpper+file, &st); err != nil {
		t.Fatal(err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("whiteout for %s in the snapshot: mode %o rdev %d, want a char device 0/0", file, st.Mode, st.Rdev)
	}
	if v, err := getxattr(snapUpper+dir, "trusted.overlay.opaque"); err != nil || v != "y" {
		t.Errorf("opaque xattr of %s in the snapshot = %q, %v", dir, v, err)
	}

	providertest.Fork(t, ov, "wo-snap", provider.Spec{ID: "wo-fork"})
	out := providertest.Sh(t, ov, "wo-fork", "test -e "+file+" && echo present || echo deleted; ls -A "+dir)
	if out != "deleted\nonly\n" {
		t.Errorf("fork sees %q, want the file deleted and only the new entry in %s", out, dir)
	}
	if !providertest.Exists(file) {
		t.Errorf("the host's %s was deleted", file)
	}
}

// A sandbox's working directory starts empty even where the base (the
// host's root) has a directory of that path with files in it, and stays
// so in a fork: the host's files never show through.
func TestOverlayWorkdirStartsEmpty(t *testing.T) {
	ov := newOverlay(t)
	// A directory of the base, with a file: not under /tmp, which the
	// sandbox mounts afresh.
	host, err := os.MkdirTemp("/var/tmp", "stillpoint-workdir-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(host) })
	if err := os.WriteFile(filepath.Join(host, "host.txt"), []byte("host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	providertest.Start(t, ov, provider.Spec{ID: "wd", Workdir: host, Files: map[string][]byte{host[1:] + "/seed.txt": []byte("seed\n")}})
	if got := providertest.Sh(t, ov, "wd", "ls -A"); got != "seed.txt\n" {
		t.Fatalf("the working directory holds %q, want only the spec's seed.txt", got)
	}
	// Its parent keeps the base's mode, sticky bit included.
	if got, want := providertest.Sh(t, ov, "wd", "stat -c %a "+filepath.Dir(host)), "1777\n"; got != want {
		t.Errorf("the parent %s's mode in the sandbox is %q, want %q as on the host", filepath.Dir(host), got, want)
	}
	providertest.Sh(t, ov, "wd", "echo mine > mine.txt")
	providertest.Snapshot(t, ov, "wd", "wd-snap")
	providertest.Fork(t, ov, "wd-snap", provider.Spec{ID: "wd-fork", Workdir: host})
	if got := providertest.Sh(t, ov, "wd-fork", "ls -A"); got != "mine.txt\nseed.txt\n" {
		t.Fatalf("the fork's working directory holds %q, want mine.txt and seed.txt", got)
	}
	if got := providertest.ReadFile(t, filepath.Join(host, "host.txt")); got != "host\n" {
		t.Errorf("the host's file now reads %q", got)
	}
	if providertest.Exists(filepath.Join(host, "mine.txt")) {
		t.Error("the sandbox's write reached the host")
	}
}

// Hard links, a symbolic link, an xattr, a setuid mode, an owner and a
// modification time survive snapshot and fork.
func TestOverlayAttributesSurvive(t *testing.T) {
	ov := newOverlay(t)
	a := providertest.Start(t, ov, provider.Spec{ID: "attrs", Workdir: "/data"})
	providertest.Sh(t, ov, "attrs", `echo body > a && ln a b && ln a c && ln -s a sym && ln -s /nowhere dangling &&
		chown 1234:2345 a && chmod 4750 a && touch -h -d '2001-02-03 04:05:06' a sym && mkfifo fifo`)
	if err := unix.Lsetxattr(filepath.Join(a.Root, "data/a"), "user.stillpoint", []byte("kept"), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Lsetxattr(filepath.Join(a.Root, "data/sym"), "trusted.stillpoint", []byte("on-link"), 0); err != nil {
		t.Fatal(err)
	}
	providertest.Snapshot(t, ov, "attrs", "attrs-snap")
	b := providertest.Fork(t, ov, "attrs-snap", provider.Spec{ID: "attrs-fork", Workdir: "/data"})
	// Check both the snapshot's copy and what the fork sees.
	for _, root := range []string{
		filepath.Join(ov.cfg.StateDir, "snapshots", "attrs-snap", "upper", "data"),
		filepath.Join(b.Root, "data"),
	} {
		var sa, sb, sc unix.Stat_t
		for p, st := range map[string]*unix.Stat_t{"a": &sa, "b": &sb, "c": &sc} {
			if err := unix.Lstat(filepath.Join(root, p), st); err != nil {
				t.Fatal(err)
			}
		}
		if sa.Ino != sb.Ino || sa.Ino != sc.Ino || sa.Nlink != 3 {
			t.Errorf("%s: a, b, c inodes %d %d %d nlink %d, want one inode with 3 links", root, sa.Ino, sb.Ino, sc.Ino, sa.Nlink)
		}
		if sa.Mode&0o7777 != 0o4750 || sa.Uid != 1234 || sa.Gid != 2345 {
			t.Errorf("%s: a mode %o owner %d:%d", root, sa.Mode&0o7777, sa.Uid, sa.Gid)
		}
		want := time.Date(2001, 2, 3, 4, 5, 6, 0, time.Local).Unix()
		if sa.Mtim.Sec != want {
			t.Errorf("%s: a mtime %d, want %d", root, sa.Mtim.Sec, want)
		}
		if target, err := os.Readlink(filepath.Join(root, "sym")); err != nil || target != "a" {
			t.Errorf("%s: sym -> %q, %v", root, target, err)
		}
		if target, err := os.Readlink(filepath.Join(root, "dangling")); err != nil || target != "/nowhere" {
			t.Errorf("%s: dangling -> %q, %v", root, target, err)
		}
		var sl unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, "sym"), &sl); err != nil || sl.Mtim.Sec != want {
			t.Errorf("%s: sym mtime %d, want %d (%v)", root, sl.Mtim.Sec, want, err)
		}
		if v, err := getxattr(filepath.Join(root, "a"), "user.stillpoint"); err != nil || v != "kept" {
			t.Errorf("%s: xattr of a = %q, %v", root, v, err)
		}
		if v, err := getxattr(filepath.Join(root, "sym"), "trusted.stillpoint"); err != nil || v != "on-link" {
			t.Errorf("%s: xattr of sym = %q, %v", root, v, err)
		}
		var sf unix.Stat_t
		if err := unix.Lstat(filepath.Join(root, "fifo"), &sf); err != nil || sf.Mode&unix.S_IFMT != unix.S_IFIFO {
			t.Errorf("%s: fifo mode %o, %v", root, sf.Mode, err)
		}
	}
	// Through the fork, the hard links are still one file.
	if got := providertest.Sh(t, ov, "attrs-fork", "echo more >> b; cat c"); got != "body\nmore\n" {
		t.Errorf("write through b, read c = %q", got)
	}
}

// The sandbox's first process is pid 1 of its own PID namespace; the
// sandbox sees its own processes only, its own hostname, and none of the
// host's mounts (not even another sandbox's overlay).
func TestOverlayNamespaces(t *testing.T) {
	ov := newOverlay(t)
	idle := providertest.Start(t, ov, provider.Spec{ID: "idle"})
	withInit := providertest.Start(t, ov, provider.Spec{ID: "slept", Init: []string{"sleep", "infinity"}})

	for _, c := range []struct {
		sb      *provider.Sandbox
		cmdline string
	}{{idle, initArg0}, {withInit, "sleep infinity"}} {
		out := providertest.Sh(t, ov, c.sb.ID, `hostname; tr '\0' ' ' < /proc/1/cmdline; echo; for p in /proc/[0-9]*; do echo "${p#/proc/}"; done`)
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if lines[0] != c.sb.ID {
			t.Errorf("%s: hostname %q", c.sb.ID, lines[0])
		}
		if got := strings.TrimSpace(lines[1]); got != c.cmdline {
			t.Errorf("%s: pid 1 is %q, want %q", c.sb.ID, got, c.cmdline)
		}
		pids := lines[2:]
		if !slices.Contains(pids, "1") || len(pids) > 4 {
			t.Errorf("%s: processes visible inside: %v, want pid 1 and the shell", c.sb.ID, pids)
		}
		for _, p := range pids {
			if n, _ := strconv.Atoi(p); n > 64 {
				t.Errorf("%s: sees pid %d, not a pid of its own namespace", c.sb.ID, n)
			}
		}
	}
	mounts := providertest.Sh(t, ov, "slept", "cat /proc/self/mountinfo")
	if strings.Contains(mounts, idle.Root) {
		t.Errorf("sandbox slept holds the other sandbox's overlay:\n%s", mounts)
	}
	for _, m := range []string{" / ", " /proc ", " /tmp ", " /dev ", " /sys ", " " + ov.cgMount + " "} {
		if !strings.Contains(mounts, m) {
			t.Errorf("no mount on %s inside:\n%s", m, mounts)
		}
	}
	if got := providertest.Sh(t, ov, "idle", "echo hi > /dev/null && stat -c %t:%T /dev/null && stat -f -c %T /tmp"); got != "1:3\ntmpfs\n" {
		t.Errorf("/dev/null and /tmp inside: %q", got)
	}
}

// The sandbox sees its own cgroup as the root of the v2 hierarchy and can
// do there what sandboxd does: make a child cgroup, move a process into
// it, freeze it and see it frozen. Stop then kills the frozen process and
// removes the child cgroup too.
func TestOverlayCgroupDelegation(t *testing.T) {
	ov := newOverlay(t)
	sb := providertest.Start(t, ov, provider.Spec{ID: "cg"})
	mp := ov.cgMount
	script := `set -e
cat /proc/self/cgroup | grep '^0::'
test -e ` + mp + `/cgroup.freeze && echo own-root
test ! -e ` + mp + `/` + DefaultCgroupParentName + ` && echo host-hidden
mkdir ` + mp + `/launch
sleep 1000 </dev/null >/dev/null 2>&1 &
echo $! > ` + mp + `/launch/cgroup.procs
echo 1 > ` + mp + `/launch/cgroup.freeze
i=0
until grep -q 'frozen 1' ` + mp + `/launch/cgroup.events; do i=$((i+1)); test $i -lt 500; sleep 0.01; done
echo frozen
echo $!`
	out := strings.Fields(providertest.Sh(t, ov, "cg", script))
	if len(out) != 5 || out[0] != "0::/" || out[1] != "own-root" || out[2] != "host-hidden" || out[3] != "frozen" {
		t.Fatalf("inside: %q", out)
	}
	// From the host: the child is under the sandbox's cgroup, frozen.
	child := cgroup.Dir(sb.Cgroup).Child("launch")
	if ev, err := child.Events(); err != nil || !ev.Frozen {
		t.Fatalf("host view of %s: frozen %v, %v", child, ev.Frozen, err)
	}
	pids := cgroupPids(t, string(child))
	if len(pids) != 1 {
		t.Fatalf("pids in %s: %v", child, pids)
	}
	providertest.Stop(t, ov, sb, pids...)
}

// Stop kills a daemon that left the session and process group of the
// command that started it.
func TestOverlayStopKillsDaemon(t *testing.T) {
	ov := newOverlay(t)
	sb := providertest.Start(t, ov, provider.Spec{ID: "daemon"})
	providertest.Sh(t, ov, "daemon", `setsid sh -c 'sleep 1000 & sleep 1001 & wait' </dev/null >/dev/null 2>&1 &`)
	var pids []int
	poll.Wait(t, 10*time.Second, "the daemon's processes", func() bool {
		pids = cgroupPids(t, sb.Cgroup)
		return len(pids) >= 4 // init, setsid sh, two sleeps
	})
	providertest.Stop(t, ov, sb, pids...)
}

// Stop while an Exec runs: the Exec returns ErrExited (the sandbox went
// under the command, which gave no answer of its own), and nothing is left.
func TestOverlayStopDuringExec(t *testing.T) {
	ov := newOverlay(t)
	sb := providertest.Start(t, ov, provider.Spec{ID: "busy"})
	done := make(chan error, 1)
	go func() {
		res, err := ov.Exec(context.Background(), "busy", []string{"sh", "-c", "sleep 1000 & sleep 1001"}, provider.ExecOptions{})
		if !errors.Is(err, provider.ErrExited) {
			err = fmt.Errorf("%+v, %v; want ErrExited", res, err)
		} else {
			err = nil
		}
		done <- err
	}()
	var pids []int
	poll.Wait(t, 10*time.Second, "the command to start", func() bool {
		pids = cgroupPids(t, sb.Cgroup)
		return len(pids) >= 4 // init, nsenter, sh, two sleeps
	})
	providertest.Stop(t, ov, sb, pids...)
	if err := <-done; err != nil {
		t.Errorf("exec during Stop: %v", err)
	}
}

// Exec reports exit codes, passes stdin, env and dir, and when its context
// ends it kills what it started and returns.
func TestOverlayExec(t *testing.T) {
	ov := newOverlay(t)
	sb := providertest.Start(t, ov, provider.Spec{ID: "ex", Env: []string{"FOO=spec"}})
	ctx := context.Background()
	res, err := ov.Exec(ctx, "ex", []string{"sh", "-c", `read x; echo "$x $FOO $BAR"; pwd; echo err >&2; exit 3`},
		provider.ExecOptions{Dir: "/tmp", Env: []string{"BAR=opt"}, Stdin: strings.NewReader("in\n")})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "in spec opt\n/tmp\n" || string(res.Stderr) != "err\n" || res.ExitCode != 3 {
		t.Errorf("result = %q %q %d", res.Stdout, res.Stderr, res.ExitCode)
	}
	res, err = ov.Exec(ctx, "ex", []string{"sh", "-c", "kill -9 $$"}, provider.ExecOptions{})
	if err != nil || res.ExitCode != 128+9 {
		t.Errorf("killed command: exit %d, %v", res.ExitCode, err)
	}
	if _, err := ov.Exec(ctx, "nope", []string{"true"}, provider.ExecOptions{}); !errors.Is(err, provider.ErrNotFound) {
		t.Errorf("exec in unknown sandbox: %v", err)
	}

	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := ov.Exec(cctx, "ex", []string{"sh", "-c", "sleep 1000 & sleep 1001"}, provider.ExecOptions{})
		done <- err
	}()
	poll.Wait(t, 10*time.Second, "the command to start", func() bool { return len(cgroupPids(t, sb.Cgroup)) >= 4 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled exec: %v", err)
	}
	poll.Wait(t, 10*time.Second, "only init to remain", func() bool { return len(cgroupPids(t, sb.Cgroup)) == 1 })
	providertest.Stop(t, ov, sb)
}

// A Start that fails leaves nothing behind, and says why.
func TestOverlayStartFailureLeavesNothing(t *testing.T) {
	ov := newOverlay(t)
	_, err := ov.Start(context.Background(), provider.Spec{ID: "bad", Init: []string{"/no/such/program"}})
	if err == nil || !strings.Contains(err.Error(), "/no/such/program") {
		t.Fatalf("start with a missing init: %v", err)
	}
	if left := ov.Sandboxes(); len(left) > 0 {
		t.Errorf("sandboxes left: %v", left)
	}
	providertest.CheckStopped(t, &provider.Sandbox{ID: "bad", Root: filepath.Join(ov.dir("bad"), "merged"), Cgroup: string(ov.cgroup("bad"))})
	// The id is free again.
	sb := providertest.Start(t, ov, provider.Spec{ID: "bad"})
	providertest.Stop(t, ov, sb)
}

// A sandbox left by an earlier process (a second provider on the same
// state) is listed and stopped.
func TestOverlayStopsLeftovers(t *testing.T) {
	ov := newOverlay(t)
	sb := providertest.Start(t, ov, provider.Spec{ID: "orphan"})
	again, err := New(ov.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := again.Sandboxes(); !slices.Equal(got, []string{"orphan"}) {
		t.Fatalf("second provider lists %v", got)
	}
	if _, err := again.Start(context.Background(), provider.Spec{ID: "orphan"}); !errors.Is(err, provider.ErrExists) {
		t.Errorf("start over a leftover: %v", err)
	}
	if err := again.Stop(context.Background(), "orphan"); err != nil {
		t.Fatal(err)
	}
	providertest.CheckStopped(t, sb)
	// The first provider's Stop is now a no-op that still confirms.
	providertest.Stop(t, ov, sb)
}

func firstExisting(t *testing.T, paths ...string) string {
	t.Helper()
	for _, p := range paths {
		if fi, err := os.Lstat(p); err == nil && fi.Mode().IsRegular() {
			return p
		}
	}
	t.Fatalf("none of %v is a regular file in the image", paths)
	return ""
}

func getxattr(path, name string) (string, error) {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(path, name, buf)
	if err != nil {
		return "", err
	}
	return string(bytes.TrimRight(buf[:n], "\x00")), nil
}

// When the init exits by itself, Exec refuses (its namespaces are gone,
// and its pid must never be used to enter another process's), and Stop
// still cleans up.
func TestOverlayInitExited(t *testing.T) {
	ov := newOverlay(t)
	sb := providertest.Start(t, ov, provider.Spec{ID: "short", Init: []string{"sh", "-c", "read x"}}) // stdin is /dev/null: exits at once
	poll.Wait(t, 10*time.Second, "the init to exit", func() bool { return !procs.Alive(sb.InitPID) })
	poll.Wait(t, 10*time.Second, "InitExited to tell", func() bool { return ov.InitExited("short") })
	if ov.InitExited("unknown") {
		t.Error("InitExited of a sandbox the provider does not know: true")
	}
	poll.Wait(t, 10*time.Second, "Exec to refuse", func() bool {
		_, err := ov.Exec(context.Background(), "short", []string{"true"}, provider.ExecOptions{})
		return errors.Is(err, provider.ErrExited)
	})
	providertest.Stop(t, ov, sb)
}

// When the init dies while a command runs (a sandbox daemon killed), the
// command is killed with the namespace: Exec reports ErrExited, not the
// killed command's exit and empty output, which a grade would score as
// the sandbox's answer.
func TestOverlayInitDiesUnderExec(t *testing.T) {
	ov := newOverlay(t)
	sb := providertest.Start(t, ov, provider.Spec{ID: "dies"})
	type answer struct {
		res provider.ExecResult
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := ov.Exec(context.Background(), "dies", []string{"sh", "-c", "echo started > /started; exec sleep 60"}, provider.ExecOptions{})
		done <- answer{res, err}
	}()
	poll.Wait(t, 10*time.Second, "the command to start", func() bool {
		res, err := ov.Exec(context.Background(), "dies", []string{"cat", "/started"}, provider.ExecOptions{})
		return err == nil && string(res.Stdout) == "started\n"
	})
	if err := syscall.Kill(sb.InitPID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-done:
		if !errors.Is(a.err, provider.ErrExited) {
			t.Errorf("Exec under a dying init: %+v, %v; want ErrExited", a.res, a.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Exec did not return after the init was killed")
	}
	// A command that fails by itself is still its own answer.
	sb2 := providertest.Start(t, ov, provider.Spec{ID: "lives"})
	if ov.InitExited("lives") {
		t.Error("InitExited of a running sandbox: true")
	}
	res, err := ov.Exec(context.Background(), "lives", []string{"sh", "-c", "kill -9 $$"}, provider.ExecOptions{})
	if err != nil || res.ExitCode != 137 {
		t.Errorf("a command that killed itself: %+v, %v; want exit 137 and no error", res, err)
	}
	providertest.Stop(t, ov, sb)
	providertest.Stop(t, ov, sb2)
}

// A state directory that the base shows (here under /var/tmp, on the root
// file system) is hidden inside every sandbox: no sandbox reads another's
// upper layer or a snapshot through the read-only base.
func TestOverlayHidesStateDir(t *testing.T) {
	providertest.RequireRoot(t)
	state, err := os.MkdirTemp("/var/tmp", "stillpoint-provider-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.RemoveAll(state); err != nil {
			t.Error(err)
		}
	})
	base := newOverlay(t) // for its cgroup parent and cleanup checks
	cfg := base.Config()
	cfg.StateDir = state
	ov, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		providertest.Cleanup(t, ov)
		providertest.CheckNoMounts(t, state)
	})
	if ov.mask != state {
		t.Fatalf("mask = %q, want %q", ov.mask, state)
	}
	providertest.Start(t, ov, provider.Spec{ID: "a", Files: map[string][]byte{"secret": []byte("a's\n")}})
	providertest.Snapshot(t, ov, "a", "a-snap")
	providertest.Start(t, ov, provider.Spec{ID: "b"})
	out := providertest.Sh(t, ov, "b", "ls -A "+state+"; cat "+state+"/sandboxes/a/upper/secret 2>/dev/null || echo hidden; touch "+state+"/x 2>/dev/null || echo read-only")
	if out != "hidden\nread-only\n" {
		t.Errorf("sandbox b sees the state dir: %q", out)
	}
	if providertest.Exists(filepath.Join(state, "sandboxes", "b", "upper", strings.TrimPrefix(state, "/"))) {
		t.Error("the mask left a directory in b's upper layer")
	}
}

// A bound host directory shows read-only in the sandbox and is not the
// sandbox's files: a snapshot copies none of it, and a fork shows it again
// from its own spec.
func TestBindsShowHostDirectoriesReadOnly(t *testing.T) {
	host := t.TempDir()
	big := bytes.Repeat([]byte("x"), 1<<20)
	if err := os.WriteFile(filepath.Join(host, "tool"), big, 0o755); err != nil {
		t.Fatal(err)
	}
	binds := []provider.Bind{{HostDir: host, SandboxDir: "opt/bin"}}
	p := newOverlay(t)
	sb := providertest.Start(t, p, provider.Spec{ID: "b1", Binds: binds})
	if got := providertest.Sh(t, p, sb.ID, "wc -c < /opt/bin/tool; touch /opt/bin/x 2>/dev/null && echo writable || echo read-only"); got != "1048576\nread-only\n" {
		t.Fatalf("inside: %q", got)
	}
	s := providertest.Snapshot(t, p, sb.ID, "s1")
	if s.Size >= 1<<20 {
		t.Fatalf("the snapshot copied %d bytes: the bound directory went into it", s.Size)
	}
	f := providertest.Fork(t, p, "s1", provider.Spec{ID: "b2", Binds: binds})
	if got := providertest.Sh(t, p, f.ID, "wc -c < /opt/bin/tool"); got != "1048576\n" {
		t.Fatalf("fork: %q", got)
	}
	providertest.Stop(t, p, f)
	providertest.Stop(t, p, sb)
	if err := p.DeleteSnapshot(context.Background(), "s1"); err != nil {
		t.Fatal(err)
	}
}
