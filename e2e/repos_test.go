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
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/owner/commandkind"
)

// verdict decodes a command task's verdict.
func verdict(t testing.TB, res agentapi.Result) commandkind.Verdict {
	t.Helper()
	var v commandkind.Verdict
	if err := json.Unmarshal(res.Verdict, &v); err != nil {
		t.Fatalf("verdict of %s: %s: %v", res.Episode, res.Verdict, err)
	}
	return v
}

// checkRepoVerdict checks that a repository task's reward came from its
// own tests: 1 with their passing output after the scripted fix, 0 with
// their failing output for the control task.
func checkRepoVerdict(t testing.TB, id string, res agentapi.Result) {
	t.Helper()
	v := verdict(t, res)
	want, says := 1.0, map[string]string{"py": "OK", "sh": "ok ", "go": "PASS"}[id[:2]]
	if id == tasks.ControlID {
		want, says = 0, "FAILED"
	}
	if id == "py-wordfreq" {
		says = `"hidden": true`
		if !strings.Contains(string(v.Result), `"hidden":true`) {
			t.Errorf("%s: the hidden case of the session data did not pass: %s", id, v.Result)
		}
	}
	if v.Reward != want || !strings.Contains(v.Output, says) {
		t.Errorf("%s: reward %v (want %v), the tests' output does not say %q:\n%s", id, v.Reward, want, says, v.Output)
	}
}

// TestRepoTasksThroughACheckpointAndACrash: the repository set, command
// tasks with the scripted harness, collected through a checkpoint taken
// while every rollout runs its first test run, then kill -9 of the agents
// and the owner. The collector restores the checkpoint into the restarted
// fleet, and every rollout ends with one result whose reward its own tests
// gave: 1 after the scripted fix, 0 for the control task.
func TestRepoTasksThroughACheckpointAndACrash(t *testing.T) {
	tier.E2E(t)
	parallel(t, 1.25, 20*time.Second)
	f := startFleet(t, fleetOptions{agents: 2, concurrency: 8, repos: &tasks.RepoOptions{ToolSeconds: 4}})
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	c := f.collector(t)
	c.start()
	f.waitCallsWithin(len(f.tasks), 2, 2*time.Minute) // each is in its first, slow, test run
	began := time.Now()
	c.signal(syscall.SIGUSR1)
	poll.Wait(t, time.Minute, "a committed checkpoint", func() bool { return f.latest(ctx) != "" })
	f.kill9("agent-a1", "agent-a2", "owner")
	f.startOwner()
	for _, a := range f.agents {
		f.startAgent(a, "--concurrency", "8")
	}
	if code := c.wait(3 * time.Minute); code != 0 {
		t.Fatalf("collect exited %d", code)
	}
	res := c.readResults()
	restored := 0
	for _, tk := range f.tasks {
		r, ok := res[tk.RolloutID]
		if !ok || r.Result == nil {
			continue // readResults said so
		}
		checkRepoVerdict(t, tk.RolloutID, *r.Result)
		if r.Result.Restored {
			restored++
		}
		t.Logf("%-16s attempt %d restored %-5v reward %v", tk.RolloutID, r.Attempt, r.Result.Restored, verdict(t, *r.Result).Reward)
	}
	if restored == 0 {
		t.Error("no rollout continued from the restored checkpoint")
	}
	f.checkLedger(began)
}

// TestCheckpointDuringASlowVerify: a checkpoint taken while a repository
// task's verify runs (it sleeps 12 s before the tests) commits without
// waiting for it: its prepare takes a small part of the verify's time, and
// it exports the rollout at its verify bookmark. After kill -9 of the agent
// and the owner, a restore from it grades again on the fork, in full, and
// the rollout returns exactly one result.
func TestCheckpointDuringASlowVerify(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.25, 15*time.Second)
	const verifySeconds = 12
	f := startFleet(t, fleetOptions{concurrency: 1, repos: &tasks.RepoOptions{VerifySeconds: verifySeconds, NoControl: true}})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	i := slices.IndexFunc(f.tasks, func(tk collect.Task) bool { return tk.RolloutID == "py-calc" })
	id := f.tasks[i].RolloutID
	lost, abandon := context.WithCancel(ctx)
	first := f.dispatch(lost, i, 0)
	poll.Wait(t, time.Minute, "the harness's last model call", func() bool { return f.callsOf()[id] >= 5 })
	var caught *bridgeapi.CheckpointResult
	n := 0
	poll.Wait(t, verifySeconds*time.Second/2, "a checkpoint that catches the verify in flight", func() bool {
		n++
		res := f.checkpoint(ctx, fmt.Sprintf("c%d", n))
		if f.agentRecords(ctx, res.CheckpointID, "a1")[id].Next != agentapi.StageVerify {
			return false // the harness had not ended yet: look again
		}
		caught = res
		return true
	})
	t.Logf("checkpoint %s with the verify in flight: prepare %d ms, commit %d ms; the verify takes over %d ms",
		caught.CheckpointID, caught.PrepareMS, caught.CommitMS, verifySeconds*1000)
	if caught.PrepareMS*4 > verifySeconds*1000 {
		t.Errorf("the prepare took %d ms: it waited for the verify", caught.PrepareMS)
	}
	select {
	case o := <-first:
		t.Fatalf("the rollout returned before its verify could have ended: %+v %v", o.res, o.err)
	default:
	}

	f.kill9("agent-a1", "owner")
	abandon()
	if o := <-first; o.err == nil {
		t.Fatalf("a rollout returned across the crash: %+v", o.res)
	}
	f.startOwner()
	f.startAgent("a1")
	rr, err := f.br.Restore(ctx, bridgeapi.RestoreRequest{Source: caught.CheckpointID})
	if err != nil || rr.Status != bridgeapi.StatusCompleted {
		t.Fatalf("restore: %+v %v", rr, err)
	}
	o := <-f.dispatch(ctx, i, 1)
	if o.err != nil {
		t.Fatalf("after the restore: %v", o.err)
	}
	checkRepoVerdict(t, id, o.res)
	if v := verdict(t, o.res); !o.res.Restored || v.TookMS < verifySeconds*1000 {
		t.Errorf("the restored attempt: restored %v, its verify took %d ms: want a restored attempt that graded again in full",
			o.res.Restored, v.TookMS)
	}
	if rel, err := f.br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
		t.Fatalf("final release: %+v %v", rel, err)
	}
}
