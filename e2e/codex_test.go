package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/controller-bridge/collect/tasks"
	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/codex"
	"github.com/stillpoint/stillpoint/participants/scripted"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
)

// The Codex tests run the real Codex CLI (codex.Binary) in real sandboxes,
// through the owner's --codex and the agent's --adapter codex, the
// sandboxes' relays translating its Responses calls to chat completions
// (--model-api-translate) so that every trajectory has its token ids.
// They are OpenCode's scenarios (opencode_test.go), with the same turns.

// codexUserTurns is how many user turns each of Codex's calls carries: its
// <environment_context> message and the prompt.
const codexUserTurns = 2

// codexProcs are Codex's: the session files of a launch that must not
// change while it is paused, its rollout and its databases.
var codexProcs = harnessProcs{driver: codex.DriverName, harness: codex.CodexName,
	store: []string{"codex/sessions/*/*/*/rollout-*.jsonl", "codex/state_5.sqlite*"}}

// codexTest runs a test command in Codex's exec_command, which returns
// after yield_time_ms with the command still running: the most Codex
// allows, so that a short pause mid-tool does not make it yield.
func codexTest(id, cmd string) modelserver.ToolCall {
	return modelserver.Call(id, "exec_command", map[string]any{"cmd": cmd, "yield_time_ms": 30000})
}

// codexTasks are openCodeTasks in Codex's one tool, exec_command.
func codexTasks(prefix string, n int, toolSeconds float64) ([]collect.Task, modelserver.Script) {
	script := modelserver.Script{}
	ts := make([]collect.Task, n)
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		test := fmt.Sprintf("sleep %g; sh test.sh", toolSeconds)
		script[id] = []modelserver.Turn{
			turnRead:   {Content: "Reading calc.sh.", ToolCalls: []modelserver.ToolCall{modelserver.ExecCall("c0", "cat calc.sh")}},
			turnEdit:   {ToolCalls: []modelserver.ToolCall{modelserver.ExecCall("c1", `sed -i 's/\$1 - \$2/$1 + $2/' calc.sh`)}},
			turnTest1:  {Content: "Running the test.", ToolCalls: []modelserver.ToolCall{codexTest("c2", test)}},
			turnNote:   {ToolCalls: []modelserver.ToolCall{modelserver.ExecCall("c3", fmt.Sprintf("printf 'fixed-%d\\n' > NOTES.md", i))}},
			turnTest2:  {ToolCalls: []modelserver.ToolCall{codexTest("c4", test)}},
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

// codexDriver builds the static codex-driver, and fails at once, saying
// how to install it, without Codex on the host.
func codexDriver(t *testing.T) string {
	t.Helper()
	if _, err := codex.Binary(); err != nil {
		t.Fatal(err)
	}
	return build.StaticForTest(t, build.CodexDriver)[build.CodexDriver]
}

// startCodexFleet starts a fleet whose owner shows Codex in its sandboxes
// and pauses in mode, and whose agents run the Codex adapter.
func startCodexFleet(t *testing.T, prefix string, n, agents int, mode string, toolSeconds float64, agentArgs ...string) *fleet {
	t.Helper()
	drv := codexDriver(t)
	ts, script := codexTasks(prefix, n, toolSeconds)
	f := startFleet(t, fleetOptions{n: n, agents: agents, concurrency: n, tasks: ts, script: script,
		ownerArgs: []string{"--codex", drv, "--pause-mode", mode, "--model-api-translate"},
		agentArgs: append([]string{"--adapter", "codex", "--launch-timeout", "10m"}, agentArgs...)})
	f.userTurns = codexUserTurns
	return f
}

// findCodex finds the Codex driver of rollout's launch.
func (f *fleet) findCodex(rollout string) launch {
	f.t.Helper()
	return f.findLaunchOf(codexProcs, rollout)
}

// TestCodexPausedFourTimes: a Codex rollout paused in place four times,
// in freeze and in stop mode (each in a fleet of its own, side by side):
// mid-tool, while its model reply is held (released during the pause),
// mid-tool again, and for 2 minutes mid-stream. While paused, no process
// of the launch runs (each one's CPU time is the same) and Codex's
// rollout and database do not change; the same launch finishes the task
// with every model call made once. The 2-minute pause is mid-stream, not
// mid-tool: Codex's exec_command yields after yield_time_ms of wall time,
// which a pause counts (docs/CODEX.md).
func TestCodexPausedFourTimes(t *testing.T) {
	tier.Heavy(t)
	parallel(t, 0.5, 150*time.Second)
	for _, mode := range []string{"freeze", "stop"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			// The test runs sleep until the test ends them (launch.end).
			f := startCodexFleet(t, "cx-"+mode, 1, 1, mode, 3600)
			ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
			defer cancel()
			id := f.id(0)
			out := f.dispatch(ctx, 0, 0)
			l := f.findCodex(id)

			poll.Wait(t, 3*time.Minute, "Codex in its first test run", func() bool {
				return f.answered(id, turnTest1) && l.has("sleep")
			})
			var seen []string
			seen = append(seen, f.pausedFor(ctx, "c1-mid-tool", mode, l, 2*time.Second, f.ms.Hold))
			l.end(t, "sleep")

			poll.Wait(t, time.Minute, "Codex waiting for its held reply", func() bool { return f.ms.Held() == 1 })
			seen = append(seen, f.pausedFor(ctx, "c2-held-reply", mode, l, 2*time.Second, f.ms.Release))

			poll.Wait(t, time.Minute, "Codex in its second test run", func() bool {
				return f.answered(id, turnTest2) && l.has("sleep")
			})
			seen = append(seen, f.pausedFor(ctx, "c3-mid-tool", mode, l, 2*time.Second, func() { f.ms.SlowNext(time.Second) }))
			l.end(t, "sleep")

			poll.Wait(t, time.Minute, "Codex reading its answer", func() bool {
				es := f.entries(id)
				e := es[len(es)-1]
				return e.Turn == turnAnswer && e.Chunks >= 2 && e.Delivered.IsZero()
			})
			seen = append(seen, f.pausedFor(ctx, "c4-two-minutes-mid-stream", mode, l, 2*time.Minute, nil))
			if len(slices.Compact(slices.Clone(seen))) != 1 {
				t.Fatalf("Codex processes paused: %q, want the same one four times", seen)
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
			f.checkHarnessLedger(id, "0 1 2 3 4 5", codexUserTurns)
			if rel, err := f.br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
				t.Fatalf("final release: %+v %v", rel, err)
			}
		})
	}
}

