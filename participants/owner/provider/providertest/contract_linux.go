//go:build linux

package providertest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// Run checks the provider newProvider makes (fresh for each check, with a
// cleanup that checks nothing is left) against the contract of package
// provider, one subtest a check.
func Run(t *testing.T, newProvider func(t *testing.T) provider.Provider) {
	for _, c := range []struct {
		name  string
		check func(t *testing.T, p provider.Provider)
	}{
		{"FilesAndExec", filesAndExec},
		{"SnapshotForkIndependent", snapshotForkIndependent},
		{"FailuresLeaveNothing", failuresLeaveNothing},
		{"RefusesEscapes", refusesEscapes},
	} {
		t.Run(c.name, func(t *testing.T) { c.check(t, newProvider(t)) })
	}
}

// Start writes Spec.Files; Exec runs in Workdir, reports exit codes,
// output, stdin and environment.
func filesAndExec(t *testing.T, p provider.Provider) {
	Start(t, p, provider.Spec{ID: "c1", Workdir: "/work", Env: []string{"FROM_SPEC=1"}, Files: map[string][]byte{"work/a.txt": []byte("A\n")}})
	if got := Sh(t, p, "c1", "cat a.txt"); got != "A\n" {
		t.Fatalf("a.txt reads %q", got)
	}
	ctx := context.Background()
	res, err := p.Exec(ctx, "c1", []string{"sh", "-c", "read x; echo \"$x $FROM_SPEC $FROM_EXEC\"; echo e >&2; exit 3"},
		provider.ExecOptions{Env: []string{"FROM_EXEC=2"}, Stdin: strings.NewReader("in\n")})
	if err != nil || res.ExitCode != 3 || string(res.Stdout) != "in 1 2\n" || string(res.Stderr) != "e\n" {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	if _, err := p.Exec(ctx, "nope", []string{"true"}, provider.ExecOptions{}); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("exec in an unknown sandbox: %v, want ErrNotFound", err)
	}
	if got := p.Sandboxes(); !slices.Equal(got, []string{"c1"}) {
		t.Fatalf("Sandboxes() = %v", got)
	}
	if _, err := p.Start(ctx, provider.Spec{ID: "c1"}); !errors.Is(err, provider.ErrExists) {
		t.Fatalf("second Start of c1: %v, want ErrExists", err)
	}
	if _, err := p.Start(ctx, provider.Spec{ID: "../x"}); !errors.Is(err, provider.ErrInvalid) {
		t.Fatalf("Start of a bad id: %v, want ErrInvalid", err)
	}
	if err := p.Stop(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(ctx, "c1"); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if got := p.Sandboxes(); len(got) != 0 {
		t.Fatalf("Sandboxes() after Stop = %v", got)
	}
}

// A fork starts with the snapshot's files, not what the sandbox wrote
// after it; two forks of one snapshot are independent.
func snapshotForkIndependent(t *testing.T, p provider.Provider) {
	ctx := context.Background()
	Start(t, p, provider.Spec{ID: "orig", Workdir: "/work"})
	Sh(t, p, "orig", "echo before > b.txt")
	Snapshot(t, p, "orig", "s1")
	Sh(t, p, "orig", "echo after > b.txt")
	if got, _ := p.Snapshots(); !slices.Equal(got, []string{"s1"}) {
		t.Fatalf("Snapshots() = %v", got)
	}
	for _, id := range []string{"f1", "f2"} {
		Fork(t, p, "s1", provider.Spec{ID: id, Workdir: "/work", Epoch: 2})
		if got := Sh(t, p, id, "cat b.txt"); got != "before\n" {
			t.Fatalf("%s: b.txt reads %q, want the snapshot's", id, got)
		}
	}
	Sh(t, p, "f1", "echo f1 > b.txt")
	if got := Sh(t, p, "f2", "cat b.txt"); got != "before\n" {
		t.Fatalf("f2 sees f1's write: %q", got)
	}
	if got := Sh(t, p, "orig", "cat b.txt"); got != "after\n" {
		t.Fatalf("orig: %q", got)
	}
	if _, err := p.Fork(ctx, "nope", provider.Spec{ID: "f3", Epoch: 2}); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("fork of an unknown snapshot: %v, want ErrNotFound", err)
	}
	if _, err := p.Snapshot(ctx, "nope", "s2"); !errors.Is(err, provider.ErrNotFound) {
		t.Fatalf("snapshot of an unknown sandbox: %v, want ErrNotFound", err)
	}
	if _, err := p.Snapshot(ctx, "orig", "s1"); !errors.Is(err, provider.ErrExists) {
		t.Fatalf("second snapshot s1: %v, want ErrExists", err)
	}
	for _, id := range []string{"orig", "f1", "f2"} {
		if err := p.Stop(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.DeleteSnapshot(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if err := p.DeleteSnapshot(ctx, "s1"); err != nil {
		t.Fatalf("second DeleteSnapshot: %v", err)
	}
}

// A Start that fails leaves nothing behind; an Exec that Stop interrupts
// returns (with an error or a killed command's exit), and when an Exec's
// context ends the command is killed and Exec returns.
func failuresLeaveNothing(t *testing.T, p provider.Provider) {
	ctx := context.Background()
	_, err := p.Start(ctx, provider.Spec{ID: "bad", CopyIn: []provider.CopyIn{{HostPath: "/nonexistent/file", SandboxPath: "x"}}})
	if err == nil {
		t.Fatal("Start with a missing CopyIn file succeeded")
	}
	if got := p.Sandboxes(); len(got) != 0 {
		t.Fatalf("a failed Start left %v", got)
	}
	Start(t, p, provider.Spec{ID: "busy", Workdir: "/work"})
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	t0 := time.Now()
	res, err := p.Exec(cctx, "busy", []string{"sh", "-c", "sleep 1000"}, provider.ExecOptions{})
	cancel()
	if err == nil && res.ExitCode == 0 {
		t.Fatalf("an Exec whose context ended succeeded: %+v", res)
	}
	if d := time.Since(t0); d > 20*time.Second {
		t.Fatalf("an Exec whose context ended after 2 s returned after %s", d)
	}
	done := make(chan struct{})
	go func() { // ends when Stop kills the command
		defer close(done)
		res, err := p.Exec(ctx, "busy", []string{"sh", "-c", "sleep 1000"}, provider.ExecOptions{})
		if err == nil && res.ExitCode == 0 {
			t.Errorf("an Exec that Stop interrupted exited 0")
		}
	}()
	poll.Wait(t, 30*time.Second, "the command to run", func() bool {
		return strings.Contains(Sh(t, p, "busy", "ps -o args 2>/dev/null || ps"), "sleep 1000")
	})
	if err := p.Stop(ctx, "busy"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("an Exec did not return after Stop")
	}
}

// Ids and paths that could leave their directory are refused before
// anything is made, with an error naming the field; a symbolic link in the
// sandbox cannot carry a write out of it.
func refusesEscapes(t *testing.T, p provider.Provider) {
	ctx := context.Background()
	cases := []struct {
		spec  provider.Spec
		field string
	}{
		{provider.Spec{ID: "../x"}, "spec.ID"},
		{provider.Spec{ID: "a/b"}, "spec.ID"},
		{provider.Spec{ID: ""}, "spec.ID"},
		{provider.Spec{ID: "a.b"}, "spec.ID"},
		{provider.Spec{ID: strings.Repeat("x", 65)}, "spec.ID"},
		{provider.Spec{ID: "ok", Files: map[string][]byte{"../etc/passwd": nil}}, `spec.Files["../etc/passwd"]`},
		{provider.Spec{ID: "ok", Files: map[string][]byte{"a/../../b": nil}}, `spec.Files["a/../../b"]`},
		{provider.Spec{ID: "ok", Files: map[string][]byte{"/etc/passwd": nil}}, `spec.Files["/etc/passwd"]`},
		{provider.Spec{ID: "ok", Files: map[string][]byte{".": nil}}, `spec.Files["."]`},
		{provider.Spec{ID: "ok", CopyIn: []provider.CopyIn{{HostPath: "/bin/sh", SandboxPath: "../sh"}}}, "spec.CopyIn[0].SandboxPath"},
		{provider.Spec{ID: "ok", CopyIn: []provider.CopyIn{{HostPath: "bin/sh", SandboxPath: "sh"}}}, "spec.CopyIn[0].HostPath"},
		{provider.Spec{ID: "ok", Workdir: "/a/../.."}, "spec.Workdir"},
		{provider.Spec{ID: "ok", Workdir: "rel"}, "spec.Workdir"},
		{provider.Spec{ID: "ok", Env: []string{"NOEQUALS"}}, "spec.Env[0]"},
	}
	for _, c := range cases {
		_, err := p.Start(ctx, c.spec)
		if !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("Start(%+v): %v, want ErrInvalid naming %s", c.spec, err, c.field)
		}
	}
	if _, err := p.Fork(ctx, "../s", provider.Spec{ID: "ok"}); !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), "snapshotID") {
		t.Errorf("Fork(../s): %v", err)
	}
	if _, err := p.Snapshot(ctx, "ok", "s/1"); !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), "snapshotID") {
		t.Errorf("Snapshot(s/1): %v", err)
	}
	for name, err := range map[string]error{
		"Stop":           p.Stop(ctx, "../../x"),
		"DeleteSnapshot": p.DeleteSnapshot(ctx, "../snapshots"),
	} {
		if !errors.Is(err, provider.ErrInvalid) {
			t.Errorf("%s with a path-like id: %v", name, err)
		}
	}
	if _, err := p.Exec(ctx, "../x", []string{"true"}, provider.ExecOptions{}); !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), "id") {
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
	sb := Start(t, p, provider.Spec{ID: "link"})
	if sb.Root == "" { // a guest's disk (microvm): the links are made inside
		Sh(t, p, "link", "ln -s "+outside+" /escape && ln -s / /hostroot")
	} else {
		if err := os.Symlink(outside, filepath.Join(sb.Root, "escape")); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink("/", filepath.Join(sb.Root, "hostroot")); err != nil {
			t.Fatal(err)
		}
	}
	Snapshot(t, p, "link", "link-snap")
	forked, err := p.Fork(ctx, "link-snap", provider.Spec{ID: "link2", Files: map[string][]byte{
		"escape": []byte("pwned\n"), "hostroot" + outside + ".2": []byte("pwned\n"),
	}})
	if err == nil {
		Stop(t, p, forked)
	}
	if got := ReadFile(t, outside); got != "host\n" {
		t.Errorf("write through a link reached the host: %q", got)
	}
	if Exists(outside + ".2") {
		t.Error("write through a link to / reached the host")
	}
	Stop(t, p, sb)
}

