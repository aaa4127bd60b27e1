package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/opencode"
	"github.com/stillpoint/stillpoint/participants/opencode/driver"
	"github.com/stillpoint/stillpoint/participants/scripted"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// The OpenCode tests run the real OpenCode (opencode.Binary) in real
// sandboxes, through the owner's --opencode and the agent's --adapter
// opencode. What each costs is in docs/OPENCODE.md, What the tests cost.

// id returns the rollout id of the fleet's task i.
func (f *fleet) id(i int) string { return f.tasks[i].RolloutID }

// The turns of the OpenCode tasks' script, by what they do: the two slow
// test runs are where a checkpoint catches OpenCode mid-tool.
const (
	turnRead = iota
	turnEdit
	turnTest1
	turnNote
	turnTest2
	turnAnswer
	turns
)

// openCodeTasks returns n repository tasks and their script, their
// rollout ids <prefix>-<i> (fleets side by side need ids of their own:
// the tests find a launch's processes by them). Task i's
// sandbox starts with calc.sh, whose add subtracts, and test.sh, which
// fails; the script reads calc.sh, fixes it with the edit tool, runs the
// test (toolSeconds long), writes NOTES.md with the write tool, runs the
// test again (as long) and answers. The check runs the test and reads the
// note back.
func openCodeTasks(prefix string, n int, toolSeconds float64) ([]collect.Task, modelserver.Script) {
	script := modelserver.Script{}
	ts := make([]collect.Task, n)
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		test := fmt.Sprintf("sleep %g; sh test.sh", toolSeconds)
		script[id] = []modelserver.Turn{
			turnRead:   {Content: "Reading calc.sh.", ToolCalls: []modelserver.ToolCall{modelserver.ReadCall("c0", "calc.sh")}},
			turnEdit:   {ToolCalls: []modelserver.ToolCall{modelserver.EditCall("c1", "calc.sh", "$1 - $2", "$1 + $2")}},
			turnTest1:  {Content: "Running the test.", ToolCalls: []modelserver.ToolCall{modelserver.BashCall("c2", test)}},
			turnNote:   {ToolCalls: []modelserver.ToolCall{modelserver.WriteCall("c3", "NOTES.md", fmt.Sprintf("fixed-%d\n", i))}},
			turnTest2:  {ToolCalls: []modelserver.ToolCall{modelserver.BashCall("c4", test)}},
			turnAnswer: {Content: fmt.Sprintf("Fixed add in calc.sh; test.sh passes. (task %d)", i)},
		}
		payload, _ := json.Marshal(scripted.Task{
			Script: id,
			Prompt: fmt.Sprintf("Task %d: test.sh fails.\nFix calc.sh so that it passes, and say so in NOTES.md.", i),
			Files: map[string]string{
				"calc.sh": "add() { echo $(($1 - $2)); }\n",
				"test.sh": ". ./calc.sh\n[ \"$(add 2 3)\" = 5 ] && echo PASS || { echo FAIL; exit 1; }\n",
			},
			Check: &scripted.Check{Command: []string{"sh", "-c", "sh test.sh; cat NOTES.md"}, Expect: fmt.Sprintf("PASS fixed-%d", i)},
		})
		ts[i] = collect.Task{RolloutID: id, Task: payload}
	}
	return ts, script
}

// startOpenCodeFleet starts a fleet whose owner shows OpenCode in its
// sandboxes and pauses in mode, and whose agents run the OpenCode adapter.
// It fails at once, saying how to install them, without OpenCode or
// ripgrep on the host.
func startOpenCodeFleet(t *testing.T, prefix string, n, agents int, mode string, toolSeconds float64, agentArgs ...string) *fleet {
	t.Helper()
	if _, err := opencode.Binary(); err != nil {
		t.Fatal(err)
	}
	if _, err := opencode.Ripgrep(); err != nil {
		t.Fatal(err)
	}
	b := buildBins(t)
	ts, script := openCodeTasks(prefix, n, toolSeconds)
	return startFleet(t, fleetOptions{n: n, agents: agents, concurrency: n, tasks: ts, script: script,
		ownerArgs: []string{"--opencode", b.driver, "--pause-mode", mode},
		agentArgs: append([]string{"--adapter", "opencode", "--launch-timeout", "10m"}, agentArgs...)})
}