// TestCodexSnapshotForksIntoAContinuation: a checkpoint with stop
// snapshots a Codex rollout paused mid-tool; a fresh owner and agent
// restore it, and its next attempt relaunches in the fork, where the
// driver continues the saved session (`codex exec resume <thread> ""`):
// the relay removes the empty user message, so the ledger shows no new
// user turn; the saved user turns are unchanged but for it (the driver
// checks them, or the launch fails); the interrupted test run is re-issued
// once (Codex's output for it: aborted), and the task's test passes in
// the fork.
func TestCodexSnapshotForksIntoAContinuation(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.25, 45*time.Second)
	f := startCodexFleet(t, "cx-fork", 1, 1, "freeze", 4)
	snapshotForks(t, f, codexProcs, "Codex", func(task, want string) { f.checkHarnessLedger(task, want, codexUserTurns) },
		removal{edit: relay.CodexEmptyTurn, what: "one empty user message", is: func(removed []json.RawMessage) bool {
			return len(removed) == 1 && strings.Contains(string(removed[0]), `"text":""`)
		}})
}

// TestCodexRolloutsThroughACrash: four Codex rollouts on two agents go
// through a checkpoint; with all of them in flight, kill -9 of both agents
// and the owner. The restore forks every sandbox and continues every
// rollout; each returns exactly one result with a full grade, no model
// call is repeated and no user turn injected.
func TestCodexRolloutsThroughACrash(t *testing.T) {
	tier.E2E(t)
	parallel(t, 1, 80*time.Second)
	const n = 4
	f := startCodexFleet(t, "cx-crash", n, 2, "freeze", 5)
	rolloutsThroughACrash(t, f, n, func(task string) { f.checkHarnessLedger(task, "", codexUserTurns) })
}

