package sandboxd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// Binaries the tests build before any supervisor starts: once a supervisor
// runs, its reap loop reaps every child of the test process, so os/exec's
// Wait must not be used after that.
var (
	threadsBin  string
	sandboxdBin string
)

func TestMain(m *testing.M) {
	code := func() int {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		bins, err := build.Static(ctx, "./sandboxd/testdata/threads", build.Sandboxd)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		threadsBin, sandboxdBin = bins["./sandboxd/testdata/threads"], bins[build.Sandboxd]
		code := m.Run()
		cleanupBenchTrees()
		if code == 0 {
			if err := leak.Find(); err != nil {
				fmt.Fprintln(os.Stderr, "goroutines left behind:", err)
				return 1
			}
		}
		return code
	}()
	os.Exit(code)
}

// requireTool fails the test (never skips) when a command is missing.
func requireTool(t testing.TB, name, hint string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("%s is required by this test and is not in PATH: %s", name, hint)
	}
	return p
}

// testPrefix is a short id prefix unique to the test, so that its launches
// (and their tags) can be told from any other.
func testPrefix(t testing.TB) string {
	h := fnv.New32a()
	h.Write([]byte(t.Name()))
	return fmt.Sprintf("t%08x", h.Sum32())
}

func launchID(t testing.TB, s string) string { return testPrefix(t) + "-" + s }

// testCgroupRoot makes a cgroup for the test's launches under the
// supervisor's default subtree and, at cleanup, checks that no launch
// cgroup is left in it and removes it.
func testCgroupRoot(t testing.TB) string {
	t.Helper()
	own, err := cgroup.Self()
	if err != nil {
		t.Fatalf("freeze mode needs cgroup v2: %v (run as root on a host with cgroup v2 mounted and writable)", err)
	}
	parent := filepath.Join(string(own), CgroupSubtree)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		t.Fatalf("freeze mode needs a writable cgroup v2 (run the tests as root): %v", err)
	}
	dir := filepath.Join(parent, testPrefix(t)+"-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("freeze mode needs a writable cgroup v2 (run the tests as root): %v", err)
	}
	t.Cleanup(func() {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if e.IsDir() {
				t.Errorf("cgroup %s left behind", filepath.Join(dir, e.Name()))
				left := cgroup.Dir(filepath.Join(dir, e.Name()))
				_ = left.Kill()
				_ = removeCgroup(left)
			}
		}
		if err := os.Remove(dir); err != nil {
			t.Errorf("remove test cgroup: %v", err)
		}
		_ = os.Remove(parent) // shared; fails while others use it
	})
	return dir
}

// startSupervisor creates and runs a supervisor for the test. Freeze mode
// gets a cgroup root of the test's own; stop mode runs without cgroups, as
// on a host without cgroup v2. Cleanup stops it, waits for Run, and checks
// that nothing the test started is left: no child of the test process, no
// process with the test's tag, no cgroup.
func startSupervisor(t testing.TB, cfg Config) *Supervisor {
	t.Helper()
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	if !cfg.NoCgroup && cfg.CgroupRoot == "" {
		cfg.CgroupRoot = testCgroupRoot(t)
	}
	if cfg.Grace == 0 {
		cfg.Grace = 2 * time.Second
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
		checkNothingLeft(t)
	})
	return s
}

// checkNothingLeft fails the test if a child of the test process or a
// process tagged with one of the test's launch ids is still there.
func checkNothingLeft(t testing.TB) {
	t.Helper()
	prefix := []byte(EnvTag + "=" + testPrefix(t))
	var left string
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := poll.Until(ctx, poll.Backoff(time.Millisecond, 20*time.Millisecond), func() (bool, error) {
		kids, _ := selfChildren(nil)
		tagged := taggedWithPrefix(prefix)
		left = fmt.Sprintf("children %v, tagged %v", kids, tagged)
		return len(kids) == 0 && len(tagged) == 0, nil
	})
	if err != nil {
		t.Errorf("processes left behind: %s", left)
	}
}