// harnessProcs names a real harness's programs in a launch: its driver's
// and its own (the process name), and its session's files (globs in the
// session folder) that must not change while it is paused.
type harnessProcs struct {
	driver, harness string
	store           []string
}

// openCodeProcs are OpenCode's: its store.
var openCodeProcs = harnessProcs{driver: opencode.DriverName, harness: opencode.OpenCodeName, store: driver.StoreFiles}

// launch is a running launch of a real harness as the host sees it: the
// driver's process and its session folder.
type launch struct {
	pid   int    // the driver
	home  string // the session folder, through /proc/<pid>/root
	procs harnessProcs
}

// findLaunch finds the OpenCode driver of rollout's launch (findLaunchOf).
func (f *fleet) findLaunch(rollout string) launch { return f.findLaunchOf(openCodeProcs, rollout) }

// findLaunchOf finds the driver of rollout's launch among the host's
// processes: its command line names the rollout (as --title, or in the
// --home folder), and it runs under this fleet's sandboxd (an ancestor's
// command line names the fleet's NATS server), not another test's.
func (f *fleet) findLaunchOf(h harnessProcs, rollout string) launch {
	t := f.t.(*testing.T)
	t.Helper()
	var l launch
	poll.Wait(t, time.Minute, "the "+h.driver+" of "+rollout, func() bool {
		pids, _ := procfs.PIDs()
		for _, pid := range pids {
			argv := cmdline(pid)
			if len(argv) == 0 || !strings.HasSuffix(argv[0], "/"+h.driver) || !ancestorNames(pid, f.env.URL) {
				continue
			}
			if i := slices.Index(argv, "--home"); i > 0 && i+1 < len(argv) &&
				(slices.Contains(argv, rollout) || strings.Contains(argv[i+1], "/"+rollout+"/")) {
				l = launch{pid: pid, home: fmt.Sprintf("/proc/%d/root%s", pid, argv[i+1]), procs: h}
				return true
			}
		}
		return false
	})
	return l
}

// cmdline returns pid's command line, nil if it has none or is gone.
func cmdline(pid int) []string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil || len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
}

// ancestorNames tells whether one of pid's ancestors has arg on its
// command line.
func ancestorNames(pid int, arg string) bool {
	for range 16 {
		st, _, err := procfs.ReadStat(pid, nil)
		if err != nil || st.PPID <= 1 {
			return false
		}
		pid = st.PPID
		if slices.Contains(cmdline(pid), arg) {
			return true
		}
	}
	return false
}

// has tells whether a process named comm runs in the launch's tree.
func (l launch) has(comm string) bool {
	pids, _ := procfs.Tree(l.pid)
	for _, p := range pids {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); err == nil && strings.TrimSpace(string(b)) == comm {
			return true
		}
	}
	return false
}

// end ends every process named comm in the launch's tree (SIGTERM): a
// tool the test ends when it chooses, rather than one whose few seconds a
// poll on a busy machine can miss.
func (l launch) end(t *testing.T, comm string) {
	t.Helper()
	pids, _ := procfs.Tree(l.pid)
	n := 0
	for _, p := range pids {
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p)); err == nil && strings.TrimSpace(string(b)) == comm {
			if err := syscall.Kill(p, syscall.SIGTERM); err == nil {
				n++
			}
		}
	}
	if n == 0 {
		t.Fatalf("no %s in the launch's processes to end", comm)
	}
}

// stillness is what must not change while a launch is paused: every
// process of its tree with its state and CPU time, and the harness's
// session files (mtime, size, sha256).
type stillness struct {
	procs map[int]string
	files map[string]string
}

