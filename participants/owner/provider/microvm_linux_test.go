//go:build linux

package provider

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm"
)

// microvmOwnerEnv makes the test binary a stand-in owner (TestMain): it
// starts a sandbox with the counter, snapshots it, says so on stdout and
// waits to be killed.
const microvmOwnerEnv = "STILLPOINT_TEST_MICROVM_OWNER"

// counterInit writes 1, 2, 3, ... with its pid, to /work/counter and to
// the console, five times a second.
var counterInit = []string{"sh", "-c", `i=0; while :; do i=$((i+1)); echo "$i $$" >> /work/counter; echo "counter $i $$" > /dev/console; sleep 0.2; done`}

// microvmCache is shared by the tests of a run (and kept between runs):
// images and warm templates are keyed by their content.
func microvmCache() string { return filepath.Join(os.TempDir(), "stillpoint-microvm-test-cache") }

// requireMicroVM fails (never skips) a test when QEMU, busybox or the guest
// kernel is missing, naming what to install.
func requireMicroVM(t testing.TB) {
	t.Helper()
	requireRoot(t)
	if _, err := microvm.FindAssets(""); err != nil {
		t.Fatalf("the microvm provider's tests need QEMU and the guest kernel: %v", err)
	}
}

func newMicroVM(t testing.TB, state string) *MicroVM {
	t.Helper()
	requireMicroVM(t)
	sd := build.StaticForTest(t, build.Sandboxd)[build.Sandboxd]
	m, err := NewMicroVM(MicroVMConfig{StateDir: state, CacheDir: microvmCache(), PruneCache: true, Sandboxd: sd, Accel: "tcg", Lease: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// cleanupMicroVM stops what is left, deletes the snapshots and checks
// that nothing of the provider's sandboxes is left: no QEMU, no layer, no
// socket, no directory.
func cleanupMicroVM(t testing.TB, m *MicroVM) {
	t.Helper()
	cleanupProvider(t, m)
	checkMicroVMEmpty(t, m)
}

func checkMicroVMEmpty(t testing.TB, m *MicroVM) {
	t.Helper()
	if exists(m.socks) {
		t.Errorf("the sockets' directory %s is still there", m.socks)
	}
	for _, d := range []string{m.layers, filepath.Join(m.cfg.StateDir, "sandboxes"), filepath.Join(m.cfg.StateDir, "snapshots")} {
		ents, err := os.ReadDir(d)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			t.Error(err)
		}
		if len(ents) > 0 {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("left in %s: %v", d, names)
		}
	}
	if pids := qemusUnder(m.cfg.StateDir); len(pids) > 0 {
		t.Errorf("QEMU processes of %s still running: %v", m.cfg.StateDir, pids)
	}
}

// qemusUnder lists the live processes whose command line names dir.
func qemusUnder(dir string) []int {
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(b), dir+"/") || !strings.Contains(string(b), "qemu") {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && strings.Contains(string(st), ") Z ") {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// counter reads /work/counter in a sandbox: its last value, and whether
// every line is the next number of one pid.
func counter(t testing.TB, p Provider, id string) (last, pid int) {
	t.Helper()
	out := run(t, p, id, "cat /work/counter")
	sc := bufio.NewScanner(strings.NewReader(out))
	for n := 1; sc.Scan(); n++ {
		var i, pp int
		if _, err := fmt.Sscanf(sc.Text(), "%d %d", &i, &pp); err != nil {
			t.Fatalf("%s: counter line %d %q: %v", id, n, sc.Text(), err)
		}
		if i != n || (pid != 0 && pp != pid) {
			t.Fatalf("%s: counter line %d is %q (pid so far %d): a gap, a repeat or another process", id, n, sc.Text(), pid)
		}
		last, pid = i, pp
	}
	return last, pid
}

func waitCounter(t testing.TB, p Provider, id string, atLeast int) int {
	t.Helper()
	var last int
	poll.Wait(t, time.Minute, fmt.Sprintf("counter of %s at %d", id, atLeast), func() bool {
		last, _ = counter(t, p, id)
		return last >= atLeast
	})
	return last
}

func TestMicroVMStartExecStop(t *testing.T) {
	tier.Long(t)
	m := newMicroVM(t, t.TempDir())
	defer cleanupMicroVM(t, m)
	t0 := time.Now()
	sb := start(t, m, Spec{ID: "vm1", Init: counterInit, Workdir: "/work", Files: map[string][]byte{"work/hello": []byte("hi\n")}})
	t.Logf("start (template included) took %s", time.Since(t0))
	if got := run(t, m, "vm1", "cat hello"); got != "hi\n" {
		t.Fatalf("Files: /work/hello reads %q", got)
	}
	res, err := m.Exec(context.Background(), "vm1", []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, ExecOptions{Env: []string{"X=1"}})
	if err != nil || res.ExitCode != 3 || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" {
		t.Fatalf("exec: %+v %v", res, err)
	}
	waitCounter(t, m, "vm1", 3)
	run(t, m, "vm1", "date -s @1000000000 >/dev/null") // the guest's clock, far from the host's
	if err := m.SetClock(context.Background(), "vm1", time.Time{}); err != nil {
		t.Fatal(err)
	}
	guest, _ := strconv.ParseInt(strings.TrimSpace(run(t, m, "vm1", "date +%s")), 10, 64)
	if d := time.Now().Unix() - guest; d < -5 || d > 5 {
		t.Errorf("after SetClock the guest's clock is %d s from the host's", d)
	}
	if got := m.Sandboxes(); !slices.Equal(got, []string{"vm1"}) {
		t.Fatalf("Sandboxes() = %v", got)
	}
	t1 := time.Now()
	sb2 := start(t, m, Spec{ID: "vm2", Init: counterInit})
	t.Logf("start from the warm template took %s", time.Since(t1))
	for _, s := range []*Sandbox{sb2, sb} {
		if err := m.Stop(context.Background(), s.ID); err != nil {
			t.Fatal(err)
		}
		if alive(s.InitPID) {
			t.Errorf("QEMU %d of %s still alive after Stop", s.InitPID, s.ID)
		}
		if exists(m.boxes.dir(s.ID)) {
			t.Errorf("%s: directory %s still there after Stop", s.ID, m.boxes.dir(s.ID))
		}
	}
	if _, err := m.Exec(context.Background(), "vm1", []string{"true"}, ExecOptions{}); !errors.Is(err, ErrNotFound) {
		t.Errorf("exec after stop: %v, want ErrNotFound", err)
	}
}

// The acceptance test of issue 14 without a bus: a counter continues with
// the same pid after snapshot → kill -9 of the owner → restore, in two
// concurrent forks of one snapshot; their disks and counters are those of
// the snapshot's instant, their random state differs, nothing is left.
func TestMicroVMForksKeepProcessesAcrossAnOwnerCrash(t *testing.T) {
	tier.Long(t)
	requireMicroVM(t)
	state := t.TempDir()
	sd := build.StaticForTest(t, build.Sandboxd)[build.Sandboxd]
	// The first owner: another process, killed with SIGKILL once it took
	// the snapshot.
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), microvmOwnerEnv+"="+state, "STILLPOINT_TEST_SANDBOXD="+sd)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	var before, after, initPID int
	for lines.Scan() {
		if _, err := fmt.Sscanf(lines.Text(), "snapshotted %d %d %d", &before, &after, &initPID); err == nil {
			break
		}
		t.Logf("owner: %s", lines.Text())
	}
	if before == 0 {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("the first owner did not take the snapshot")
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	t.Logf("snapshot taken between counter %d and %d; owner killed", before, after)

	// Nobody renews the dead owner's VM: it powers itself off once its
	// lease runs out.
	left, err := readVMMeta(filepath.Join(state, "sandboxes", "crashed"))
	if err != nil || left.PID == 0 {
		t.Fatalf("the dead owner's vm.json: %+v %v", left, err)
	}
	t0 := time.Now()
	poll.Wait(t, 4*ownerTestLease, "the dead owner's VM to power itself off", func() bool { return !alive(left.PID) })
	t.Logf("the dead owner's VM powered off %s after the kill (lease %s)", time.Since(t0).Round(time.Millisecond), ownerTestLease)

	m := newMicroVM(t, state)
	defer cleanupMicroVM(t, m)
	// What the dead owner left: its sandbox (a restarted owner reaps it)
	// and its snapshot.
	if got := m.Sandboxes(); !slices.Equal(got, []string{"crashed"}) {
		t.Fatalf("Sandboxes() after the crash = %v, want [crashed]", got)
	}
	if err := m.Stop(context.Background(), "crashed"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	forks := []string{"fork-a", "fork-b"}
	errs := make([]error, len(forks))
	took := make([]time.Duration, len(forks))
	for i, id := range forks {
		wg.Go(func() {
			t0 := time.Now()
			_, errs[i] = m.Fork(context.Background(), "snap", Spec{ID: id, Init: counterInit, Workdir: "/work", Epoch: 2})
			took[i] = time.Since(t0)
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	t.Logf("two concurrent forks took %v", took)
	random := map[string]string{}
	for _, id := range forks {
		last, pid := counter(t, m, id)
		if last < before || last > after+50 {
			t.Errorf("%s: counter at %d just after the fork; the snapshot was taken between %d and %d", id, last, before, after)
		}
		if pid != initPID {
			t.Errorf("%s: counter pid %d, want %d (the snapshot's)", id, pid, initPID)
		}
		waitCounter(t, m, id, last+3) // it runs on, the same process, no gap
		random[id] = run(t, m, id, "head -c 16 /dev/urandom | od -An -tx1")
	}
	if random["fork-a"] == random["fork-b"] {
		t.Errorf("both forks read the same random bytes %q: the guest was not reseeded", random["fork-a"])
	}
	for _, id := range forks {
		if err := m.Stop(context.Background(), id); err != nil {
			t.Error(err)
		}
	}
	if err := m.DeleteSnapshot(context.Background(), "snap"); err != nil {
		t.Fatal(err)
	}
}

// ownerTestLease is the lease of the crash test's first owner: short, so
// that its VM powers off soon after the owner's death.
const ownerTestLease = 6 * time.Second

// microvmOwnerMain is the first owner of the crash test.
func microvmOwnerMain(state string) int {
	m, err := NewMicroVM(MicroVMConfig{StateDir: state, CacheDir: microvmCache(), Sandboxd: os.Getenv("STILLPOINT_TEST_SANDBOXD"), Accel: "tcg", Lease: ownerTestLease})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	if _, err := m.Start(ctx, Spec{ID: "crashed", Init: counterInit, Workdir: "/work"}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	last := func() (int, int) {
		res, err := m.Exec(ctx, "crashed", []string{"sh", "-c", "tail -n1 /work/counter"}, ExecOptions{})
		var i, pid int
		if err == nil {
			fmt.Sscanf(string(res.Stdout), "%d %d", &i, &pid)
		}
		return i, pid
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	_ = poll.Until(wctx, poll.Every(200*time.Millisecond), func() (bool, error) { i, _ := last(); return i >= 5, nil })
	cancel()
	before, _ := last()
	s, err := m.Snapshot(ctx, "crashed", "snap")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	after, pid := last()
	fmt.Fprintf(os.Stderr, "snapshot: paused %s, %d bytes\n", s.Took, s.Size)
	fmt.Printf("snapshotted %d %d %d\n", before, after, pid)
	select {} // until killed
}

// Binds beside the bin directory (OpenCode's, at /opt/stillpoint/opencode)
// are shown read-only on the one harness disk, mounted at
// HarnessRootInGuest, each at its place; a bind elsewhere is refused.
func TestMicroVMShowsSeveralBindsOnOneDisk(t *testing.T) {
	tier.Long(t)
	m := newMicroVM(t, t.TempDir())
	defer cleanupMicroVM(t, m)
	bin, oc := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "tool"), []byte("bin\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(oc, "lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(oc, "lib", "x"), []byte("opencode\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Start(context.Background(), Spec{ID: "bad", Init: counterInit, Binds: []Bind{{HostDir: bin, SandboxDir: "usr/local/x"}}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("a bind outside %s: %v, want ErrInvalid", HarnessRootInGuest, err)
	}
	start(t, m, Spec{ID: "vm1", Init: counterInit, Binds: []Bind{{HostDir: bin, SandboxDir: "opt/stillpoint/bin"}, {HostDir: oc, SandboxDir: "opt/stillpoint/opencode"}}})
	if got := run(t, m, "vm1", "cat /opt/stillpoint/bin/tool /opt/stillpoint/opencode/lib/x"); got != "bin\nopencode\n" {
		t.Fatalf("the binds read %q", got)
	}
	if got := run(t, m, "vm1", "touch /opt/stillpoint/bin/new 2>/dev/null && echo writable || echo read-only"); got != "read-only\n" {
		t.Fatalf("the harness disk is %q", got)
	}
}