// Concurrent starts, execs in, snapshots, forks and stops several
// sandboxes of p at once, then checks that nothing is left.
func Concurrent(t *testing.T, ov provider.Provider) {
	ctx := context.Background()
	errs := make(chan error, 4)
	for i := range 4 {
		go func() {
			id := fmt.Sprintf("c%d", i)
			errs <- func() error {
				if _, err := ov.Start(ctx, provider.Spec{ID: id}); err != nil {
					return err
				}
				if _, err := ov.Exec(ctx, id, []string{"sh", "-c", "echo " + id + " > /f"}, provider.ExecOptions{}); err != nil {
					return err
				}
				if _, err := ov.Snapshot(ctx, id, id+"-s"); err != nil {
					return err
				}
				if _, err := ov.Fork(ctx, id+"-s", provider.Spec{ID: id + "-f"}); err != nil {
					return err
				}
				res, err := ov.Exec(ctx, id+"-f", []string{"cat", "/f"}, provider.ExecOptions{})
				if err == nil && string(res.Stdout) != id+"\n" {
					err = fmt.Errorf("fork %s-f reads %q", id, res.Stdout)
				}
				return errors.Join(err, ov.Stop(ctx, id), ov.Stop(ctx, id+"-f"), ov.DeleteSnapshot(ctx, id+"-s"))
			}()
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if left := ov.Sandboxes(); len(left) > 0 {
		t.Errorf("left: %v", left)
	}
}