func (l launch) sample(t *testing.T) stillness {
	t.Helper()
	s := stillness{procs: map[int]string{}, files: map[string]string{}}
	pids, err := procfs.Tree(l.pid)
	if err != nil {
		t.Fatalf("the launch's processes: %v", err)
	}
	for _, pid := range pids {
		st, _, err := procfs.ReadStat(pid, nil)
		if err != nil {
			continue
		}
		comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
		s.procs[pid] = fmt.Sprintf("%s start %d state %c cpu %d", strings.TrimSpace(string(comm)), st.Start, st.State, st.UTime+st.STime)
	}
	for _, g := range l.procs.store {
		ps, _ := filepath.Glob(filepath.Join(l.home, g))
		if len(ps) == 0 {
			t.Fatalf("store file: no %s in %s", g, l.home)
		}
		for _, p := range ps {
			s.sampleFile(t, strings.TrimPrefix(p, l.home+"/"), p)
		}
	}
	return s
}

// sampleFile adds file p's mtime, size and sha256 to s, under name.
func (s stillness) sampleFile(t *testing.T, name, p string) {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatalf("store file: %v", err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("store file: %v", err)
	}
	s.files[name] = fmt.Sprintf("mtime %d size %d sha256 %x", fi.ModTime().UnixNano(), fi.Size(), sha256.Sum256(b))
}

func (s stillness) diff(o stillness) string {
	var out []string
	for pid, v := range s.procs {
		if o.procs[pid] != v {
			out = append(out, fmt.Sprintf("process %d: %s, then %q", pid, v, o.procs[pid]))
		}
	}
	for pid, v := range o.procs {
		if _, ok := s.procs[pid]; !ok {
			out = append(out, fmt.Sprintf("process %d appeared: %s", pid, v))
		}
	}
	for f, v := range s.files {
		if o.files[f] != v {
			out = append(out, fmt.Sprintf("%s: %s, then %s", f, v, o.files[f]))
		}
	}
	slices.Sort(out)
	return strings.Join(out, "; ")
}

// pausedFor takes a held checkpoint, checks for d that nothing of the
// launch runs or writes (every process stopped or frozen, its CPU time
// and the store unchanged), runs during (with the launch still paused),
// then commits and waits for the resume. It returns the harness's process
// (pid and start time) it saw paused.
func (f *fleet) pausedFor(ctx context.Context, id, mode string, l launch, d time.Duration, during func()) string {
	t := f.t.(*testing.T)
	t.Helper()
	res, err := f.br.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: id, Hold: true})
	if err != nil || res.Status != bridgeapi.StatusPrepared {
		t.Fatalf("checkpoint %s: %+v %v", id, res, err)
	}
	before := l.sample(t)
	f.checkPause(ctx, id, mode, len(before.procs))
	for pid, v := range before.procs {
		switch mode {
		case "stop":
			if !strings.Contains(v, "state T") {
				t.Fatalf("%s: process %d is not stopped: %s", id, pid, v)
			}
		case "freeze":
			// A frozen task shows as sleeping; its cgroup says it is frozen.
			if !frozen(pid) {
				t.Fatalf("%s: process %d is not in a frozen cgroup: %s", id, pid, v)
			}
		}
	}
	if during != nil {
		during()
	}
	last := time.Time{}
	poll.Holds(t, d, func() error {
		if time.Since(last) < 500*time.Millisecond { // the store files are read and hashed twice a second
			return nil
		}
		last = time.Now()
		if diff := before.diff(l.sample(t)); diff != "" {
			return fmt.Errorf("%s: the paused launch changed: %s", id, diff)
		}
		return nil
	})
	t.Logf("%s: %d processes and the store unchanged for %s", id, len(before.procs), d)
	if res, err := f.br.Commit(ctx, id, false); err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("commit %s: %+v %v", id, res, err)
	}
	for pid, v := range before.procs {
		if strings.HasPrefix(v, l.procs.harness+" ") {
			start, _, _ := strings.Cut(strings.TrimPrefix(v, l.procs.harness+" "), " state")
			return fmt.Sprintf("pid %d %s", pid, start)
		}
	}
	t.Fatalf("%s: no %s process among %v", id, l.procs.harness, before.procs)
	return ""
}