// TestCodexRepoTasksThroughTwoCheckpointsAndACrash: the repository set
// run by the real Codex CLI, 8 rollouts at once on two agents, every tool
// call its exec_command. The collector takes a checkpoint while every
// running rollout is in its first, slow, test run and another once they
// have gone on; then kill -9 of both agents and the owner. The collector
// restores the second checkpoint into the restarted fleet, and every
// rollout ends with exactly one result whose reward its own tests gave
// (1 after the fix, 0 for the control task), no model call repeated and
// no user turn injected.
func TestCodexRepoTasksThroughTwoCheckpointsAndACrash(t *testing.T) {
	tier.Heavy(t)
	parallel(t, 1.25, 3*time.Minute)
	drv := codexDriver(t)
	const inFlight = 8
	f := startFleet(t, fleetOptions{agents: 2, concurrency: inFlight,
		repos:     &tasks.RepoOptions{ToolSeconds: 8, Harness: tasks.HarnessCodex},
		ownerArgs: []string{"--codex", drv, "--model-api-translate"},
		agentArgs: []string{"--adapter", "codex", "--launch-timeout", "10m"}})
	f.userTurns = codexUserTurns
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	c := f.collector(t)
	c.start("--concurrency", "8")
	reached := func(turn int) (n, started int) {
		for _, tk := range f.tasks {
			if f.answered(tk.RolloutID, repoTurnLook) {
				started++
			}
			if f.answered(tk.RolloutID, turn) {
				n++
			}
		}
		return n, started
	}
	poll.Wait(t, 4*time.Minute, "8 rollouts in their first test run", func() bool {
		n, _ := reached(repoTurnTest1)
		return n >= inFlight
	})
	c.signal(syscall.SIGUSR1)
	poll.Wait(t, 2*time.Minute, "the first committed checkpoint", func() bool { return f.latest(ctx) != "" })
	first := f.latest(ctx)
	poll.Wait(t, 4*time.Minute, "rollouts on past their fix", func() bool {
		n, _ := reached(repoTurnTest2)
		return n >= inFlight/2
	})
	began := time.Now()
	c.signal(syscall.SIGUSR1)
	poll.Wait(t, 2*time.Minute, "the second committed checkpoint", func() bool {
		l := f.latest(ctx)
		return l != "" && l != first
	})
	n, started := reached(repoTurnTest2)
	t.Logf("checkpoints %s and %s; at the crash %d of %d rollouts had started, %d were past their fix", first, f.latest(ctx), started, len(f.tasks), n)
	f.kill9("agent-a1", "agent-a2", "owner")
	f.startOwner()
	for _, a := range f.agents {
		f.startAgent(a, "--concurrency", "8")
	}
	if code := c.wait(8 * time.Minute); code != 0 {
		t.Fatalf("collect exited %d", code)
	}
	res := c.readResults()
	restored, continued := 0, 0
	for _, tk := range f.tasks {
		r, ok := res[tk.RolloutID]
		if !ok || r.Result == nil {
			continue // readResults said so
		}
		checkRepoVerdict(t, tk.RolloutID, *r.Result)
		f.checkHarnessLedger(tk.RolloutID, "", codexUserTurns)
		if r.Result.Restored {
			restored++
			if l := r.Result.Launches; len(l) > 0 && l[len(l)-1].Continued {
				continued++
			}
		}
		t.Logf("%-16s attempt %d restored %-5v reward %v", tk.RolloutID, r.Attempt, r.Result.Restored, verdict(t, *r.Result).Reward)
	}
	if restored == 0 || continued == 0 {
		t.Errorf("%d rollouts continued from the restored checkpoint, %d of them on their saved Codex session: want some of each", restored, continued)
	}
	t.Logf("%d rollouts restored, %d of them continued their saved Codex session", restored, continued)
	f.checkLedger(began)
}

