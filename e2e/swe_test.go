package e2e

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/collect/tasks"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/opencode"
	"github.com/stillpoint/stillpoint/participants/owner/swekind"
)

// The turns of an SWE task's script (tasks.SWE).
const (
	sweTurnLook = iota
	sweTurnTest1
	sweTurnFix
	sweTurnTest2
)

// sweVerdict decodes a result's verdict as the swe kind writes it.
func sweVerdict(t testing.TB, res agentapi.Result) swekind.Verdict {
	t.Helper()
	var v swekind.Verdict
	if err := json.Unmarshal(res.Verdict, &v); err != nil {
		t.Fatalf("verdict of %s: %s: %v", res.Episode, res.Verdict, err)
	}
	return v
}

// checkSWEVerdict checks that an SWE rollout was graded as SWE-bench
// grades: the model's diff kept and applied, every FAIL_TO_PASS and
// PASS_TO_PASS test passing, reward 1.
func checkSWEVerdict(t testing.TB, id string, res agentapi.Result) {
	t.Helper()
	v := sweVerdict(t, res)
	ts := v.TestsStatus
	switch {
	case v.InstanceID != id:
		t.Errorf("%s: the verdict names instance %q", id, v.InstanceID)
	case !v.Resolved || v.Reward != 1:
		t.Errorf("%s: resolved %v reward %v (want resolved, 1): %s\n%s", id, v.Resolved, v.Reward, v.Detail, v.Output)
	case !v.PatchExists || !v.PatchSuccessfullyApplied || !strings.Contains(v.ModelPatch, "diff --git"):
		t.Errorf("%s: the model's patch was not kept and applied: exists %v applied %v\n%s", id, v.PatchExists, v.PatchSuccessfullyApplied, v.ModelPatch)
	case ts == nil || len(ts.FailToPass.Success) == 0 || len(ts.FailToPass.Failure) != 0 || len(ts.PassToPass.Failure) != 0:
		t.Errorf("%s: tests status %+v: want every FAIL_TO_PASS and PASS_TO_PASS test passing", id, ts)
	}
}

// sweThroughTwoCheckpointsAndACrash runs the bundled SWE-style set
// (tasks.SWE: five instances, each in a sandbox made from its own
// container image) with the real OpenCode on provider: a checkpoint while
// every rollout runs its first, slow, test run, another once some have
// applied their fix, then kill -9 of both agents and the owner. The
// collector restores the second checkpoint into the restarted fleet, and
// every rollout ends with exactly one result, graded by the swe kind as
// SWE-bench grades (the model's diff, the test patch, the named tests),
// with no model call repeated and no user turn injected.
func sweThroughTwoCheckpointsAndACrash(t *testing.T, prov string, ownerArgs []string, limit time.Duration) {
	if _, err := opencode.Binary(); err != nil {
		t.Fatal(err)
	}
	if _, err := opencode.Ripgrep(); err != nil {
		t.Fatal(err)
	}
	b := buildBins(t)
	f := startFleet(t, fleetOptions{agents: 2, concurrency: 4, provider: prov,
		swe:       &tasks.SWEOptions{ToolSeconds: 8, Harness: tasks.HarnessOpenCode},
		ownerArgs: append([]string{"--opencode", b.driver, "--image-cache", filepath.Join(t.TempDir(), "images")}, ownerArgs...),
		agentArgs: []string{"--adapter", "opencode", "--launch-timeout", "30m"}})
	inFlight := len(f.tasks)
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	c := f.collector(t)
	c.start("--concurrency", "8")
	reached := func(turn int) (n int) {
		for _, tk := range f.tasks {
			if f.answered(tk.RolloutID, turn) {
				n++
			}
		}
		return n
	}
	poll.Wait(t, limit/2, "every rollout in its first test run", func() bool { return reached(sweTurnTest1) >= inFlight })
	c.signal(syscall.SIGUSR1)
	poll.Wait(t, 3*time.Minute, "the first committed checkpoint", func() bool { return f.latest(ctx) != "" })
	first := f.latest(ctx)
	poll.Wait(t, limit/4, "rollouts on past their fix", func() bool { return reached(sweTurnTest2) >= 2 })
	began := time.Now()
	c.signal(syscall.SIGUSR1)
	poll.Wait(t, 3*time.Minute, "the second committed checkpoint", func() bool {
		l := f.latest(ctx)
		return l != "" && l != first
	})
	t.Logf("checkpoints %s and %s; at the crash %d of %d rollouts were past their fix", first, f.latest(ctx), reached(sweTurnTest2), len(f.tasks))
	f.kill9("agent-a1", "agent-a2", "owner")
	f.startOwner()
	for _, a := range f.agents {
		f.startAgent(a, "--concurrency", "4")
	}
	if code := c.wait(limit / 2); code != 0 {
		t.Fatalf("collect exited %d", code)
	}
	res := c.readResults()
	restored := 0
	for _, tk := range f.tasks {
		r, ok := res[tk.RolloutID]
		if !ok || r.Result == nil {
			continue // readResults said so
		}
		checkSWEVerdict(t, tk.RolloutID, *r.Result)
		f.checkOpenCodeLedger(tk.RolloutID, "")
		if r.Result.Restored {
			restored++
		}
		t.Logf("%-26s attempt %d restored %-5v reward %v", tk.RolloutID, r.Attempt, r.Result.Restored, sweVerdict(t, *r.Result).Reward)
	}
	if restored == 0 {
		t.Error("no rollout continued from the restored checkpoint")
	}
	f.checkLedger(began)
}

// TestOpenCodeSWETasksThroughTwoCheckpointsAndACrash: the SWE-style set on
// overlay, each sandbox's root its instance's image layers.
func TestOpenCodeSWETasksThroughTwoCheckpointsAndACrash(t *testing.T) {
	tier.Heavy(t)
	parallel(t, 1.25, 3*time.Minute)
	sweThroughTwoCheckpointsAndACrash(t, "overlay", nil, 12*time.Minute)
}

// TestMicroVMOpenCodeSWETasksThroughTwoCheckpointsAndACrash: the same on
// microvm, each VM's root disk built from its instance's image; the
// restored forks continue in place. Five OpenCode guests under TCG take
// tens of minutes on 2 cores: a soak test (make test-soak).
func TestMicroVMOpenCodeSWETasksThroughTwoCheckpointsAndACrash(t *testing.T) {
	tier.Soak(t)
	parallel(t, 2, 10*time.Minute) // five guests under TCG, OpenCode in each
	requireMicroVM(t)
	sweThroughTwoCheckpointsAndACrash(t, "microvm", []string{"--microvm-mem", "1024"}, 40*time.Minute)
}

// TestDemoWithOpenCodeOnSWETasks runs `stillpoint demo --harness opencode
// --tasks swe`: the SWE-style set, each sandbox made from its instance's
// image, through the demo's checkpoints and crash, every reward from the
// SWE grading and every invariant ok.
func TestDemoWithOpenCodeOnSWETasks(t *testing.T) {
	tier.Heavy(t)
	parallel(t, 1, 2*time.Minute)
	runDemo(t, "--harness", "opencode", "--tasks", "swe")
}
