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
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/claude"
	"github.com/stillpoint/stillpoint/participants/claude/driver"
	"github.com/stillpoint/stillpoint/participants/scripted"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
)

// The Claude Code tests run the real Claude Code (claude.Binary) in real
// sandboxes, through the owner's --claude and the agent's --adapter
// claude: the OpenCode suite's scenarios (opencode_test.go, whose helpers
// they share), on the Anthropic Messages API. docs/CLAUDE.md tells what
// each shows.

// claudeProcs are Claude Code's: its session file.
var claudeProcs = harnessProcs{driver: claude.DriverName, harness: claude.ClaudeName,
	store: []string{driver.ConfigDir + "/projects/*/*.jsonl"}}

// claudeTasks are openCodeTasks in Claude's tools: the same repository
// task, turn for turn (turnRead ... turnAnswer). The test runs start
// with an echo: Claude refuses a command that starts with a long sleep.
func claudeTasks(prefix string, n int, toolSeconds float64) ([]collect.Task, modelserver.Script) {
	script := modelserver.Script{}
	ts := make([]collect.Task, n)
	for i := range n {
		id := fmt.Sprintf("%s-%d", prefix, i)
		test := fmt.Sprintf("echo testing; sleep %g; sh test.sh", toolSeconds)
		script[id] = []modelserver.Turn{
			turnRead:   {Content: "Reading calc.sh.", ToolCalls: []modelserver.ToolCall{modelserver.ClaudeReadCall("toolu_c0", "calc.sh")}},
			turnEdit:   {ToolCalls: []modelserver.ToolCall{modelserver.ClaudeEditCall("toolu_c1", "calc.sh", "$1 - $2", "$1 + $2")}},
			turnTest1:  {Content: "Running the test.", ToolCalls: []modelserver.ToolCall{modelserver.ClaudeBashCall("toolu_c2", test)}},
			turnNote:   {ToolCalls: []modelserver.ToolCall{modelserver.ClaudeWriteCall("toolu_c3", "NOTES.md", fmt.Sprintf("fixed-%d\n", i))}},
			turnTest2:  {ToolCalls: []modelserver.ToolCall{modelserver.ClaudeBashCall("toolu_c4", test)}},
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

// claudeDriver builds the static claude-driver, failing at once, saying
// how to install it, without Claude Code on the host.
func claudeDriver(t *testing.T) string {
	t.Helper()
	if _, err := claude.Binary(); err != nil {
		t.Fatal(err)
	}
	return build.StaticForTest(t, build.ClaudeDriver)[build.ClaudeDriver]
}

// claudeOwnerArgs are the owner's flags of a Claude fleet: Claude Code
// shown in the sandboxes, and the relays translating its Messages calls to
// chat completions, so that the trajectories have token ids (the
// trajectory invariant holds a chain of them against the model server).
func claudeOwnerArgs(drv string) []string {
	return []string{"--claude", drv, "--model-api-translate"}
}

// startClaudeFleet starts a fleet whose owner shows Claude Code in its
// sandboxes and pauses in mode, and whose agents run the Claude adapter.
func startClaudeFleet(t *testing.T, prefix string, n, agents int, mode string, toolSeconds float64, agentArgs ...string) *fleet {
	t.Helper()
	drv := claudeDriver(t)
	ts, script := claudeTasks(prefix, n, toolSeconds)
	return startFleet(t, fleetOptions{n: n, agents: agents, concurrency: n, tasks: ts, script: script,
		ownerArgs: append(claudeOwnerArgs(drv), "--pause-mode", mode),
		agentArgs: append([]string{"--adapter", "claude", "--launch-timeout", "10m"}, agentArgs...)})
}

// checkClaudeLedger checks a task's calls as checkOpenCodeLedger does, and
// that every one came as a chat completion (the relay's translation).
func (f *fleet) checkClaudeLedger(task, want string) {
	f.t.Helper()
	for _, e := range f.entries(task) {
		if e.API != "chat" {
			f.t.Errorf("%s: call %+v: want the relay's chat completion", task, e)
		}
	}
	f.checkOpenCodeLedger(task, want)
}

// TestClaudePausedFourTimes: a Claude Code rollout paused in place four
// times, in freeze and in stop mode (a fleet each, side by side):
// mid-tool, while its model reply is held (released during the pause),
// for 2 minutes mid-tool, and mid-stream. While paused no process of the
// launch runs (each one's CPU time the same; the tool shells are in
// sessions of their own) and the session file does not change; the same
// launch finishes the task with every model call made once.
func TestClaudePausedFourTimes(t *testing.T) {
	tier.Heavy(t)
	parallel(t, 0.5, 150*time.Second)
	for _, mode := range []string{"freeze", "stop"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			f := startClaudeFleet(t, "cl-"+mode, 1, 1, mode, 3600)
			ctx, cancel := context.WithTimeout(t.Context(), 6*time.Minute)
			defer cancel()
			id := f.id(0)
			out := f.dispatch(ctx, 0, 0)
			l := f.findLaunchOf(claudeProcs, id)

			poll.Wait(t, 3*time.Minute, "Claude in its first test run", func() bool {
				return f.answered(id, turnTest1) && l.has("sleep")
			})
			var seen []string
			seen = append(seen, f.pausedFor(ctx, "c1-mid-tool", mode, l, 2*time.Second, f.ms.Hold))
			l.end(t, "sleep")

			poll.Wait(t, time.Minute, "Claude waiting for its held reply", func() bool { return f.ms.Held() == 1 })
			seen = append(seen, f.pausedFor(ctx, "c2-held-reply", mode, l, 2*time.Second, f.ms.Release))

			poll.Wait(t, time.Minute, "Claude in its second test run", func() bool {
				return f.answered(id, turnTest2) && l.has("sleep")
			})
			seen = append(seen, f.pausedFor(ctx, "c3-two-minutes", mode, l, 2*time.Minute, func() { f.ms.SlowNext(time.Second) }))
			l.end(t, "sleep")

			poll.Wait(t, time.Minute, "Claude reading its answer", func() bool {
				es := f.entries(id)
				e := es[len(es)-1]
				return e.Turn == turnAnswer && e.Chunks >= 2 && e.Delivered.IsZero()
			})
			seen = append(seen, f.pausedFor(ctx, "c4-mid-stream", mode, l, 2*time.Second, nil))
			if len(slices.Compact(slices.Clone(seen))) != 1 {
				t.Fatalf("Claude processes paused: %q, want the same one four times", seen)
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
			f.checkClaudeLedger(id, "0 1 2 3 4 5")
			if rel, err := f.br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
				t.Fatalf("final release: %+v %v", rel, err)
			}
		})
	}
}

// TestClaudeSnapshotForksIntoAContinuation: a checkpoint with stop
// snapshots a Claude Code rollout paused mid-tool; a fresh owner and agent
// restore it, and its next attempt relaunches in the fork, where the
// driver continues the saved session: Claude's continuation prompt and
// synthetic reply removed by the relay (the ledger sees one user turn in
// every call), the saved user turns unchanged (the driver checks them),
// the interrupted test run re-issued once, the task's test passing.
func TestClaudeSnapshotForksIntoAContinuation(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.25, 30*time.Second)
	f := startClaudeFleet(t, "cl-fork", 1, 1, "freeze", 4)
	snapshotForks(t, f, claudeProcs, "Claude", f.checkClaudeLedger, removal{edit: relay.ClaudeContinueEdit, is: claudeContinuation,
		what: fmt.Sprintf("the continuation prompt (after %q)", relay.ClaudeNoResponse)})
}

