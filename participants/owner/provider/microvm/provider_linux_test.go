//go:build linux

package microvm

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
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
	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/internal/testcpu"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/boxes"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/procs"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm/qemu"
	"github.com/stillpoint/stillpoint/participants/owner/provider/providertest"
	"github.com/stillpoint/stillpoint/sandboxd/vmctl"
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
// kernel is missing, naming what to install; then it waits for a core of
// the machine (testcpu) and holds it for the test: a guest under TCG keeps
// one busy.
func requireMicroVM(t testing.TB) {
	t.Helper()
	providertest.RequireRoot(t)
	if _, err := qemu.FindAssets(""); err != nil {
		t.Fatalf("the microvm provider's tests need QEMU and the guest kernel: %v", err)
	}
	testcpu.Take(t, 1)
}

func newMicroVM(t testing.TB, state string) *Provider {
	t.Helper()
	requireMicroVM(t)
	sd := build.StaticForTest(t, build.Sandboxd)[build.Sandboxd]
	m, err := New(Config{StateDir: state, CacheDir: microvmCache(), PruneCache: true, Sandboxd: sd, Accel: "tcg", Lease: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// cleanupMicroVM stops what is left, deletes the snapshots and checks
// that nothing of the provider's sandboxes is left: no QEMU, no layer, no
// socket, no directory.
func cleanupMicroVM(t testing.TB, m *Provider) {
	t.Helper()
	providertest.Cleanup(t, m)
	checkMicroVMEmpty(t, m)
}

func checkMicroVMEmpty(t testing.TB, m *Provider) {
	t.Helper()
	if providertest.Exists(m.socks) {
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
	// QEMU's relays run in sessions of their own, with command lines that
	// name neither QEMU nor the state directory: the VMs' cgroups hold
	// them.
	if m.cgroups == "" {
		t.Error("the provider runs without the VMs' cgroups")
	} else if providertest.Exists(string(m.cgroups)) {
		pids, _ := m.cgroups.AllProcs()
		t.Errorf("the VMs' cgroup %s is still there, holding %v", m.cgroups, pids)
	}
}

// qemusUnder lists the live QEMUs whose command line names dir (their
// relays name neither: checkMicroVMEmpty looks at the VMs' cgroups for
// those).
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
func counter(t testing.TB, p provider.Provider, id string) (last, pid int) {
	t.Helper()
	out := providertest.Sh(t, p, id, "cat /work/counter")
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

// consoleCounter reads the "counter N PID" lines of a console file: the
// first N and how many follow it one by one, all of pid (a gap, a repeat
// or another pid fails the test).
func consoleCounter(t testing.TB, path string, pid int) (first, n int) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	prev := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		var i, pp int
		if _, err := fmt.Sscanf(strings.TrimSpace(line), "counter %d %d", &i, &pp); err != nil {
			continue // the kernel's and sandboxd's lines
		}
		if pp != pid || (prev != 0 && i != prev+1) {
			t.Fatalf("%s: console line %q after counter %d: a gap, a repeat or another process than %d", path, line, prev, pid)
		}
		if first == 0 {
			first = i
		}
		prev = i
		n++
	}
	return first, n
}

func waitCounter(t testing.TB, p provider.Provider, id string, atLeast int) int {
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
	sb := providertest.Start(t, m, provider.Spec{ID: "vm1", Init: counterInit, Workdir: "/work", Files: map[string][]byte{"work/hello": []byte("hi\n")}})
	t.Logf("start (template included) took %s", time.Since(t0))
	if got := providertest.Sh(t, m, "vm1", "cat hello"); got != "hi\n" {
		t.Fatalf("Files: /work/hello reads %q", got)
	}
	res, err := m.Exec(context.Background(), "vm1", []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, provider.ExecOptions{Env: []string{"X=1"}})
	if err != nil || res.ExitCode != 3 || string(res.Stdout) != "out\n" || string(res.Stderr) != "err\n" {
		t.Fatalf("exec: %+v %v", res, err)
	}
	// Output beyond what an answer's line holds is cut, and said so.
	res, err = m.Exec(context.Background(), "vm1", []string{"sh", "-c", fmt.Sprintf("head -c %d /dev/zero", vmctl.MaxOutput+1)}, provider.ExecOptions{})
	if !errors.Is(err, qemu.ErrOutputTruncated) || len(res.Stdout) != vmctl.MaxOutput {
		t.Fatalf("exec with %d bytes of output: %d bytes, %v; want %d and ErrOutputTruncated", vmctl.MaxOutput+1, len(res.Stdout), err, vmctl.MaxOutput)
	}
	waitCounter(t, m, "vm1", 3)
	providertest.Sh(t, m, "vm1", "date -s @1000000000 >/dev/null") // the guest's clock, far from the host's
	if err := m.SetClock(context.Background(), "vm1", time.Time{}); err != nil {
		t.Fatal(err)
	}
	guest, _ := strconv.ParseInt(strings.TrimSpace(providertest.Sh(t, m, "vm1", "date +%s")), 10, 64)
	if d := time.Now().Unix() - guest; d < -5 || d > 5 {
		t.Errorf("after SetClock the guest's clock is %d s from the host's", d)
	}
	if got := m.Sandboxes(); !slices.Equal(got, []string{"vm1"}) {
		t.Fatalf("Sandboxes() = %v", got)
	}
	t1 := time.Now()
	sb2 := providertest.Start(t, m, provider.Spec{ID: "vm2", Init: counterInit})
	t.Logf("start from the warm template took %s", time.Since(t1))
	for _, s := range []*provider.Sandbox{sb2, sb} {
		if err := m.Stop(context.Background(), s.ID); err != nil {
			t.Fatal(err)
		}
		if procs.Alive(s.InitPID) {
			t.Errorf("QEMU %d of %s still alive after Stop", s.InitPID, s.ID)
		}
		if providertest.Exists(m.boxes.Dir(s.ID)) {
			t.Errorf("%s: directory %s still there after Stop", s.ID, m.boxes.Dir(s.ID))
		}
	}
	if _, err := m.Exec(context.Background(), "vm1", []string{"true"}, provider.ExecOptions{}); !errors.Is(err, provider.ErrNotFound) {
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
	left, err := vmFile(filepath.Join(state, "sandboxes", "crashed")).Read()
	if err != nil || left.PID == 0 {
		t.Fatalf("the dead owner's vm.json: %+v %v", left, err)
	}
	t0 := time.Now()
	poll.Wait(t, 4*ownerTestLease, "the dead owner's VM to power itself off", func() bool { return !procs.Alive(left.PID) })
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
			_, errs[i] = m.Fork(context.Background(), "snap", provider.Spec{ID: id, Init: counterInit, Workdir: "/work", Epoch: 2})
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
		random[id] = providertest.Sh(t, m, id, "head -c 16 /dev/urandom | od -An -tx1")
		// The console too: the fork's console file holds what the counter
		// wrote since the restore, from the snapshot's instant on.
		var first, n int
		poll.Wait(t, time.Minute, id+"'s console counter", func() bool {
			first, n = consoleCounter(t, filepath.Join(m.boxes.Dir(id), "console.log"), initPID)
			return n >= 3
		})
		if first <= before || first > after+1 {
			t.Errorf("%s: the console counter starts at %d after the fork; the snapshot was taken between %d and %d", id, first, before, after)
		}
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
	m, err := New(Config{StateDir: state, CacheDir: microvmCache(), Sandboxd: os.Getenv("STILLPOINT_TEST_SANDBOXD"), Accel: "tcg", Lease: ownerTestLease})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx := context.Background()
	if _, err := m.Start(ctx, provider.Spec{ID: "crashed", Init: counterInit, Workdir: "/work"}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	last := func() (int, int) {
		res, err := m.Exec(ctx, "crashed", []string{"sh", "-c", "tail -n1 /work/counter"}, provider.ExecOptions{})
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

// TestMicroVMStopIsRetriedAndKeepsTheRecord: a Stop whose QEMU is not
// reaped in time fails and removes nothing (vm.json is the only record of
// the process); the next Stop checks again and, once QEMU is gone, removes
// the rest. A process the test holds stands in for a QEMU whose reaping is
// late.
func TestMicroVMStopIsRetriedAndKeepsTheRecord(t *testing.T) {
	state := t.TempDir()
	m := &Provider{cfg: Config{StateDir: state, StopTimeout: 50 * time.Millisecond},
		boxes: boxes.NewRegistry[*vmBox](state), layers: filepath.Join(state, "layers"), socks: filepath.Join(state, "s")}
	for _, d := range []string{m.layers, filepath.Join(state, "sandboxes")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	vm := &machine{id: "late", pid: cmd.Process.Pid, exited: make(chan struct{}), reaped: make(chan struct{})}
	box, err := m.boxes.Reserve("late", func() *vmBox { return &vmBox{vm: vm} }, nil)
	if err != nil {
		t.Fatal(err)
	}
	box.Mu.Unlock()
	dir := m.boxes.Dir("late")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := vmFile(dir).Write(vmMeta{PID: vm.pid}); err != nil {
		t.Fatal(err)
	}
	if err := m.Stop(context.Background(), "late"); !errors.Is(err, provider.ErrLeftover) {
		t.Fatalf("Stop of a QEMU not reaped yet: %v, want ErrLeftover", err)
	}
	if _, err := vmFile(dir).Read(); err != nil {
		t.Fatalf("a failed Stop removed the record of the process: %v", err)
	}
	<-exited // stop's SIGKILL took it; now the machine is reaped
	close(vm.exited)
	close(vm.reaped)
	if err := m.Stop(context.Background(), "late"); err != nil {
		t.Fatalf("Stop once QEMU is reaped: %v (a stale error of the first call?)", err)
	}
	if providertest.Exists(dir) {
		t.Errorf("%s still there after a Stop that succeeded", dir)
	}
}

// TestMicroVMSnapshotCancelledMidMigrationRunsOn: a Snapshot whose ctx
// ends while the VM's state is being written fails, but leaves no
// migration running and the VM running (a paused guest's lease cannot
// fire); the next Snapshot succeeds and so does a fork of it.
func TestMicroVMSnapshotCancelledMidMigrationRunsOn(t *testing.T) {
	tier.Long(t)
	state := t.TempDir()
	m := newMicroVM(t, state)
	defer cleanupMicroVM(t, m)
	providertest.Start(t, m, provider.Spec{ID: "vm1", Init: counterInit, Workdir: "/work"})
	waitCounter(t, m, "vm1", 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watching := make(chan struct{})
	go func() { // cancels ctx once the RAM file is being written: mid-migration
		defer close(watching)
		wctx, wcancel := context.WithTimeout(ctx, time.Minute)
		defer wcancel()
		_ = poll.Until(wctx, poll.Every(time.Millisecond), func() (bool, error) {
			files, _ := filepath.Glob(filepath.Join(state, "snapshots", "*", ramFile))
			for _, f := range files {
				if fi, err := os.Stat(f); err == nil && allocated(fi) > 0 {
					return true, nil
				}
			}
			return false, nil
		})
		cancel()
	}()
	_, err := m.Snapshot(ctx, "vm1", "s1")
	<-watching
	t.Logf("the snapshot cancelled mid-migration: %v", err)
	if err == nil {
		t.Log("the migration completed before the cancel: the rest checks the resume alone")
		if err := m.DeleteSnapshot(context.Background(), "s1"); err != nil {
			t.Fatal(err)
		}
	}
	box, err := m.boxes.Get("vm1")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := box.vm.qmp.Status(context.Background()); err != nil || st != "running" {
		t.Fatalf("after the cancelled snapshot the VM is %q (%v), want running", st, err)
	}
	last, _ := counter(t, m, "vm1")
	waitCounter(t, m, "vm1", last+3)
	providertest.Snapshot(t, m, "vm1", "s2") // refused while a migration is left running
	if _, err := m.Fork(context.Background(), "s2", provider.Spec{ID: "vm2", Init: counterInit, Workdir: "/work", Epoch: 2}); err != nil {
		t.Fatal(err)
	}
	last, _ = counter(t, m, "vm2")
	waitCounter(t, m, "vm2", last+2)
}

// TestMicroVMReapsWhatATemplateBuildLeft: the QEMU of a template whose
// builder died (vm.json names it, nobody holds the template's lock) is
// killed when a provider starts; one being built by a live process (its
// lock held) is left alone. Sleeps stand in for the QEMUs.
func TestMicroVMReapsWhatATemplateBuildLeft(t *testing.T) {
	cache := t.TempDir()
	m := &Provider{cfg: Config{StopTimeout: 10 * time.Second}, cache: cache}
	leftover := func(key string) (*exec.Cmd, chan struct{}) {
		cmd := exec.Command("sleep", "60")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(waited) }()
		t.Cleanup(func() { _ = cmd.Process.Kill(); <-waited })
		st, _, err := procfs.ReadStat(cmd.Process.Pid, nil)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(cache, "templates", key)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := vmFile(dir).Write(vmMeta{PID: cmd.Process.Pid, Start: st.Start}); err != nil {
			t.Fatal(err)
		}
		return cmd, waited
	}
	_, dead := leftover("dead")
	_, building := leftover("building")
	unlock, err := lockFile(filepath.Join(cache, "templates", "building.lock"))
	if err != nil {
		t.Fatal(err)
	}
	defer unlock()
	if err := m.reapTemplateLeftovers(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-dead:
	case <-time.After(10 * time.Second):
		t.Fatal("the QEMU of a dead builder's template still runs")
	}
	select {
	case <-building:
		t.Fatal("the QEMU of a template a live process is building was killed")
	default:
	}
}

// TestMicroVMNetdevAddresses: the NATS and upstream addresses go into
// QEMU's -netdev option, where a comma would add options (restrict=off):
// only host:port with an IP address or DNS name passes.
func TestMicroVMNetdevAddresses(t *testing.T) {
	for _, tc := range []struct {
		url  string
		host string // "" when refused
	}{
		{"nats://127.0.0.1:4222", "127.0.0.1:4222"},
		{"nats://localhost:4300", "127.0.0.1:4300"},
		{"nats://nats.example:4222", "nats.example:4222"},
		{"nats://[::1]:4222", "[::1]:4222"},
		{"nats://h,restrict=off:4222", ""},
		{"nats://h:4222,restrict=off", ""},
	} {
		_, host, _, err := natsForward(1, tc.url)
		if tc.host == "" {
			if !errors.Is(err, provider.ErrInvalid) {
				t.Errorf("%s: host %q, %v; want ErrInvalid", tc.url, host, err)
			}
			continue
		}
		if err != nil || host != tc.host {
			t.Errorf("%s: host %q, %v; want %q", tc.url, host, err, tc.host)
		}
	}
	for _, up := range []string{"10.0.0.1:80,restrict=off", "a b:80", "h:x"} {
		cfg := Config{StateDir: "/s", Upstream: up}
		cfg.setDefaults()
		if err := cfg.Validate(); !errors.Is(err, provider.ErrInvalid) || !strings.Contains(err.Error(), "Upstream") {
			t.Errorf("Upstream %q: %v, want ErrInvalid naming Upstream", up, err)
		}
	}
}

// TestMicroVMPruneKeepsWhatAnotherStateDirStandsOn: a provider pruning a
// shared cache keeps the template another owner's snapshot stands on (its
// disk chain ends in the template's disk), however old and unused.
func TestMicroVMPruneKeepsWhatAnotherStateDirStandsOn(t *testing.T) {
	cache, stateA, stateB := t.TempDir(), t.TempDir(), t.TempDir()
	old := time.Now().Add(-2 * PruneUnused)
	var tmpls []string
	for i := range PruneKeep + 2 {
		d := filepath.Join(cache, "templates", fmt.Sprintf("t%d", i))
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := vmFile(d).Write(vmMeta{Chain: []string{filepath.Join(d, "disk.qcow2")}}); err != nil {
			t.Fatal(err)
		}
		c := filepath.Join(d, "complete")
		if err := os.WriteFile(c, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		used := old.Add(time.Duration(i) * time.Minute) // t0 is the least recently used
		if err := os.Chtimes(c, used, used); err != nil {
			t.Fatal(err)
		}
		tmpls = append(tmpls, d)
	}
	b := &Provider{cfg: Config{StateDir: stateB}, cache: cache}
	if err := b.registerCacheUser(); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(stateB, "snapshots", "s1")
	if err := os.MkdirAll(snap, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := vmFile(snap).Write(vmMeta{Chain: []string{filepath.Join(stateB, "layers", "x.qcow2"), filepath.Join(tmpls[0], "disk.qcow2")}}); err != nil {
		t.Fatal(err)
	}
	a := &Provider{cfg: Config{StateDir: stateA}, cache: cache}
	if err := a.registerCacheUser(); err != nil {
		t.Fatal(err)
	}
	if err := a.pruneCache(); err != nil {
		t.Fatal(err)
	}
	if !providertest.Exists(tmpls[0]) {
		t.Error("the template another state directory's snapshot stands on was pruned")
	}
	if providertest.Exists(tmpls[1]) {
		t.Error("an old template nobody stands on beyond the newest PruneKeep was kept")
	}
}

// TestMicroVMStopKillsTheRelays: the relays of a VM's guestfwd rules
// (busybox nc, which libslirp starts in sessions of their own, out of
// reach of a kill of QEMU's group) die with the VM. The upstream is a
// listener whose accept queue is full, so the relay of a guest connection
// hangs in connect (one with a connection ends when QEMU's end closes).
func TestMicroVMStopKillsTheRelays(t *testing.T) {
	tier.Long(t)
	requireMicroVM(t)
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil { // room for one connection, never accepted
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	upstream := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
	filler, err := net.DialTimeout("tcp", upstream, 10*time.Second) // fills the queue
	if err != nil {
		t.Fatal(err)
	}
	defer filler.Close()
	sd := build.StaticForTest(t, build.Sandboxd)[build.Sandboxd]
	m, err := New(Config{StateDir: t.TempDir(), CacheDir: microvmCache(), PruneCache: true, Sandboxd: sd,
		Accel: "tcg", Lease: 20 * time.Second, Upstream: upstream})
	if err != nil {
		t.Fatal(err)
	}
	defer cleanupMicroVM(t, m)
	providertest.Start(t, m, provider.Spec{ID: "vm1"})
	providertest.Sh(t, m, "vm1", "setsid sh -c 'sleep 600 | nc "+strings.Replace(qemu.GuestUpstream, ":", " ", 1)+"' </dev/null >/dev/null 2>&1 &")
	relays := func() []int { // busybox nc 127.0.0.1 <port>, hanging in connect
		var out []int
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || !procs.Alive(pid) {
				continue
			}
			b, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if args := strings.Split(string(b), "\x00"); len(args) >= 4 && strings.HasSuffix(args[0], "busybox") && args[1] == "nc" &&
				args[2] == "127.0.0.1" && "127.0.0.1:"+args[3] == upstream {
				out = append(out, pid)
			}
		}
		return out
	}
	poll.Wait(t, time.Minute, "the relay of the guest's connection", func() bool { return len(relays()) > 0 })
	pids := relays()
	if in, err := m.vmCgroup("vm1").AllProcs(); err != nil || !slices.Contains(in, pids[0]) {
		t.Errorf("the VM's cgroup holds %v (%v), not the relay %d", in, err, pids[0])
	}
	if err := m.Stop(context.Background(), "vm1"); err != nil {
		t.Fatal(err)
	}
	if left := relays(); len(left) > 0 {
		t.Fatalf("the relays %v outlived their VM's Stop", left)
	}
}

// TestMicroVMInitExited: the plain init of a guest exits (as in
// TestOverlayInitExited), the guest tells the host, and Exec refuses with
// ErrExited. Sandbox.InitPID is QEMU's pid, which lives on: the guest's
// init is not a host process (PROVIDERS.md).
func TestMicroVMInitExited(t *testing.T) {
	tier.Long(t)
	m := newMicroVM(t, t.TempDir())
	defer cleanupMicroVM(t, m)
	sb := providertest.Start(t, m, provider.Spec{ID: "short", Init: []string{"sh", "-c", "read x"}}) // stdin is /dev/null: exits at once
	poll.Wait(t, time.Minute, "Exec to refuse", func() bool {
		_, err := m.Exec(context.Background(), "short", []string{"true"}, provider.ExecOptions{})
		return errors.Is(err, provider.ErrExited)
	})
	if !procs.Alive(sb.InitPID) {
		t.Errorf("QEMU %d exited with the guest's init", sb.InitPID)
	}
	providertest.Stop(t, m, sb)
}

// TestMicroVMConcurrent: TestOverlayConcurrent on microvm (start, exec,
// snapshot, fork and stop of several sandboxes at once).
func TestMicroVMConcurrent(t *testing.T) {
	tier.Long(t)
	m := newMicroVM(t, t.TempDir())
	defer cleanupMicroVM(t, m)
	providertest.Concurrent(t, m)
}

// TestMicroVMStopsLeftovers: TestOverlayStopsLeftovers on microvm. A
// second provider on the same state directory lists the first one's
// sandbox, refuses to start over it, and stops it (its QEMU, found by
// vm.json, and its cgroup); the first provider's Stop then still confirms.
func TestMicroVMStopsLeftovers(t *testing.T) {
	tier.Long(t)
	m := newMicroVM(t, t.TempDir())
	defer cleanupMicroVM(t, m)
	sb := providertest.Start(t, m, provider.Spec{ID: "orphan"})
	again, err := New(m.cfg)
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
	if procs.Alive(sb.InitPID) {
		t.Errorf("QEMU %d still alive after the second provider's Stop", sb.InitPID)
	}
	if providertest.Exists(m.boxes.Dir("orphan")) || providertest.Exists(string(m.vmCgroup("orphan"))) {
		t.Error("the leftover's directory or cgroup is still there")
	}
	providertest.Stop(t, m, sb)
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
	if _, err := m.Start(context.Background(), provider.Spec{ID: "bad", Init: counterInit, Binds: []provider.Bind{{HostDir: bin, SandboxDir: "usr/local/x"}}}); !errors.Is(err, provider.ErrInvalid) {
		t.Fatalf("a bind outside %s: %v, want ErrInvalid", HarnessRootInGuest, err)
	}
	providertest.Start(t, m, provider.Spec{ID: "vm1", Init: counterInit, Binds: []provider.Bind{{HostDir: bin, SandboxDir: "opt/stillpoint/bin"}, {HostDir: oc, SandboxDir: "opt/stillpoint/opencode"}}})
	if got := providertest.Sh(t, m, "vm1", "cat /opt/stillpoint/bin/tool /opt/stillpoint/opencode/lib/x"); got != "bin\nopencode\n" {
		t.Fatalf("the binds read %q", got)
	}
	if got := providertest.Sh(t, m, "vm1", "touch /opt/stillpoint/bin/new 2>/dev/null && echo writable || echo read-only"); got != "read-only\n" {
		t.Fatalf("the harness disk is %q", got)
	}
}
