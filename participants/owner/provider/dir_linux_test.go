//go:build linux

package provider

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/poll"
)

// The dir provider: a plain directory, snapshot and fork copy it, and a
// copy is a copy (an in-place write after the snapshot does not reach it,
// which a hard-link "copy" would).
func TestDirSnapshotFork(t *testing.T) {
	d := newDir(t)
	a := start(t, d, Spec{ID: "a", Files: map[string][]byte{"seed.txt": []byte("seed\n")}})
	if a.Root != a.Workdir || a.Cgroup != "" || filepath.Base(a.Root) != "root" {
		t.Fatalf("sandbox = %+v", a)
	}
	if got := run(t, d, "a", `pwd; cat seed.txt; echo one > one.txt; echo "$STILLPOINT_SANDBOX"`); got != a.Root+"\nseed\n"+filepath.Dir(a.Root)+"\n" {
		t.Fatalf("inside: %q", got)
	}
	s := snapshot(t, d, "a", "s1")
	if s.Files != 2 || s.Size != 9 {
		t.Errorf("snapshot = %+v, want 2 files of 9 bytes", s)
	}
	run(t, d, "a", "echo more >> one.txt; echo two > two.txt")
	snapFile := filepath.Join(d.state, "snapshots", "s1", "root", "one.txt")
	if got := readFile(t, snapFile); got != "one\n" {
		t.Errorf("in-place write after the snapshot reached it: %q", got)
	}
	var s1, s2 unix.Stat_t
	if unix.Stat(snapFile, &s1) != nil || unix.Stat(filepath.Join(a.Root, "one.txt"), &s2) != nil || s1.Ino == s2.Ino {
		t.Error("snapshot shares an inode with the sandbox")
	}
	b := fork(t, d, "s1", Spec{ID: "b", Workdir: "/sub"})
	if b.Workdir != filepath.Join(b.Root, "sub") {
		t.Errorf("fork workdir %q", b.Workdir)
	}
	if got := run(t, d, "b", "cat ../one.txt; test ! -e ../two.txt && echo no-two"); got != "one\nno-two\n" {
		t.Errorf("fork sees %q", got)
	}
	if _, err := d.Fork(context.Background(), "s1", Spec{ID: "b"}); !errors.Is(err, ErrExists) {
		t.Errorf("fork onto a running id: %v", err)
	}
	stop(t, d, a)
	stop(t, d, b)
}

// Stop kills the process group and a daemon that left it (found by the
// sandbox's environment tag), and leaves no directory.
func TestDirStopKillsDaemon(t *testing.T) {
	d := newDir(t)
	sb := start(t, d, Spec{ID: "daemon", Init: []string{"sh", "-c", "sleep 1000 & sleep 1001"}})
	run(t, d, "daemon", `setsid sh -c 'sleep 1002' </dev/null >/dev/null 2>&1 &`)
	var pids []int
	poll.Wait(t, 10*time.Second, "the sandbox's processes", func() bool {
		pids = tagged(tagEnv + "=" + filepath.Dir(sb.Root))
		return len(pids) >= 5 // init sh, two sleeps, setsid sh, its sleep
	})
	stop(t, d, sb, pids...)
	if got := tagged(tagEnv + "=" + filepath.Dir(sb.Root)); len(got) > 0 {
		t.Errorf("tagged processes left: %v", got)
	}
}

// The nosnapshot variant runs sandboxes but refuses snapshots with
// ErrNoSnapshot, and says so in Caps.
func TestNoSnapshot(t *testing.T) {
	p := NewNoSnapshot(newDir(t))
	if p.Caps().Snapshot || p.Caps().KeepsProcesses || p.Name() != "nosnapshot" {
		t.Fatalf("caps %+v name %s", p.Caps(), p.Name())
	}
	sb := start(t, p, Spec{ID: "ns"})
	if got := run(t, p, "ns", "echo hi"); got != "hi\n" {
		t.Errorf("exec: %q", got)
	}
	if _, err := p.Snapshot(context.Background(), "ns", "s"); !errors.Is(err, ErrNoSnapshot) {
		t.Errorf("Snapshot: %v", err)
	}
	if _, err := p.Fork(context.Background(), "s", Spec{ID: "f"}); !errors.Is(err, ErrNoSnapshot) {
		t.Errorf("Fork: %v", err)
	}
	if err := p.DeleteSnapshot(context.Background(), "s"); err != nil {
		t.Errorf("DeleteSnapshot: %v", err)
	}
	if got := p.Sandboxes(); !slices.Equal(got, []string{"ns"}) {
		t.Errorf("Sandboxes() = %v", got)
	}
	stop(t, p, sb)
}