// claudeContinuation tells whether removed is Claude's continuation: the
// user message of the continuation prompt, after the assistant message
// ClaudeNoResponse when Claude added one.
func claudeContinuation(removed []json.RawMessage) bool {
	is := func(r json.RawMessage, role, text string) bool {
		var m struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		}
		return json.Unmarshal(r, &m) == nil && m.Role == role && strings.Contains(string(m.Content), text)
	}
	switch len(removed) {
	case 1:
		return is(removed[0], "user", relay.ClaudeContinuePrompt)
	case 2:
		return is(removed[0], "assistant", relay.ClaudeNoResponse) && is(removed[1], "user", relay.ClaudeContinuePrompt)
	}
	return false
}

// TestClaudeRolloutsThroughACrash: four Claude Code rollouts on two agents
// go through a checkpoint; with all of them in flight, kill -9 of both
// agents and the owner. The restore forks every sandbox and continues
// every rollout; each returns exactly one result with a full grade, no
// model call is repeated and no user turn injected.
func TestClaudeRolloutsThroughACrash(t *testing.T) {
	tier.E2E(t)
	parallel(t, 1, 60*time.Second)
	const n = 4
	f := startClaudeFleet(t, "cl-crash", n, 2, "freeze", 5)
	rolloutsThroughACrash(t, f, n, func(task string) { f.checkClaudeLedger(task, "") })
}