// TestMicroVMCodexContinuesInPlace: one real Codex rollout on the microvm
// provider (Codex's directory beside the bin directory on the harness
// disk), checkpointed while Codex waits for a model reply; the agent and
// the owner are killed with SIGKILL, and a new agent and owner with a new
// model server restore. The Codex process the snapshot kept is taken over
// in place, its cut call and every later one reach the new model server
// through the relay, and it finishes with its grade.
func TestMicroVMCodexContinuesInPlace(t *testing.T) {
	tier.Heavy(t)
	parallel(t, 1, 4*time.Minute) // the guest under TCG, and Codex in it
	requireMicroVM(t)
	drv := codexDriver(t)
	ts, script := codexTasks("cxvm", 1, 1)
	began := time.Now()
	f := startFleet(t, fleetOptions{n: 1, concurrency: 1, tasks: ts, script: script, provider: "microvm",
		ownerArgs: []string{"--codex", drv, "--model-api-translate", "--microvm-mem", "1024"},
		agentArgs: []string{"--adapter", "codex", "--launch-timeout", "30m"}})
	f.userTurns = codexUserTurns
	ctx, cancel := context.WithTimeout(t.Context(), 25*time.Minute)
	defer cancel()
	f.ms.Hold()
	lost, abandon := context.WithCancel(ctx)
	first := f.dispatch(lost, 0, 0)
	wait, stop := context.WithTimeout(ctx, 15*time.Minute)
	err := poll.Until(wait, poll.Every(100*time.Millisecond), func() (bool, error) { return f.ms.Held() > 0, nil })
	stop()
	if err != nil {
		f.showLaunch(ctx, f.id(0))
		t.Fatalf("Codex's first model call held by the model server: %v after %s", err, time.Since(began).Round(time.Second))
	}
	started := time.Since(began)
	f.checkpoint(ctx, "c1")
	bm := f.agentRecords(ctx, "c1", "a1")[f.id(0)]
	if len(bm.Launches) != 1 || bm.Launches[0].Held == nil || !bm.Launches[0].Relay {
		t.Fatalf("exported bookmark %+v: want the Codex launch held through the relay", bm)
	}
	f.kill9("agent-a1", "owner")
	abandon()
	if o := <-first; o.err == nil {
		t.Fatalf("the rollout returned across the crash: %+v", o.res)
	}
	addr, ms2 := serveModel(t, f.script)
	f.later = append(f.later, ms2)
	f.upstream = addr
	f.startOwner()
	f.startAgent("a1", "--concurrency", "1")
	t1 := time.Now()
	if rr, err := f.br.Restore(ctx, bridgeapi.RestoreRequest{}); err != nil || rr.Status != bridgeapi.StatusCompleted {
		t.Fatalf("restore: %+v %v", rr, err)
	}
	o := <-f.dispatch(ctx, 0, 1)
	if o.err != nil {
		t.Fatalf("after the restore: %v", o.err)
	}
	reward(t, o.res)
	f.checkTrajectory(o.res)
	if len(o.res.Launches) != 1 || o.res.Launches[0].Rebind != agentapi.RebindResumed || o.res.Launches[0].Ended != agentapi.LaunchFinished {
		t.Fatalf("launch log %+v: want the one Codex launch resumed in place and finished", o.res.Launches)
	}
	if len(ms2.Ledger()) == 0 {
		t.Fatal("no model call reached the new model server")
	}
	for _, ms := range []*modelserver.Server{f.ms, ms2} {
		if r := ms.Repeats(); len(r) != 0 {
			t.Errorf("repeated model calls: %v", r)
		}
		for _, e := range ms.Ledger() {
			if e.UserTurns != codexUserTurns {
				t.Errorf("%s: a request with %d user turns: a turn was injected", e.Task, e.UserTurns)
			}
		}
	}
	t.Logf("cost: to Codex's first model call %s (the template included), restore to the grade %s, %d calls to the new model server",
		started.Round(time.Second), time.Since(t1).Round(time.Second), len(ms2.Ledger()))
	if rel, err := f.br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
		t.Fatalf("final release: %+v %v", rel, err)
	}
}