// checkPause checks the pause the sandbox's daemon reported in its
// prepare ack of checkpoint id, as the bridge's record of the prepare
// counts it (the ack travels on core NATS): one, in mode, standing still
// with no fallback, of the launch's procs processes.
func (f *fleet) checkPause(ctx context.Context, id, mode string, procs int) {
	f.t.Helper()
	entries, err := timeline.Read(ctx, f.env.JS, f.run, id)
	if err != nil {
		f.t.Fatalf("timeline of %s: %v", id, err)
	}
	n := 0
	for _, e := range entries {
		rec, ok := e.Data.(events.PrepareAcked)
		if !ok || rec.Part != 1 {
			continue
		}
		for _, p := range rec.Pauses {
			n += p.Count
			f.t.Logf("%s: %d sandbox paused: mode %s, %d to %d processes, at most %.1f ms", id, p.Count, p.Mode, p.PIDsMin, p.PIDsMax, p.TookMaxMS)
			if p.Mode != mode || p.Fallback || !p.Still || p.PIDsMin != procs || p.PIDsMax != procs {
				f.t.Errorf("%s: %d paused in mode %s (fallback %v, still %v) with %d to %d processes; want mode %s, still, no fallback, the launch's %d",
					id, p.Count, p.Mode, p.Fallback, p.Still, p.PIDsMin, p.PIDsMax, mode, procs)
			}
		}
	}
	if n != 1 {
		f.t.Errorf("%s: %d sandbox pauses in the prepare's record, want 1", id, n)
	}
}

// frozen tells whether process pid's cgroup (v2) is frozen.
func frozen(pid int) bool {
	root, err := cgroup.Mount()
	if err != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		return false
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			ev, err := cgroup.Dir(filepath.Join(root, p)).Events()
			return err == nil && ev.Frozen
		}
	}
	return false
}

// entries returns task's ledger entries.
func (f *fleet) entries(task string) []modelserver.Entry {
	var out []modelserver.Entry
	for _, e := range f.ms.Ledger() {
		if e.Task == task {
			out = append(out, e)
		}
	}
	return out
}

// answered tells whether task's call at turn was answered.
func (f *fleet) answered(task string, turn int) bool {
	for _, e := range f.entries(task) {
		if e.Turn == turn && !e.Delivered.IsZero() && !e.Title {
			return true
		}
	}
	return false
}

// checkOpenCodeLedger checks a task's calls: one user turn in each (no
// turn injected), no title call (--title), every call streamed, none
// repeated, and the turns called in order.
func (f *fleet) checkOpenCodeLedger(task string, want string) {
	f.t.Helper()
	f.checkHarnessLedger(task, want, 1)
}

// checkHarnessLedger is checkOpenCodeLedger with users user turns in each
// call.
func (f *fleet) checkHarnessLedger(task string, want string, users int) {
	f.t.Helper()
	var got []string
	for _, e := range f.entries(task) {
		if e.UserTurns != users || e.Title || !e.Stream {
			f.t.Errorf("%s: call %+v: want %d user turns, no title call, streamed", task, e, users)
		}
		got = append(got, fmt.Sprintf("%d%s", e.Turn, map[bool]string{true: "r"}[e.Retried]))
	}
	g := strings.Join(got, " ")
	if want != "" && g != want {
		f.t.Errorf("%s: turns called %q, want %q", task, g, want)
	}
	f.t.Logf("%s: turns called %s (r: answered again after an interruption)", task, g)
	if r := f.ms.Repeats(); len(r[task]) != 0 {
		f.t.Errorf("%s: repeated model calls: %v", task, r[task])
	}
}

