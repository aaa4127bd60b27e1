package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/collect/tasks"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/exec/example"
	"github.com/stillpoint/stillpoint/participants/scripted"
)

// The exec tests run the exec adapter's bundled example (a Python 3 agent
// defined by its JSON spec, participants/exec/example) on the scripted
// task set, in overlay sandboxes, which see the host's python3.

// startExecFleet starts a fleet whose owner shows the example in its
// sandboxes (--bind) and whose agents run it through --adapter exec. It
// fails at once, saying how to install it, without python3.
func startExecFleet(t *testing.T, o fleetOptions) *fleet {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatalf("python3 is required (the exec adapter's example agent): apt-get install python3: %v", err)
	}
	dir := filepath.Join(t.TempDir(), "exec-harness")
	spec, err := example.Write(dir)
	if err != nil {
		t.Fatal(err)
	}
	o.ownerArgs = append(o.ownerArgs, "--bind", dir+":"+example.SandboxDir)
	o.agentArgs = append([]string{"--adapter", "exec", "--harness-spec", spec}, o.agentArgs...)
	if o.tasks == nil {
		// The scripted set, each prompt one that no shell would pass whole:
		// the check finds the saved session only if the launch and the
		// check both got it intact.
		o.tasks, o.script = tasks.Set(tasks.Options{N: o.n, ToolSeconds: o.toolSeconds, Steps: o.steps})
		for i, tk := range o.tasks {
			var p scripted.Task
			if err := json.Unmarshal(tk.Task, &p); err != nil {
				t.Fatal(err)
			}
			p.Prompt += "\nSay \"done\" when it's there; don't touch $HOME or `ls`. {braces}"
			o.tasks[i].Task, _ = json.Marshal(p)
		}
	}
	return startFleet(t, o)
}

// TestDemoWithExec runs `stillpoint demo --harness exec`: the scripted
// task set run by the exec adapter's example agent through the demo's
// checkpoints and crash, the invariants (the trajectory one included) ok.
func TestDemoWithExec(t *testing.T) {
	tier.E2E(t)
	parallel(t, 1, 30*time.Second)
	runDemo(t, "--harness", "exec")
}

// TestExecRolloutsThroughACrash: rollouts of the example agent on two
// agents, caught mid-tool by a checkpoint, then kill -9 of the agents and
// the owner. The restore forks every sandbox; asked again as the next
// attempt, each rollout's check finds its saved session, and the continue
// goes on from it with no new user turn: in the model server's ledger the
// new attempt's first call carries the saved conversation and asks for the
// turn after it, every call holds the one user turn, and none is repeated.
func TestExecRolloutsThroughACrash(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.5, 20*time.Second)
	const n = 4
	// A long computing tool: the checkpoint catches the rollouts in it.
	f := startExecFleet(t, fleetOptions{n: n, agents: 2, concurrency: n, toolSeconds: 6, steps: 1})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	lost, abandon := context.WithCancel(ctx)
	var first []<-chan outcome
	for i := range n {
		first = append(first, f.dispatch(lost, i, 0))
	}
	f.waitCalls(n, 3) // each is in its 6 s computing tool, or about to be
	began := time.Now()
	res := f.checkpoint(ctx, "c1")
	if len(res.Continued) != n {
		t.Fatalf("c1 continued %v", res.Continued)
	}
	f.kill9("agent-a1", "agent-a2", "owner")
	abandon()
	for _, ch := range first {
		if o := <-ch; o.err == nil {
			t.Fatalf("a rollout returned across the crash: %+v", o.res)
		}
	}
	f.startOwner()
	for _, a := range f.agents {
		f.startAgent(a, "--concurrency", fmt.Sprint(n))
	}
	rr, err := f.br.Restore(ctx, bridgeapi.RestoreRequest{})
	if err != nil || rr.Status != bridgeapi.StatusCompleted {
		t.Fatalf("restore: %+v %v", rr, err)
	}
	var second []<-chan outcome
	for i := range n {
		second = append(second, f.dispatch(ctx, i, 1))
	}
	for i, ch := range second {
		o := <-ch
		if o.err != nil {
			t.Fatalf("%s after the restore: %v", tasks.ID(i), o.err)
		}
		reward(t, o.res)
		f.checkTrajectory(o.res)
		last := o.res.Launches[len(o.res.Launches)-1]
		if !o.res.Restored || len(o.res.Launches) != 2 || !last.Continued || last.Attempt != 1 || !strings.HasPrefix(last.Why, "check: ") {
			t.Errorf("%s: restored %v, launch log %+v: want the attempt-0 launch, then one attempt-1 launch that continued the session by the check",
				tasks.ID(i), o.res.Restored, o.res.Launches)
		}
		f.checkExecLedger(tasks.ID(i), began)
	}
	f.checkLedger(began)
	if rel, err := f.br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
		t.Fatalf("final release: %+v %v", rel, err)
	}
}

// TestExecThatDoesNotPauseIsStoppedAndRelaunched: with --no-pause, a
// checkpoint stops the example agent mid-tool (SIGINT to its tree: it ends
// without the tool's result) and, after the resume, relaunches it through
// the check on its saved session, whose continue runs the tool again and
// finishes the task with no model call repeated.
func TestExecThatDoesNotPauseIsStoppedAndRelaunched(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.25, 10*time.Second)
	f := startExecFleet(t, fleetOptions{n: 1, toolSeconds: 6, steps: 1, noPause: true})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	out := f.dispatch(ctx, 0, 0)
	f.waitCalls(1, 3) // in its 6 s computing tool
	began := time.Now()
	f.checkpoint(ctx, "c1")
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
	f.checkLedger(began)
	if r := f.ms.Reissued(); len(r) != 0 {
		t.Fatalf("calls re-issued %+v: one attempt, nothing to re-issue", r)
	}
}

// checkExecLedger checks a task's calls across the crash: one user turn in
// each, and every turn of the script answered. The restored attempt's
// first call carries the saved conversation whole (the prompt, then each
// turn's reply and its tool's result) and is at a turn no earlier than
// the last the first attempt asked for before the checkpoint began (its
// reply to the turn before was saved then) and no later than the one
// after its last call: the continue went on from the saved session, it
// did not start over.
func (f *fleet) checkExecLedger(task string, began time.Time) {
	f.t.Helper()
	restored := events.Episode{Rollout: task, Attempt: 1}.String()
	var got []string
	low, high, first := -1, -1, -1
	answered := map[int]bool{}
	for _, e := range f.entries(task) {
		got = append(got, fmt.Sprintf("%d@%s", e.Turn, e.Episode))
		if e.UserTurns != 1 {
			f.t.Errorf("%s: call %+v: want one user turn", task, e)
		}
		if !e.Delivered.IsZero() {
			answered[e.Turn] = true
		}
		switch {
		case e.Episode != restored:
			high = max(high, e.Turn+1)
			if e.Time.Before(began) {
				low = max(low, e.Turn)
			}
		case first < 0:
			first = e.Turn
			if want := 1 + 2*e.Turn; e.Messages != want {
				f.t.Errorf("%s: the restored attempt's first call, at turn %d, carried %d messages, want %d (the saved session)", task, e.Turn, e.Messages, want)
			}
		}
	}
	f.t.Logf("%s: turns called %s", task, strings.Join(got, " "))
	if first < low || first > high || first < 1 {
		f.t.Errorf("%s: the restored attempt first called turn %d, want one in [%d, %d]: the saved session's next", task, first, low, high)
	}
	for turn := range f.script[task] {
		if !answered[turn] {
			f.t.Errorf("%s: turn %d never answered", task, turn)
		}
	}
}
