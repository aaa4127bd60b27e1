package guest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/vmctl"
)

func holdReaper(t *testing.T) {
	t.Helper()
	release, err := sandboxd.HoldReaper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(release)
}

// TestSystemExec runs commands as the provider's Exec does: stdin in,
// stdout and stderr out, the exit code, and a timeout that kills the
// command's whole group.
func TestSystemExec(t *testing.T) {
	holdReaper(t)
	s := NewSystem(SystemConfig{Root: t.TempDir()})
	ctx := context.Background()
	r, err := s.Exec(ctx, vmctl.Request{Argv: []string{"sh", "-c", "cat; echo err >&2; pwd; exit 2"}, Stdin: []byte("in\n")})
	if err != nil {
		t.Fatal(err)
	}
	if r.Exit != 2 || string(r.Stdout) != "in\n"+s.dir("/")+"\n" || string(r.Stderr) != "err\n" || r.TimedOut {
		t.Fatalf("exec: %+v (stdout %q)", r, r.Stdout)
	}
	start := time.Now()
	r, err = s.Exec(ctx, vmctl.Request{Argv: []string{"sh", "-c", "sleep 60 & sleep 60"}, TimeoutMS: 200})
	if err != nil {
		t.Fatal(err)
	}
	if !r.TimedOut || r.Exit != -1 || r.Signal != "SIGKILL" || time.Since(start) > 20*time.Second {
		t.Fatalf("timeout: %+v after %s", r, time.Since(start))
	}
	// A command that leaves a process holding its output is answered
	// without waiting for that process.
	r, err = s.Exec(ctx, vmctl.Request{Argv: []string{"sh", "-c", "echo started; setsid sleep 30 & exit 0"}})
	if err != nil || r.Exit != 0 || !bytes.HasPrefix(r.Stdout, []byte("started")) {
		t.Fatalf("background: %+v %v", r, err)
	}
	// Output beyond vmctl.MaxOutput is read to its end and cut.
	r, err = s.Exec(ctx, vmctl.Request{Argv: []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/zero; echo done >&2", vmctl.MaxOutput+1<<20)}})
	if err != nil || r.Exit != 0 || len(r.Stdout) != vmctl.MaxOutput || !r.Truncated || string(r.Stderr) != "done\n" {
		t.Fatalf("large output: exit %d, %d bytes, truncated %v, stderr %q, %v", r.Exit, len(r.Stdout), r.Truncated, r.Stderr, err)
	}
	if _, err := s.Exec(ctx, vmctl.Request{Argv: []string{"/no/such/program"}}); err == nil {
		t.Fatal("exec of a missing program: no error")
	}
}

// TestSystemIdentifyPlainInit: an identify with no run writes the files
// and starts the plain init, which a reidentify keeps (same pid).
func TestSystemIdentifyPlainInit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestSystemIdentifyPlainInit needs root (the reseed ioctls): run the tests as root, as CI does")
	}
	holdReaper(t)
	root := t.TempDir()
	s := NewSystem(SystemConfig{Root: root})
	defer s.Close()
	ent := bytes.Repeat([]byte{7}, vmctl.EntropyBytes)
	h, err := s.Identify(context.Background(), vmctl.Request{Op: vmctl.OpIdentify, Sandbox: "s1", Entropy: ent, Workdir: "/work",
		Files: []vmctl.File{{Path: "work/a.txt", Data: []byte("a")}, {Path: "/etc/x", Mode: 0o600, Data: []byte("x")}},
		Init:  []string{"sh", "-c", "echo $$ > pid; exec sleep 60"}})
	if err != nil {
		t.Fatal(err)
	}
	if h.InitPID == 0 || h.Sandbox != "s1" {
		t.Fatalf("hello: %+v", h)
	}
	h0, err := s.Identify(context.Background(), vmctl.Request{Op: vmctl.OpReidentify, Sandbox: "s0", Entropy: ent, Workdir: "/made/here"})
	if err != nil || h0.InitPID != h.InitPID {
		t.Fatalf("reidentify: %+v %v", h0, err)
	}
	if st, err := os.Stat(filepath.Join(root, "made/here")); err != nil || !st.IsDir() {
		t.Fatalf("the workdir was not made: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "work/a.txt")); string(b) != "a" {
		t.Fatalf("work/a.txt: %q", b)
	}
	if st, err := os.Stat(filepath.Join(root, "etc/x")); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("etc/x: %v %v", st, err)
	}
	if err := unix.Kill(h.InitPID, 0); err != nil {
		t.Fatalf("init %d: %v", h.InitPID, err)
	}
	h2, err := s.Identify(context.Background(), vmctl.Request{Op: vmctl.OpReidentify, Sandbox: "s2", Entropy: ent})
	if err != nil {
		t.Fatal(err)
	}
	if h2.InitPID != h.InitPID || h2.Sandbox != "s2" {
		t.Fatalf("after reidentify: %+v, init was %d", h2, h.InitPID)
	}
	// An exec with no dir runs in the identity's working directory.
	if r, err := s.Exec(context.Background(), vmctl.Request{Argv: []string{"pwd"}}); err != nil || string(r.Stdout) != filepath.Join(root, "made/here")+"\n" {
		t.Fatalf("exec's default dir: %q %v", r.Stdout, err)
	}
	if _, err := s.Identify(context.Background(), vmctl.Request{Op: vmctl.OpIdentify, Sandbox: "s3", Run: "r", Entropy: ent}); err == nil {
		t.Fatal("identify with a run and no Members: no error")
	}
}

