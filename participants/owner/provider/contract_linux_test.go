//go:build linux

package provider

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
)

// Provider is the shape every provider of this package has, so that the
// tests run the same checks on each. The owner declares the smaller
// interfaces it calls (participants/owner: Provider, Snapshotter, Lister,
// Execer); this one exists for the tests alone.
type Provider interface {
	Name() string
	Caps() Caps
	Start(ctx context.Context, spec Spec) (*Sandbox, error)
	Stop(ctx context.Context, id string) error
	Exec(ctx context.Context, id string, argv []string, opts ExecOptions) (ExecResult, error)
	Snapshot(ctx context.Context, id, snapshotID string) (Snapshot, error)
	Fork(ctx context.Context, snapshotID string, spec Spec) (*Sandbox, error)
	DeleteSnapshot(ctx context.Context, snapshotID string) error
	Sandboxes() []string
	Snapshots() ([]string, error)
}

// Every provider has the same shape.
var (
	_ Provider = (*Overlay)(nil)
	_ Provider = (*Dir)(nil)
	_ Provider = (*NoSnapshot)(nil)
	_ Provider = (*MicroVM)(nil)
)

// providers are the providers the contract tests run on, each made fresh
// for a test with a cleanup that checks nothing is left.
var providers = []struct {
	name string
	long bool // it boots VMs: make test runs it, make test-short does not
	make func(t *testing.T) Provider
}{
	{"overlay", false, func(t *testing.T) Provider { return newOverlay(t) }},
	{"dir", false, func(t *testing.T) Provider { return newDir(t) }},
	{"microvm", true, func(t *testing.T) Provider {
		m := newMicroVM(t, t.TempDir())
		t.Cleanup(func() { cleanupMicroVM(t, m) })
		return m
	}},
}

// forEachProvider runs test on every provider, as a subtest named for it.
func forEachProvider(t *testing.T, test func(t *testing.T, p Provider)) {
	for _, pc := range providers {
		t.Run(pc.name, func(t *testing.T) {
			if pc.long {
				tier.Long(t)
			}
			test(t, pc.make(t))
		})
	}
}

// Start writes Spec.Files; Exec runs in Workdir, reports exit codes,
// output, stdin and environment.
func TestContractFilesAndExec(t *testing.T) {
	forEachProvider(t, func(t *testing.T, p Provider) {
		start(t, p, Spec{ID: "c1", Workdir: "/work", Env: []string{"FROM_SPEC=1"}, Files: map[string][]byte{"work/a.txt": []byte("A\n")}})
		if got := run(t, p, "c1", "cat a.txt"); got != "A\n" {
			t.Fatalf("a.txt reads %q", got)
		}
		ctx := context.Background()
		res, err := p.Exec(ctx, "c1", []string{"sh", "-c", "read x; echo \"$x $FROM_SPEC $FROM_EXEC\"; echo e >&2; exit 3"},
			ExecOptions{Env: []string{"FROM_EXEC=2"}, Stdin: strings.NewReader("in\n")})
		if err != nil || res.ExitCode != 3 || string(res.Stdout) != "in 1 2\n" || string(res.Stderr) != "e\n" {
			t.Fatalf("exec: %+v, %v", res, err)
		}
		if _, err := p.Exec(ctx, "nope", []string{"true"}, ExecOptions{}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("exec in an unknown sandbox: %v, want ErrNotFound", err)
		}
		if got := p.Sandboxes(); !slices.Equal(got, []string{"c1"}) {
			t.Fatalf("Sandboxes() = %v", got)
		}
		if _, err := p.Start(ctx, Spec{ID: "c1"}); !errors.Is(err, ErrExists) {
			t.Fatalf("second Start of c1: %v, want ErrExists", err)
		}
		if _, err := p.Start(ctx, Spec{ID: "../x"}); !errors.Is(err, ErrInvalid) {
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
	})
}

// A fork starts with the snapshot's files, not what the sandbox wrote
// after it; two forks of one snapshot are independent.
func TestContractSnapshotForkIndependent(t *testing.T) {
	forEachProvider(t, func(t *testing.T, p Provider) {
		ctx := context.Background()
		start(t, p, Spec{ID: "orig", Workdir: "/work"})
		run(t, p, "orig", "echo before > b.txt")
		snapshot(t, p, "orig", "s1")
		run(t, p, "orig", "echo after > b.txt")
		if got, _ := p.Snapshots(); !slices.Equal(got, []string{"s1"}) {
			t.Fatalf("Snapshots() = %v", got)
		}
		for _, id := range []string{"f1", "f2"} {
			fork(t, p, "s1", Spec{ID: id, Workdir: "/work", Epoch: 2})
			if got := run(t, p, id, "cat b.txt"); got != "before\n" {
				t.Fatalf("%s: b.txt reads %q, want the snapshot's", id, got)
			}
		}
		run(t, p, "f1", "echo f1 > b.txt")
		if got := run(t, p, "f2", "cat b.txt"); got != "before\n" {
			t.Fatalf("f2 sees f1's write: %q", got)
		}
		if got := run(t, p, "orig", "cat b.txt"); got != "after\n" {
			t.Fatalf("orig: %q", got)
		}
		if _, err := p.Fork(ctx, "nope", Spec{ID: "f3", Epoch: 2}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("fork of an unknown snapshot: %v, want ErrNotFound", err)
		}
		if _, err := p.Snapshot(ctx, "nope", "s2"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("snapshot of an unknown sandbox: %v, want ErrNotFound", err)
		}
		if _, err := p.Snapshot(ctx, "orig", "s1"); !errors.Is(err, ErrExists) {
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
	})
}

// A Start that fails leaves nothing behind; an Exec that Stop interrupts
// returns (with an error or a killed command's exit), and when an Exec's
// context ends the command is killed and Exec returns.
func TestContractFailuresLeaveNothing(t *testing.T) {
	forEachProvider(t, func(t *testing.T, p Provider) {
		ctx := context.Background()
		_, err := p.Start(ctx, Spec{ID: "bad", CopyIn: []CopyIn{{HostPath: "/nonexistent/file", SandboxPath: "x"}}})
		if err == nil {
			t.Fatal("Start with a missing CopyIn file succeeded")
		}
		if got := p.Sandboxes(); len(got) != 0 {
			t.Fatalf("a failed Start left %v", got)
		}
		start(t, p, Spec{ID: "busy", Workdir: "/work"})
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		t0 := time.Now()
		res, err := p.Exec(cctx, "busy", []string{"sh", "-c", "sleep 1000"}, ExecOptions{})
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
			res, err := p.Exec(ctx, "busy", []string{"sh", "-c", "sleep 1000"}, ExecOptions{})
			if err == nil && res.ExitCode == 0 {
				t.Errorf("an Exec that Stop interrupted exited 0")
			}
		}()
		poll.Wait(t, 30*time.Second, "the command to run", func() bool {
			return strings.Contains(run(t, p, "busy", "ps -o args 2>/dev/null || ps"), "sleep 1000")
		})
		if err := p.Stop(ctx, "busy"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("an Exec did not return after Stop")
		}
	})
}
