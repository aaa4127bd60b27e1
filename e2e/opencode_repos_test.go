package e2e

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/e2e/tasks"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/opencode"
)

// The turns of a repository task's script (tasks.Repos).
const (
	repoTurnLook = iota
	repoTurnTest1
	repoTurnFix
	repoTurnTest2
)

// TestOpenCodeRepoTasksThroughTwoCheckpointsAndACrash: the repository set
// run by the real OpenCode, 8 rollouts at once on two agents (the tenth
// and the ninth wait for a slot): OpenCode reads the code with its read
// tool, runs the tests with bash, fixes the code with edit or write and
// runs the tests again. The collector takes a checkpoint while every
// running rollout is in its first, slow, test run and another once they
// have gone on; then kill -9 of both agents and the owner. The collector
// restores the second checkpoint into the restarted fleet, and every
// rollout ends with exactly one result whose reward its own tests gave
// (1 after the fix, 0 for the control task), no model call repeated and
// no user turn injected. Cost: about 3 minutes, 8 OpenCode processes at
// once (0.6 GB and 4 s of CPU to start each), then as many again.
func TestOpenCodeRepoTasksThroughTwoCheckpointsAndACrash(t *testing.T) {
	tier.E2E(t)
	if _, err := opencode.Binary(); err != nil {
		t.Fatal(err)
	}
	if _, err := opencode.Ripgrep(); err != nil {
		t.Fatal(err)
	}
	const inFlight = 8
	b := buildBins(t)
	f := startFleet(t, fleetOptions{agents: 2, concurrency: inFlight,
		repos:     &tasks.RepoOptions{ToolSeconds: 8, Harness: tasks.HarnessOpenCode},
		ownerArgs: []string{"--opencode", b.driver},
		agentArgs: []string{"--adapter", "opencode", "--launch-timeout", "10m"}})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	c := f.collector(t)
	c.start("--concurrency", "8")

	// reached counts the rollouts whose call at turn was answered, and
	// those that have started at all.
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
		f.checkOpenCodeLedger(tk.RolloutID, "")
		if r.Result.Restored {
			restored++
			if l := r.Result.Launches; len(l) > 0 && l[len(l)-1].Continued {
				continued++
			}
		}
		t.Logf("%-16s attempt %d restored %-5v reward %v", tk.RolloutID, r.Attempt, r.Result.Restored, verdict(t, *r.Result).Reward)
	}
	if restored == 0 || continued == 0 {
		t.Errorf("%d rollouts continued from the restored checkpoint, %d of them on their saved OpenCode session: want some of each", restored, continued)
	}
	t.Logf("%d rollouts restored, %d of them continued their saved OpenCode session", restored, continued)
	f.checkLedger(began)
}