// TestOpenCodePausedFourTimes: an OpenCode rollout paused in place four
// times, in freeze and in stop mode (each in a fleet of its own, the two
// side by side): mid-tool, while its model reply is held (the reply
// released during the pause), for 2 minutes mid-tool, and mid-stream.
// While paused, no process of the launch runs (each one's CPU time is the
// same) and OpenCode's store (opencode.db, -wal, -shm) does not change;
// the same launch finishes the task (one launch, four pauses, the test
// passes) with every model call made once. It runs two OpenCode
// processes, and the 2-minute pause is most of its time.
func TestOpenCodePausedFourTimes(t *testing.T) {
	tier.Heavy(t)
	parallel(t, 0.5, 150*time.Second)
	for _, mode := range []string{"freeze", "stop"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			// The test runs sleep until the test ends them (launch.end):
			// the pauses mid-tool never race a tool's end.
			f := startOpenCodeFleet(t, "oc-"+mode, 1, 1, mode, 3600)
			ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
			defer cancel()
			id := f.id(0)
			out := f.dispatch(ctx, 0, 0)
			l := f.findLaunch(id)

			// OpenCode's start is slow on a busy machine: the wait is for
			// it to get there, bounded by the test's budget, not a claim
			// on its speed.
			poll.Wait(t, 3*time.Minute, "OpenCode in its first test run", func() bool {
				return f.answered(id, turnTest1) && l.has("sleep")
			})
			var seen []string
			seen = append(seen, f.pausedFor(ctx, "c1-mid-tool", mode, l, 2*time.Second, f.ms.Hold))
			l.end(t, "sleep")

			poll.Wait(t, time.Minute, "OpenCode waiting for its held reply", func() bool { return f.ms.Held() == 1 })
			seen = append(seen, f.pausedFor(ctx, "c2-held-reply", mode, l, 2*time.Second, f.ms.Release))

			poll.Wait(t, time.Minute, "OpenCode in its second test run", func() bool {
				return f.answered(id, turnTest2) && l.has("sleep")
			})
			seen = append(seen, f.pausedFor(ctx, "c3-two-minutes", mode, l, 2*time.Minute, func() { f.ms.SlowNext(time.Second) }))
			l.end(t, "sleep")

			poll.Wait(t, time.Minute, "OpenCode reading its answer", func() bool {
				es := f.entries(id)
				e := es[len(es)-1]
				return e.Turn == turnAnswer && e.Chunks >= 2 && e.Delivered.IsZero()
			})
			seen = append(seen, f.pausedFor(ctx, "c4-mid-stream", mode, l, 2*time.Second, nil))
			if len(slices.Compact(slices.Clone(seen))) != 1 {
				t.Fatalf("OpenCode processes paused: %q, want the same one four times", seen)
			}

			o := <-out
			if o.err != nil {
				t.Fatalf("rollout: %v", o.err)
			}
			reward(t, o.res)
			f.checkTrajectory(o.res)
			if len(o.res.Launches) != 1 || o.res.Launches[0].Pauses != 4 || o.res.Launches[0].Ended != agentapi.LaunchFinished {
				t.Fatalf("launch log %+v, want one finished launch paused four times", o.res.Launches)
			}
			var answer string
			if err := json.Unmarshal(o.res.Answer, &answer); err != nil || !strings.HasPrefix(answer, "Fixed add") {
				t.Errorf("answer %s: %v", o.res.Answer, err)
			}
			f.checkOpenCodeLedger(id, "0 1 2 3 4 5")
			if rel, err := f.br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
				t.Fatalf("final release: %+v %v", rel, err)
			}
		})
	}
}