// Ids and paths that could leave their directory are refused before
// anything is made, with an error naming the field; a symbolic link in the
// sandbox cannot carry a write out of it.
func TestRefusesEscapes(t *testing.T) {
	ctx := context.Background()
	forEachProvider(t, func(t *testing.T, p Provider) {
		cases := []struct {
			spec  Spec
			field string
		}{
			{Spec{ID: "../x"}, "spec.ID"},
			{Spec{ID: "a/b"}, "spec.ID"},
			{Spec{ID: ""}, "spec.ID"},
			{Spec{ID: "a.b"}, "spec.ID"},
			{Spec{ID: strings.Repeat("x", 65)}, "spec.ID"},
			{Spec{ID: "ok", Files: map[string][]byte{"../etc/passwd": nil}}, `spec.Files["../etc/passwd"]`},
			{Spec{ID: "ok", Files: map[string][]byte{"a/../../b": nil}}, `spec.Files["a/../../b"]`},
			{Spec{ID: "ok", Files: map[string][]byte{"/etc/passwd": nil}}, `spec.Files["/etc/passwd"]`},
			{Spec{ID: "ok", Files: map[string][]byte{".": nil}}, `spec.Files["."]`},
			{Spec{ID: "ok", CopyIn: []CopyIn{{HostPath: "/bin/sh", SandboxPath: "../sh"}}}, "spec.CopyIn[0].SandboxPath"},
			{Spec{ID: "ok", CopyIn: []CopyIn{{HostPath: "bin/sh", SandboxPath: "sh"}}}, "spec.CopyIn[0].HostPath"},
			{Spec{ID: "ok", Workdir: "/a/../.."}, "spec.Workdir"},
			{Spec{ID: "ok", Workdir: "rel"}, "spec.Workdir"},
			{Spec{ID: "ok", Env: []string{"NOEQUALS"}}, "spec.Env[0]"},
		}
		for _, c := range cases {
			_, err := p.Start(ctx, c.spec)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.field) {
				t.Errorf("Start(%+v): %v, want ErrInvalid naming %s", c.spec, err, c.field)
			}
		}
		if _, err := p.Fork(ctx, "../s", Spec{ID: "ok"}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "snapshotID") {
			t.Errorf("Fork(../s): %v", err)
		}
		if _, err := p.Snapshot(ctx, "ok", "s/1"); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "snapshotID") {
			t.Errorf("Snapshot(s/1): %v", err)
		}
		for name, err := range map[string]error{
			"Stop":           p.Stop(ctx, "../../x"),
			"DeleteSnapshot": p.DeleteSnapshot(ctx, "../snapshots"),
		} {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%s with a path-like id: %v", name, err)
			}
		}
		if _, err := p.Exec(ctx, "../x", []string{"true"}, ExecOptions{}); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "id") {
			t.Errorf("Exec(../x): %v", err)
		}
		if left := p.Sandboxes(); len(left) > 0 {
			t.Errorf("refused specs left sandboxes %v", left)
		}

		// A link in the sandbox to a host path: a file written through
		// it stays inside.
		outside := filepath.Join(t.TempDir(), "target")
		if err := os.WriteFile(outside, []byte("host\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		sb := start(t, p, Spec{ID: "link"})
		if sb.Root == "" { // a guest's disk (microvm): the links are made inside
			run(t, p, "link", "ln -s "+outside+" /escape && ln -s / /hostroot")
		} else {
			if err := os.Symlink(outside, filepath.Join(sb.Root, "escape")); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("/", filepath.Join(sb.Root, "hostroot")); err != nil {
				t.Fatal(err)
			}
		}
		snapshot(t, p, "link", "link-snap")
		forked, err := p.Fork(ctx, "link-snap", Spec{ID: "link2", Files: map[string][]byte{
			"escape": []byte("pwned\n"), "hostroot" + outside + ".2": []byte("pwned\n"),
		}})
		if err == nil {
			stop(t, p, forked)
		}
		if got := readFile(t, outside); got != "host\n" {
			t.Errorf("write through a link reached the host: %q", got)
		}
		if exists(outside + ".2") {
			t.Error("write through a link to / reached the host")
		}
		stop(t, p, sb)
	})
}

// Exec in a dir sandbox: exit code, stdin, env and dir; when its context
// ends, its process group is killed.
func TestDirExec(t *testing.T) {
	d := newDir(t)
	sb := start(t, d, Spec{ID: "ex", Env: []string{"FOO=spec"}, Workdir: "/w"})
	ctx := context.Background()
	res, err := d.Exec(ctx, "ex", []string{"sh", "-c", `read x; echo "$x $FOO $BAR"; pwd; exit 4`},
		ExecOptions{Env: []string{"BAR=opt"}, Stdin: strings.NewReader("in\n")})
	if err != nil || string(res.Stdout) != "in spec opt\n"+sb.Workdir+"\n" || res.ExitCode != 4 {
		t.Errorf("result = %q %q %d, %v", res.Stdout, res.Stderr, res.ExitCode, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := d.Exec(cctx, "ex", []string{"sh", "-c", "sleep 1000 & sleep 1001"}, ExecOptions{})
		done <- err
	}()
	tag := tagEnv + "=" + filepath.Dir(sb.Root)
	var pids []int
	poll.Wait(t, 10*time.Second, "the command to start", func() bool {
		pids = tagged(tag)
		return len(pids) >= 4 // init, sh, two sleeps
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled exec: %v", err)
	}
	poll.Wait(t, 10*time.Second, "only init to remain", func() bool { return len(tagged(tag)) == 1 })
	stop(t, d, sb, pids...)
}
