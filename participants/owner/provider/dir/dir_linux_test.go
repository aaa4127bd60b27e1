//go:build linux

package dir

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
)

// The dir provider: a plain directory, snapshot and fork copy it, and a
// copy is a copy (an in-place write after the snapshot does not reach it,
// which a hard-link "copy" would).
func TestDirSnapshotFork(t *testing.T) {
	d := newDir(t)
	a := providertest.Start(t, d, provider.Spec{ID: "a", Files: map[string][]byte{"seed.txt": []byte("seed\n")}})
	if a.Root != a.Workdir || a.Cgroup != "" || filepath.Base(a.Root) != "root" {
		t.Fatalf("sandbox = %+v", a)
	}
	if got := providertest.Sh(t, d, "a", `pwd; cat seed.txt; echo one > one.txt; echo "$STILLPOINT_SANDBOX"`); got != a.Root+"\nseed\n"+filepath.Dir(a.Root)+"\n" {
		t.Fatalf("inside: %q", got)
	}
	s := providertest.Snapshot(t, d, "a", "s1")
	if s.Files != 2 || s.Size != 9 {
		t.Errorf("snapshot = %+v, want 2 files of 9 bytes", s)
	}
	providertest.Sh(t, d, "a", "echo more >> one.txt; echo two > two.txt")
	snapFile := filepath.Join(d.state, "snapshots", "s1", "root", "one.txt")
	if got := providertest.ReadFile(t, snapFile); got != "one\n" {
		t.Errorf("in-place write after the snapshot reached it: %q", got)
	}
	var s1, s2 unix.Stat_t
	if unix.Stat(snapFile, &s1) != nil || unix.Stat(filepath.Join(a.Root, "one.txt"), &s2) != nil || s1.Ino == s2.Ino {
		t.Error("snapshot shares an inode with the sandbox")
	}
	b := providertest.Fork(t, d, "s1", provider.Spec{ID: "b", Workdir: "/sub"})
	if b.Workdir != filepath.Join(b.Root, "sub") {
		t.Errorf("fork workdir %q", b.Workdir)
	}
	if got := providertest.Sh(t, d, "b", "cat ../one.txt; test ! -e ../two.txt && echo no-two"); got != "one\nno-two\n" {
		t.Errorf("fork sees %q", got)
	}
	if _, err := d.Fork(context.Background(), "s1", provider.Spec{ID: "b"}); !errors.Is(err, provider.ErrExists) {
		t.Errorf("fork onto a running id: %v", err)
	}
	providertest.Stop(t, d, a)
	providertest.Stop(t, d, b)
}

// Stop kills the process group and a daemon that left it (found by the
// sandbox's environment tag), and leaves no directory.
func TestDirStopKillsDaemon(t *testing.T) {
	d := newDir(t)
	sb := providertest.Start(t, d, provider.Spec{ID: "daemon", Init: []string{"sh", "-c", "sleep 1000 & sleep 1001"}})
	providertest.Sh(t, d, "daemon", `setsid sh -c 'sleep 1002' </dev/null >/dev/null 2>&1 &`)
	var pids []int
	poll.Wait(t, 10*time.Second, "the sandbox's processes", func() bool {
		pids = tagged(tagEnv + "=" + filepath.Dir(sb.Root))
		return len(pids) >= 5 // init sh, two sleeps, setsid sh, its sleep
	})
	providertest.Stop(t, d, sb, pids...)
	if got := tagged(tagEnv + "=" + filepath.Dir(sb.Root)); len(got) > 0 {
		t.Errorf("tagged processes left: %v", got)
	}
}

// Exec in a dir sandbox: exit code, stdin, env and dir; when its context
// ends, its process group is killed.
func TestDirExec(t *testing.T) {
	d := newDir(t)
	sb := providertest.Start(t, d, provider.Spec{ID: "ex", Env: []string{"FOO=spec"}, Workdir: "/w"})
	ctx := context.Background()
	res, err := d.Exec(ctx, "ex", []string{"sh", "-c", `read x; echo "$x $FOO $BAR"; pwd; exit 4`},
		provider.ExecOptions{Env: []string{"BAR=opt"}, Stdin: strings.NewReader("in\n")})
	if err != nil || string(res.Stdout) != "in spec opt\n"+sb.Workdir+"\n" || res.ExitCode != 4 {
		t.Errorf("result = %q %q %d, %v", res.Stdout, res.Stderr, res.ExitCode, err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := d.Exec(cctx, "ex", []string{"sh", "-c", "sleep 1000 & sleep 1001"}, provider.ExecOptions{})
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
	providertest.Stop(t, d, sb, pids...)
}

// The dir provider, which has no mount namespace, copies a bound host
// directory's files in.
func TestBindsAreCopiedIn(t *testing.T) {
	host := t.TempDir()
	big := bytes.Repeat([]byte("x"), 1<<20)
	if err := os.WriteFile(filepath.Join(host, "tool"), big, 0o755); err != nil {
		t.Fatal(err)
	}
	binds := []provider.Bind{{HostDir: host, SandboxDir: "opt/bin"}}
	p := newDir(t)
	sb := providertest.Start(t, p, provider.Spec{ID: "b1", Binds: binds})
	if got := providertest.Sh(t, p, sb.ID, "wc -c < opt/bin/tool"); strings.TrimSpace(got) != "1048576" {
		t.Fatalf("inside: %q", got)
	}
	providertest.Stop(t, p, sb)
}

// The dir provider has no root to swap: a spec with an image is refused,
// and nothing is made.
func TestDirRefusesImage(t *testing.T) {
	d := newDir(t)
	img := &provider.Image{Ref: "/srv/img", Digest: "sha256:00", Layers: []string{t.TempDir()}}
	for _, spec := range []provider.Spec{{ID: "a", Image: img}, {ID: "a", ImageRef: "/srv/img"}} {
		_, err := d.Start(context.Background(), spec)
		if !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), "the dir provider cannot start from an image; use overlay or microvm") {
			t.Errorf("Start with an image: %v, want ErrInvalid naming overlay and microvm", err)
		}
	}
	if got := d.Sandboxes(); len(got) != 0 {
		t.Errorf("Sandboxes() = %v after refused starts", got)
	}
}