// TestClaudeRepoTasksThroughTwoCheckpointsAndACrash: the repository set
// run by the real Claude Code, 8 rollouts at once on two agents: Read,
// Bash for the tests, Edit or Write for the fix, Bash again. The collector
// checkpoints while every running rollout is in its first, slow, test run
// and again once they have gone on; then kill -9 of both agents and the
// owner. The collector restores the second checkpoint into the restarted
// fleet, and every rollout ends with exactly one result whose reward its
// own tests gave, no model call repeated and no user turn injected.
func TestClaudeRepoTasksThroughTwoCheckpointsAndACrash(t *testing.T) {
	tier.Heavy(t)
	parallel(t, 1.25, 3*time.Minute)
	const inFlight = 8
	drv := claudeDriver(t)
	f := startFleet(t, fleetOptions{agents: 2, concurrency: inFlight,
		repos:     &tasks.RepoOptions{ToolSeconds: 8, Harness: tasks.HarnessClaude},
		ownerArgs: claudeOwnerArgs(drv),
		agentArgs: []string{"--adapter", "claude", "--launch-timeout", "10m"}})
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
		f.checkClaudeLedger(tk.RolloutID, "")
		if r.Result.Restored {
			restored++
			if l := r.Result.Launches; len(l) > 0 && l[len(l)-1].Continued {
				continued++
			}
		}
		t.Logf("%-16s attempt %d restored %-5v reward %v", tk.RolloutID, r.Attempt, r.Result.Restored, verdict(t, *r.Result).Reward)
	}
	if restored == 0 || continued == 0 {
		t.Errorf("%d rollouts continued from the restored checkpoint, %d of them on their saved Claude session: want some of each", restored, continued)
	}
	f.checkLedger(began)
}

// TestDemoWithClaude runs `stillpoint demo --harness claude` on 4 of the
// repository tasks, run by the real Claude Code all at once, through the
// demo's checkpoints and crash, every reward from the repository's tests
// and the invariants, the trajectory's included, checked.
func TestDemoWithClaude(t *testing.T) {
	tier.E2E(t)
	parallel(t, 1, 1*time.Minute)
	runDemo(t, "--harness", "claude", "--rollouts", "4")
}