func taggedWithPrefix(prefix []byte) []int {
	pids, _ := procfs.PIDs()
	var out []int
	for _, pid := range pids {
		if pid == os.Getpid() {
			continue
		}
		st, _, err := procfs.ReadStat(pid, nil)
		if err != nil || st.State == 'Z' {
			continue
		}
		b, err := procfs.ReadFile(procfs.Path(pid, "/environ"), nil)
		if err != nil {
			continue
		}
		for e := range bytes.SplitSeq(b, []byte{0}) {
			if bytes.HasPrefix(e, prefix) {
				out = append(out, pid)
				break
			}
		}
	}
	return out
}

// launchPIDs lists every live process of launch id on the host: those with
// its tag, plus the tree under the harness (which finds the ones that
// cleared their environment).
func launchPIDs(t testing.TB, s *Supervisor, id string) []int {
	t.Helper()
	rec, err := s.Status(id)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	var out []int
	add := func(pid int) {
		if !seen[pid] {
			seen[pid] = true
			out = append(out, pid)
		}
	}
	for _, p := range scanHost(launchMark{tag: []byte(EnvTag + "=" + id), rootPID: rec.PID, rootStart: rec.PIDStart}, newWalker()) {
		add(p.pid)
	}
	if rec.PID > 0 {
		for _, pid := range treeOf(rec.PID) {
			add(pid)
		}
	}
	return out
}

// treeOf lists pid and its descendants.
func treeOf(pid int) []int {
	var out []int
	level := []int{pid}
	for len(level) > 0 {
		var next []int
		for _, p := range level {
			st, _, err := procfs.ReadStat(p, nil)
			if err != nil || st.State == 'Z' {
				continue
			}
			out = append(out, p)
			next, _, _ = procfs.Children(p, st.Threads, nil, next)
		}
		level = next
	}
	return out
}

// cpuTicks returns utime+stime of each pid (gone ones are left out).
func cpuTicks(pids []int) map[int]uint64 {
	m := map[int]uint64{}
	for _, pid := range pids {
		if st, _, err := procfs.ReadStat(pid, nil); err == nil {
			m[pid] = st.UTime + st.STime
		}
	}
	return m
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return -1
	}
	return fi.Size()
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return string(b)
}

func stateOf(pid int) byte {
	st, _, err := procfs.ReadStat(pid, nil)
	if err != nil {
		return 0
	}
	return st.State
}

// procID names a process for as long as the machine runs: a pid alone is
// given to another process once its own is gone, and on a busy machine the
// pids wrap within a test run.
type procID struct {
	pid   int
	start uint64
}

// procsOf names the processes of pids that are there now.
func procsOf(pids []int) []procID {
	var out []procID
	for _, pid := range pids {
		if st, _, err := procfs.ReadStat(pid, nil); err == nil {
			out = append(out, procID{pid, st.Start})
		}
	}
	return out
}

// state returns the state letter of p, or 0 when p is gone, its pid now
// another process's or nobody's.
func (p procID) state() byte {
	st, _, err := procfs.ReadStat(p.pid, nil)
	if err != nil || st.Start != p.start {
		return 0
	}
	return st.State
}

func commOf(pid int) string {
	b, err := os.ReadFile(procfs.Path(pid, "/comm"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// findComm waits until a process named comm is in the launch and returns
// its pid.
func findComm(t testing.TB, s *Supervisor, id, comm string) int {
	t.Helper()
	var pid int
	poll.Wait(t, 10*time.Second, comm+" in launch "+id, func() bool {
		for _, p := range launchPIDs(t, s, id) {
			if commOf(p) == comm {
				pid = p
				return true
			}
		}
		return false
	})
	return pid
}

// mustLaunch launches and fails the test on error.
func mustLaunch(t testing.TB, s *Supervisor, spec Spec) sandboxapi.Record {
	t.Helper()
	rec, err := s.Launch(context.Background(), spec)
	if err != nil {
		t.Fatalf("Launch %s: %v", spec.ID, err)
	}
	return rec
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// modes are the two confirming pause modes, each with the supervisor
// configuration that goes with it.
var pauseModes = []struct {
	name string
	mode sandboxapi.Mode
	cfg  Config
}{
	{"freeze", sandboxapi.ModeFreeze, Config{Mode: sandboxapi.ModeFreeze}},
	{"stop", sandboxapi.ModeStop, Config{Mode: sandboxapi.ModeStop, NoCgroup: true}},
}
