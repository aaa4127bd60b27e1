package sandboxd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// The benchmarks pause and continue real process trees: flat (a dash
// that starts N-1 sleeps) and nested (a chain N/2 deep of dash, each with
// a sleep and the next dash). A tree is built once, outside the timer, the
// first time a sub-benchmark needs it, and killed when the sub-benchmarks
// of its shape and size are done. They run under one supervisor with
// cgroups, so every mode pauses the same tree.
//
//	go test -run '^$' -bench 'Pause|RawFreeze' -benchtime 20x ./sandboxd/

var bench struct {
	mu     sync.Mutex
	s      *Supervisor
	cancel context.CancelFunc
	errc   chan error
	root   string
	state  string
	script string
	n      int
}

// benchSupervisor starts the benchmarks' supervisor once.
func benchSupervisor(b *testing.B) *Supervisor {
	b.Helper()
	bench.mu.Lock()
	defer bench.mu.Unlock()
	if bench.s != nil {
		return bench.s
	}
	own, err := cgroup.Self()
	if err != nil {
		b.Fatalf("the benchmarks need cgroup v2: %v", err)
	}
	bench.root = filepath.Join(string(own), CgroupSubtree, "bench-"+strconv.Itoa(os.Getpid()))
	if err := os.MkdirAll(bench.root, 0o755); err != nil {
		b.Fatalf("the benchmarks need a writable cgroup v2 (run as root): %v", err)
	}
	bench.state, err = os.MkdirTemp("", "sandboxd-bench-")
	if err != nil {
		b.Fatal(err)
	}
	bench.script = filepath.Join(bench.state, "nest.sh")
	nest := "sleep 100000 &\nif [ \"$1\" -gt 1 ]; then sh \"$0\" $(($1 - 1)) & fi\nwait\n"
	if err := os.WriteFile(bench.script, []byte(nest), 0o755); err != nil {
		b.Fatal(err)
	}
	s, err := New(Config{StateDir: bench.state, CgroupRoot: bench.root, Grace: 100 * time.Millisecond, KillTimeout: 30 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	bench.s, bench.cancel, bench.errc = s, cancel, make(chan error, 1)
	go func() { bench.errc <- s.Run(ctx) }()
	return s
}

// cleanupBenchTrees stops the benchmarks' supervisor (which kills what is
// left) and removes its cgroup root and state; TestMain calls it.
func cleanupBenchTrees() {
	bench.mu.Lock()
	defer bench.mu.Unlock()
	if bench.s == nil {
		return
	}
	bench.cancel()
	if err := <-bench.errc; err != nil {
		fmt.Fprintln(os.Stderr, "bench supervisor:", err)
	}
	_ = os.Remove(bench.root)
	_ = os.Remove(filepath.Dir(bench.root))
	_ = os.RemoveAll(bench.state)
	bench.s = nil
}

// benchTree is one tree, built on first use.
type benchTree struct {
	shape string
	n     int
	id    string
	built bool
	s     *Supervisor
}

func (tr *benchTree) get(b *testing.B) *Supervisor {
	b.Helper()
	if tr.built {
		return tr.s
	}
	tr.s = benchSupervisor(b)
	bench.mu.Lock()
	bench.n++
	tr.id = fmt.Sprintf("bench-%s-%d-%d", tr.shape, tr.n, bench.n)
	bench.mu.Unlock()
	cmd := fmt.Sprintf(`i=1; while [ $i -lt %d ]; do sleep 100000 & i=$((i+1)); done; wait`, tr.n)
	if tr.shape == "nested" {
		cmd = fmt.Sprintf(`exec sh %s %d`, bench.script, tr.n/2)
	}
	rec, err := tr.s.Launch(context.Background(), Spec{ID: tr.id, Command: cmd})
	if err != nil {
		b.Fatal(err)
	}
	tr.built = true
	c := cgroup.Dir(rec.Cgroup)
	poll.Wait(b, 2*time.Minute, fmt.Sprintf("the %s tree of %d processes", tr.shape, tr.n), func() bool {
		pids, _ := c.AllProcs()
		return len(pids) >= tr.n
	})
	return tr.s
}

func (tr *benchTree) kill(b *testing.B) {
	if !tr.built {
		return
	}
	if _, err := tr.s.Cancel(context.Background(), tr.id); err != nil {
		b.Errorf("kill %s tree of %d: %v", tr.shape, tr.n, err)
	}
}

var benchSizes = []int{100, 1000, 2400}

// BenchmarkPause pauses (and confirms) and continues a tree through
// Supervisor.Pause and Supervisor.Continue: freeze (cgroup.freeze), stop
// (the level-ordered SIGSTOP walk) and scan (the baseline the walk
// replaced: a full /proc scan, SIGSTOP, rescan, confirm).
func BenchmarkPause(b *testing.B) {
	modes := []struct {
		name string
		mode sandboxapi.Mode
	}{{"freeze", sandboxapi.ModeFreeze}, {"stop", sandboxapi.ModeStop}, {"scan", modeScan}}
	for _, shape := range []string{"flat", "nested"} {
		for _, n := range tier.Sizes(benchSizes...) {
			tr := &benchTree{shape: shape, n: n}
			for _, m := range modes {
				b.Run(fmt.Sprintf("mode=%s/shape=%s/procs=%d", m.name, shape, n), func(b *testing.B) {
					s := tr.get(b)
					benchPauseLoop(b, s, tr.id, m.mode)
				})
			}
			tr.kill(b)
		}
	}
}

func benchPauseLoop(b *testing.B, s *Supervisor, id string, mode sandboxapi.Mode) {
	ctx := context.Background()
	var pause, cont time.Duration
	var pids int
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		rep, err := s.Pause(ctx, id, mode)
		t1 := time.Now()
		if err != nil {
			b.Fatalf("pause: %v (%s)", err, rep.Fallback)
		}
		if _, err := s.Continue(ctx, id); err != nil {
			b.Fatalf("continue: %v", err)
		}
		pause += t1.Sub(t0)
		cont += time.Since(t1)
		pids = rep.PIDCount
	}
	b.StopTimer()
	b.ReportMetric(float64(pause.Microseconds())/1000/float64(b.N), "pause-ms/op")
	b.ReportMetric(float64(cont.Microseconds())/1000/float64(b.N), "continue-ms/op")
	b.ReportMetric(float64(pids), "pids")
}

// BenchmarkRawFreeze is the floor for freeze: write 1 to cgroup.freeze and
// wait for "frozen 1" (poll POLLPRI on cgroup.events), then write 0 and
// wait for "frozen 0", on the flat trees of BenchmarkPause, with nothing
// else: no supervisor, no record, no pid list.
func BenchmarkRawFreeze(b *testing.B) {
	for _, n := range tier.Sizes(benchSizes...) {
		tr := &benchTree{shape: "flat", n: n}
		b.Run(fmt.Sprintf("procs=%d", n), func(b *testing.B) {
			s := tr.get(b)
			rec, err := s.Status(tr.id)
			if err != nil {
				b.Fatal(err)
			}
			c := cgroup.Dir(rec.Cgroup)
			ctx := context.Background()
			var freeze, thaw time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				if err := c.Freeze(ctx, time.Now().Add(10*time.Second)); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := c.Thaw(ctx, time.Now().Add(10*time.Second)); err != nil {
					b.Fatal(err)
				}
				freeze += t1.Sub(t0)
				thaw += time.Since(t1)
			}
			b.StopTimer()
			b.ReportMetric(float64(freeze.Microseconds())/1000/float64(b.N), "pause-ms/op")
			b.ReportMetric(float64(thaw.Microseconds())/1000/float64(b.N), "continue-ms/op")
		})
		tr.kill(b)
	}
}