// TestOpenCodeSnapshotForksIntoAContinuation: a checkpoint with stop (the
// job preempted) snapshots an OpenCode rollout paused mid-tool; a fresh
// owner and agent restore it, and its next attempt relaunches in the fork,
// where the driver continues the saved session: no new user message (the
// ledger), the saved user turns unchanged (the driver checks them, or the
// launch fails), the interrupted test run re-issued once, the task's test
// passing in the fork. It runs two OpenCode processes, one after the
// other.
func TestOpenCodeSnapshotForksIntoAContinuation(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.25, 45*time.Second)
	f := startOpenCodeFleet(t, "oc-fork", 1, 1, "freeze", 4)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	id := f.id(0)
	lost, abandon := context.WithCancel(ctx)
	defer abandon()
	out := f.dispatch(lost, 0, 0)
	l := f.findLaunch(id)
	poll.Wait(t, 3*time.Minute, "OpenCode in its first test run", func() bool { return f.answered(id, turnTest1) && l.has("sleep") }) // its start: see TestOpenCodePausedFourTimes
	began := time.Now()
	res, err := f.br.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: "c1", Stop: true})
	if err != nil || res.Status != bridgeapi.StatusCommitted || len(res.Continued) != 1 {
		t.Fatalf("checkpoint with stop: %+v %v", res, err)
	}
	bm := f.agentRecords(ctx, "c1", "a1")[id]
	if bm.Next != agentapi.StageLaunch || !bm.Resume {
		t.Fatalf("exported bookmark: next %s resume %v", bm.Next, bm.Resume)
	}
	// The preempted job's processes end; a fresh fleet restores it.
	for _, name := range []string{"agent-a1", "owner"} {
		f.mu.Lock()
		p := f.procs[name]
		f.mu.Unlock()
		p.Stop()
	}
	abandon()
	if o := <-out; o.err == nil {
		t.Fatalf("the rollout returned across the stop: %+v", o.res)
	}
	f.startOwner()
	f.startAgent("a1", "--concurrency", "1")
	rr, err := f.br.Restore(ctx, bridgeapi.RestoreRequest{})
	if err != nil || rr.Status != bridgeapi.StatusCompleted {
		t.Fatalf("restore: %+v %v", rr, err)
	}
	calls := len(f.entries(id))
	o := <-f.dispatch(ctx, 0, 1)
	if o.err != nil {
		t.Fatalf("the restored attempt: %v", o.err)
	}
	reward(t, o.res)
	f.checkTrajectory(o.res)
	last := o.res.Launches[len(o.res.Launches)-1]
	if !o.res.Restored || len(o.res.Launches) != 2 || !last.Continued || last.Attempt != 1 || last.Ended != agentapi.LaunchFinished {
		t.Fatalf("restored %v, launch log %+v: want the attempt-0 launch, then one attempt-1 launch that continued the session", o.res.Restored, o.res.Launches)
	}
	es := f.entries(id)
	if len(es) <= calls || es[calls].Turn != turnTest1 || !es[calls].Retried || es[calls].Episode != (events.Episode{Rollout: id, Attempt: 1}).String() {
		t.Fatalf("the continuation's first call %+v: want the interrupted test run re-issued by attempt 1", es[min(calls, len(es)-1)])
	}
	f.checkOpenCodeLedger(id, "0 1 2 2r 3 4 5")
	f.checkLedger(began)
	if rel, err := f.br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
		t.Fatalf("final release: %+v %v", rel, err)
	}
}

// TestOpenCodeRolloutsThroughACrash: four OpenCode rollouts on two agents
// go through a checkpoint; with all of them in flight, kill -9 of both
// agents and the owner (the restarted owner stops the sandboxes they
// left). The restore forks every sandbox and continues every rollout; each
// returns exactly one result with a full grade, no model call is repeated
// and no user turn injected. It runs four OpenCode processes at once,
// then four more.
func TestOpenCodeRolloutsThroughACrash(t *testing.T) {
	tier.E2E(t)
	parallel(t, 1, 80*time.Second)
	const n = 4
	f := startOpenCodeFleet(t, "oc-crash", n, 2, "freeze", 5)
	rolloutsThroughACrash(t, f, n, func(task string) { f.checkOpenCodeLedger(task, "") })
}