// TestSystemIdentifySetsTheEnvironment: in a VM the identify's Env becomes
// PID 1's, which the member's launches inherit.
func TestSystemIdentifySetsTheEnvironment(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestSystemIdentifySetsTheEnvironment needs root (the reseed ioctls): run the tests as root, as CI does")
	}
	saved := os.Environ()
	t.Cleanup(func() {
		os.Clearenv()
		for _, kv := range saved {
			k, v, _ := strings.Cut(kv, "=")
			_ = os.Setenv(k, v)
		}
	})
	holdReaper(t)
	s := NewSystem(SystemConfig{Root: t.TempDir(), SetEnv: true})
	defer s.Close()
	_, err := s.Identify(context.Background(), vmctl.Request{Op: vmctl.OpIdentify, Sandbox: "s1", Entropy: bytes.Repeat([]byte{7}, vmctl.EntropyBytes),
		Env: []string{"FOO=bar", "HOME=/work"}, Init: []string{"true"}})
	if err != nil {
		t.Fatal(err)
	}
	if os.Getenv("FOO") != "bar" || os.Getenv("HOME") != "/work" || os.Getenv("PATH") != DefaultPath || len(os.Environ()) != 3 {
		t.Fatalf("environment after identify: %q", os.Environ())
	}
}

// TestSystemReportsThePlainInitsExit: the plain init's exit is told to the
// host (vmctl.EventInit) and shown in Hello, for a host that connects
// later.
func TestSystemReportsThePlainInitsExit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("TestSystemReportsThePlainInitsExit needs root (the reseed ioctls): run the tests as root, as CI does")
	}
	holdReaper(t)
	s := NewSystem(SystemConfig{Root: t.TempDir()})
	defer s.Close()
	notices := make(chan vmctl.Notice, 1)
	s.SetNotify(func(n vmctl.Notice) { notices <- n })
	if _, err := s.Identify(context.Background(), vmctl.Request{Op: vmctl.OpIdentify, Sandbox: "s1",
		Entropy: bytes.Repeat([]byte{7}, vmctl.EntropyBytes), Init: []string{"sh", "-c", "exit 3"}}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-notices:
		if n.Event != vmctl.EventInit || n.Why != "exit 3" {
			t.Fatalf("notice %+v, want the init's exit 3", n)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("no notice of the init's exit")
	}
	if h := s.Hello(); !h.InitExited {
		t.Fatalf("hello after the init exited: %+v", h)
	}
}