// TestMicroVMClaudeContinuesInPlace: one real Claude Code rollout on the
// microvm provider (1.5 GiB guest, Claude's directory on the harness
// disk), checkpointed while Claude waits for a model reply; the agent and
// the owner are killed with SIGKILL, and a new agent and owner with a new
// model server restore. The Claude process the snapshot kept is taken
// over in place, its cut call and every later one reach the new model
// server through the relay, and it finishes with its grade.
func TestMicroVMClaudeContinuesInPlace(t *testing.T) {
	tier.Heavy(t)
	parallel(t, 1, 4*time.Minute) // the guest under TCG, and Claude in it
	requireMicroVM(t)
	drv := claudeDriver(t)
	ts, script := claudeTasks("clvm", 1, 1)
	began := time.Now()
	f := startFleet(t, fleetOptions{n: 1, concurrency: 1, tasks: ts, script: script, provider: "microvm",
		ownerArgs: append(claudeOwnerArgs(drv), "--microvm-mem", "1536"),
		agentArgs: []string{"--adapter", "claude", "--launch-timeout", "30m"}})
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
		t.Fatalf("Claude's first model call held by the model server: %v after %s", err, time.Since(began).Round(time.Second))
	}
	started := time.Since(began)
	f.checkpoint(ctx, "c1")
	bm := f.agentRecords(ctx, "c1", "a1")[f.id(0)]
	if len(bm.Launches) != 1 || bm.Launches[0].Held == nil || !bm.Launches[0].Relay {
		t.Fatalf("exported bookmark %+v: want the Claude launch held through the relay", bm)
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
		t.Fatalf("launch log %+v: want the one Claude launch resumed in place and finished", o.res.Launches)
	}
	if len(ms2.Ledger()) == 0 {
		t.Fatal("no model call reached the new model server")
	}
	for _, ms := range []*modelserver.Server{f.ms, ms2} {
		if r := ms.Repeats(); len(r) != 0 {
			t.Errorf("repeated model calls: %v", r)
		}
		for _, e := range ms.Ledger() {
			if e.UserTurns != 1 {
				t.Errorf("%s: a request with %d user turns: a turn was injected", e.Task, e.UserTurns)
			}
		}
	}
	t.Logf("cost: to Claude's first model call %s (the template included), restore to the grade %s, %d calls to the new model server",
		started.Round(time.Second), time.Since(t1).Round(time.Second), len(ms2.Ledger()))
	if rel, err := f.br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
		t.Fatalf("final release: %+v %v", rel, err)
	}
}

// removal is what the relay edit of a harness's continuation takes out of
// each of its calls: the edit's name, a test of what it removed, and what
// that is, for the failure.
type removal struct {
	edit string
	is   func(removed []json.RawMessage) bool
	what string
}

// snapshotForks is the fork scenario of a harness whose continuation the
// relay edits, on fleet f of one rollout (h its processes, name its name):
// a checkpoint with stop while the launch is mid-tool, the agent and the
// owner stopped, a restore into fresh ones; the restored attempt continues
// the saved session, re-issues the interrupted call first, and every call
// of the continuation records removal in the trajectory; checkLedger
// checks the calls against want.
func snapshotForks(t *testing.T, f *fleet, h harnessProcs, name string, checkLedger func(task, want string), removal removal) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	id := f.id(0)
	lost, abandon := context.WithCancel(ctx)
	defer abandon()
	out := f.dispatch(lost, 0, 0)
	l := f.findLaunchOf(h, id)
	poll.Wait(t, 3*time.Minute, name+" in its first test run", func() bool { return f.answered(id, turnTest1) && l.has("sleep") })
	began := time.Now()
	res, err := f.br.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: "c1", Stop: true})
	if err != nil || res.Status != bridgeapi.StatusCommitted || len(res.Continued) != 1 {
		t.Fatalf("checkpoint with stop: %+v %v", res, err)
	}
	bm := f.agentRecords(ctx, "c1", "a1")[id]
	if bm.Next != agentapi.StageLaunch || !bm.Resume {
		t.Fatalf("exported bookmark: next %s resume %v", bm.Next, bm.Resume)
	}
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
	checkLedger(id, "0 1 2 2r 3 4 5")
	f.checkLedger(began)
	// The trajectory records what the relay removed from each call of the
	// continuation: exactly the harness's addition.
	edited := 0
	for _, c := range readTrajectory(ctx, t, f, o.res.Trajectory).Calls() {
		for _, e := range c.Edits {
			if e.Name != removal.edit || !removal.is(e.Removed) {
				t.Errorf("call %s: edit %s removed %s, want %s removing %s", c.ID, e.Name, e.Removed, removal.edit, removal.what)
			}
			edited++
		}
	}
	if want := len(es) - calls; edited != want {
		t.Errorf("%d calls record the removal of %s, want the continuation's %d", edited, removal.what, want)
	}
	if rel, err := f.br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
		t.Fatalf("final release: %+v %v", rel, err)
	}
}