// rolloutsThroughACrash is the crash scenario of every real harness on
// fleet f of n rollouts: each is past its edit at a checkpoint, on past
// its note when the agents and the owner are killed (kill -9); the
// restore continues every rollout not yet returned, each returns exactly
// one result with a full grade and its trajectory, and checkLedger checks
// each rollout's model calls.
func rolloutsThroughACrash(t *testing.T, f *fleet, n int, checkLedger func(task string)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	var (
		mu      sync.Mutex
		results = map[string][]agentapi.Result{}
		wg      sync.WaitGroup
	)
	keep := func(i int, ch <-chan outcome, crashed bool) {
		o := <-ch
		if o.err != nil {
			if !crashed {
				t.Errorf("%s: %v", f.id(i), o.err)
			}
			return
		}
		mu.Lock()
		results[f.id(i)] = append(results[f.id(i)], o.res)
		mu.Unlock()
	}
	lost, abandon := context.WithCancel(ctx)
	defer abandon()
	for i := range n {
		ch := f.dispatch(lost, i, 0)
		wg.Go(func() { keep(i, ch, true) })
	}
	poll.Wait(t, 2*time.Minute, "every rollout past its edit", func() bool {
		for i := range n {
			if !f.answered(f.id(i), turnEdit) {
				return false
			}
		}
		return true
	})
	began := time.Now()
	f.checkpoint(ctx, "c1")
	poll.Wait(t, 2*time.Minute, "every rollout on after the checkpoint", func() bool {
		for i := range n {
			if !f.answered(f.id(i), turnNote) {
				return false
			}
		}
		return true
	})
	f.kill9("agent-a1", "agent-a2", "owner")
	abandon()
	wg.Wait()
	f.startOwner()
	for _, a := range f.agents {
		f.startAgent(a, "--concurrency", fmt.Sprint(n))
	}
	rr, err := f.br.Restore(ctx, bridgeapi.RestoreRequest{})
	if err != nil || rr.Status != bridgeapi.StatusCompleted {
		t.Fatalf("restore: %+v %v", rr, err)
	}
	var done []string
	mu.Lock()
	for i := range n {
		if len(results[f.id(i)]) > 0 {
			done = append(done, events.Episode{Rollout: f.id(i), Attempt: 1}.String())
			continue
		}
		ch := f.dispatch(ctx, i, 1)
		wg.Go(func() { keep(i, ch, false) })
	}
	mu.Unlock()
	if len(done) > 0 {
		if r, err := f.br.Retire(ctx, done); err != nil || r.Status != bridgeapi.StatusCompleted {
			t.Fatalf("retire of the restored attempts of finished rollouts: %+v %v", r, err)
		}
	}
	wg.Wait()
	continued := 0
	for i := range n {
		rs := results[f.id(i)]
		if len(rs) != 1 {
			t.Errorf("%s: %d results, want exactly 1", f.id(i), len(rs))
			continue
		}
		reward(t, rs[0])
		f.checkTrajectory(rs[0])
		if l := rs[0].Launches; rs[0].Restored && l[len(l)-1].Continued {
			continued++
		}
		checkLedger(f.id(i))
	}
	t.Logf("%d rollouts returned before the crash, %d continued their saved session after the restore", len(done), continued)
	// Each was past its edit at the checkpoint: its saved session holds
	// completed responses, so the restore continues it, not starts over.
	if continued != n-len(done) {
		t.Errorf("%d of the %d restored rollouts continued their saved session, want every one", continued, n-len(done))
	}
	f.checkLedger(began)
	if rel, err := f.br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
		t.Fatalf("final release: %+v %v", rel, err)
	}
}

// TestOpenCodeThatDoesNotPauseIsStoppedAndRelaunched: with --no-pause, a
// checkpoint stops the OpenCode launch mid-tool (the stop's SIGINT makes
// the driver kill OpenCode at once: OpenCode itself would go on with the
// next model call) and, after the resume, relaunches it on the saved
// session, which the driver continues to the end of the task. It runs two
// OpenCode processes, one after the other.
func TestOpenCodeThatDoesNotPauseIsStoppedAndRelaunched(t *testing.T) {
	tier.E2E(t)
	parallel(t, 1, 30*time.Second)
	f := startOpenCodeFleet(t, "oc-nopause", 1, 1, "freeze", 3, "--no-pause")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	id := f.id(0)
	out := f.dispatch(ctx, 0, 0)
	l := f.findLaunch(id)
	poll.Wait(t, 3*time.Minute, "OpenCode in its first test run", func() bool { return f.answered(id, turnTest1) && l.has("sleep") }) // its start: see TestOpenCodePausedFourTimes
	f.checkpoint(ctx, "c1")
	bm := f.agentRecords(ctx, "c1", "a1")[id]
	if bm.Next != agentapi.StageLaunch || !bm.Resume || len(bm.Launches) != 1 || bm.Launches[0].Ended != agentapi.LaunchInterrupted {
		t.Fatalf("exported bookmark %s resume %v launches %+v", bm.Next, bm.Resume, bm.Launches)
	}
	o := <-out
	if o.err != nil {
		t.Fatal(o.err)
	}
	reward(t, o.res)
	f.checkTrajectory(o.res)
	ls := o.res.Launches
	if len(ls) != 2 || ls[0].Ended != agentapi.LaunchInterrupted || ls[0].Pauses != 0 || !ls[1].Continued || ls[1].Ended != agentapi.LaunchFinished {
		t.Fatalf("launch log %+v: want one interrupted launch, then one that continued the session", ls)
	}
	f.checkOpenCodeLedger(id, "")
	f.checkLedger(time.Time{})
}
