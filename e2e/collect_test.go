package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

const bridgeToken = "e2e-token"

// collector runs `stillpoint collect` against the fleet, with the bridge's
// API served from the test.
type collector struct {
	f      *fleet
	url    string
	tasks  string
	output string
	p      *child.Process // the latest run
	runs   int
	// tty, when set, is the collector's stderr: a terminal.
	tty *terminal
}

func (f *fleet) collector(t *testing.T) *collector {
	t.Helper()
	srv := httptest.NewServer(f.br.Handler(bridgeToken))
	t.Cleanup(srv.Close)
	dir := t.TempDir()
	c := &collector{f: f, url: srv.URL, tasks: filepath.Join(dir, "tasks.jsonl"), output: filepath.Join(dir, "results.jsonl")}
	fh, err := os.Create(c.tasks)
	if err != nil {
		t.Fatal(err)
	}
	for _, tk := range f.tasks {
		b, _ := json.Marshal(tk)
		fmt.Fprintln(fh, string(b))
	}
	if err := fh.Close(); err != nil {
		t.Fatal(err)
	}
	return c
}

// start runs the collector once more.
func (c *collector) start(args ...string) {
	c.runs++
	agents := strings.Join(c.f.agents, ",")
	spec := child.Spec{Name: fmt.Sprintf("collect (run %d)", c.runs), Path: c.f.bins.stillpoint,
		Args: append([]string{"--nats-url", c.f.env.URL, "--log-format", "json", "collect", "--run", c.f.run,
			"--tasks", c.tasks, "--output", c.output, "--agents", agents, "--bridge-url", c.url}, args...),
		Env: []string{"STILLPOINT_BRIDGE_TOKEN=" + bridgeToken}}
	if c.tty != nil {
		spec.Stderr = c.tty.tty
	}
	c.p = child.StartForTest(c.f.t, spec)
}

// signal sends sig to the running collector.
func (c *collector) signal(sig syscall.Signal) {
	c.f.t.Helper()
	if err := c.p.Signal(sig); err != nil {
		c.f.t.Fatalf("signal %s to collect: %v", sig, err)
	}
}

// wait waits up to d for the collector to exit and returns its exit
// status, or minus the signal that ended it.
func (c *collector) wait(d time.Duration) int {
	c.f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	exit, err := c.p.Wait(ctx)
	if err != nil {
		// Its goroutines go to its output, to say where it hung.
		_ = c.p.Signal(syscall.SIGQUIT)
		quit, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := c.p.Wait(quit); err != nil {
			c.p.Stop()
		}
		c.f.t.Fatalf("collect did not finish in %s", d)
	}
	if exit.Signal != 0 {
		return -int(exit.Signal)
	}
	return exit.Code
}

// results reads the output and checks that every rollout has exactly one
// line, each with a full grade.
func (c *collector) results() map[string]collect.Result {
	c.f.t.Helper()
	out := c.readResults()
	for _, r := range out {
		if r.OK {
			reward(c.f.t, *r.Result)
		}
	}
	return out
}

// partialResults reads the results written so far, while the collector
// runs (a torn last line is left for the next read).
func (c *collector) partialResults() []collect.Result {
	b, err := os.ReadFile(c.output)
	if err != nil {
		return nil
	}
	var out []collect.Result
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		var r collect.Result
		if json.Unmarshal(line, &r) == nil {
			out = append(out, r)
		}
	}
	return out
}

// readResults reads the output and checks that every rollout has exactly
// one line, each a result, not a failure.
func (c *collector) readResults() map[string]collect.Result {
	c.f.t.Helper()
	fh, err := os.Open(c.output)
	if err != nil {
		c.f.t.Fatal(err)
	}
	defer fh.Close()
	out := map[string]collect.Result{}
	sc := bufio.NewScanner(fh)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var r collect.Result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			c.f.t.Fatalf("output line %q: %v", sc.Text(), err)
		}
		if _, dup := out[r.RolloutID]; dup {
			c.f.t.Errorf("%s: a second result in the output", r.RolloutID)
		}
		out[r.RolloutID] = r
	}
	for _, tk := range c.f.tasks {
		r, ok := out[tk.RolloutID]
		switch {
		case !ok:
			c.f.t.Errorf("%s: no result", tk.RolloutID)
		case !r.OK:
			c.f.t.Errorf("%s: failed: %s", tk.RolloutID, r.Error)
		}
	}
	return out
}

func (f *fleet) latest(ctx context.Context) string {
	st, err := f.br.Status(ctx)
	if err != nil || st.Latest == nil {
		return ""
	}
	return st.Latest.CheckpointID
}

// TestCollectSIGUSR1CheckpointsAndGoesOn: SIGUSR1 takes a checkpoint and
// the collection goes on to write every result exactly once; at the end
// --keep 0 releases everything.
func TestCollectSIGUSR1CheckpointsAndGoesOn(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.75, 10*time.Second)
	f := startFleet(t, fleetOptions{n: 8, agents: 2, concurrency: 8, toolSeconds: 2, steps: 1})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	c := f.collector(t)
	// Its stderr is a terminal: it draws the live line there.
	screen := &jstest.Buffer{}
	tty, err := openTerminal(screen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		tty.close()
		if t.Failed() {
			t.Logf("--- collect's terminal:\n%q", screen.String())
		}
	})
	c.tty = tty
	c.start("--keep", "0")
	f.waitCalls(8, 3)
	c.signal(syscall.SIGUSR1)
	poll.Wait(t, 30*time.Second, "a committed checkpoint", func() bool { return f.latest(ctx) != "" })
	if code := c.wait(time.Minute); code != 0 {
		t.Fatalf("collect exited %d", code)
	}
	tty.close()
	checkProgress(t, screen.String(), 8)
	c.results()
	f.checkLedger(time.Time{})
	if st, err := f.br.Status(ctx); err != nil || len(st.Checkpoints) != 0 {
		t.Fatalf("after --keep 0 checkpoints are left: %+v %v", st, err)
	}
}

// TestCollectSIGTERMStopsAndTheRerunRestores: SIGTERM takes a checkpoint
// with stop and exits 75 once it committed; the job restarts (fresh agents
// and owner) and the rerun restores LATEST, continues the parked rollouts
// and ends with each result written exactly once.
func TestCollectSIGTERMStopsAndTheRerunRestores(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.25, 40*time.Second)
	f := startFleet(t, fleetOptions{n: 8, agents: 2, concurrency: 8, toolSeconds: 3, steps: 1})
	c := f.collector(t)
	c.start()
	f.waitCalls(8, 3)
	c.signal(syscall.SIGTERM)
	if code := c.wait(time.Minute); code != collect.ExitStopped {
		t.Fatalf("collect exited %d after SIGTERM, want %d", code, collect.ExitStopped)
	}
	if f.latest(t.Context()) == "" {
		t.Fatal("no committed checkpoint after the stop")
	}
	// The job restarts: new agent and owner processes.
	f.kill9("agent-a1", "agent-a2", "owner")
	f.startOwner()
	for _, a := range f.agents {
		f.startAgent(a, "--concurrency", "8")
	}
	c.start()
	if code := c.wait(2 * time.Minute); code != 0 {
		t.Fatalf("the rerun exited %d", code)
	}
	res := c.results()
	restored := 0
	for _, r := range res {
		if r.Result != nil && r.Result.Restored {
			restored++
		}
	}
	if restored == 0 {
		t.Fatal("no rollout continued from the restored checkpoint")
	}
	f.checkLedger(time.Time{}.Add(1)) // re-issues only of calls abandoned after a checkpoint began
}

// TestCollectKilledAndRerun: kill -9 of the collector itself; the fleet
// lives on, and the rerun asks again for the attempts in flight: every
// result is written exactly once and no model call is repeated.
func TestCollectKilledAndRerun(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.75, 10*time.Second)
	f := startFleet(t, fleetOptions{n: 8, agents: 2, concurrency: 8, toolSeconds: 2, steps: 1})
	c := f.collector(t)
	c.start("--checkpoint-every", "1s")
	f.waitCalls(8, 3)
	kctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := c.p.Kill(kctx); err != nil {
		t.Fatal(err)
	}
	c.start("--checkpoint-every", "1s")
	if code := c.wait(2 * time.Minute); code != 0 {
		t.Fatalf("the rerun exited %d", code)
	}
	c.results()
	f.checkLedger(time.Time{})
}

// TestCollectAgentRestartedUnderIt: one of two agents is killed with -9 and
// started again while the collection runs, the rest of the fleet lives on.
// No restore can go into a fleet that served: the collector retires the
// lost agent's attempts (the owner stops their sandboxes) and sends them one
// attempt later, asks the other agent again for its own, and every result
// is written exactly once.
func TestCollectAgentRestartedUnderIt(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.75, 10*time.Second)
	f := startFleet(t, fleetOptions{n: 8, agents: 2, concurrency: 8, toolSeconds: 3, steps: 1})
	c := f.collector(t)
	c.start()
	f.waitCalls(8, 3)
	f.kill9("agent-a2")
	f.startAgent("a2", "--concurrency", "8")
	if code := c.wait(75 * time.Second); code != 0 {
		t.Fatalf("collect exited %d", code)
	}
	res := c.results()
	restarted := 0
	for _, r := range res {
		if r.Attempt > 0 {
			restarted++
			if r.Agent != "a2" {
				t.Errorf("%s: attempt %d on %s; only a2's rollouts should start over", r.RolloutID, r.Attempt, r.Agent)
			}
		}
	}
	if restarted == 0 {
		t.Fatal("no rollout of the restarted agent started over")
	}
	f.checkLedger(time.Time{}.Add(1)) // calls the lost agent made may be re-issued by the next attempt
}

// checkProgress checks what a collection of n rollouts drew on its
// terminal: the line redrawn in place, rollouts running on after the
// checkpoint committed, and a last line with every rollout done and the
// committed checkpoint's times.
func checkProgress(t *testing.T, screen string, n int) {
	t.Helper()
	draws := strings.Split(screen, "\r\x1b[K")
	if len(draws) < 3 {
		t.Fatalf("%d live lines drawn on the terminal, want several:\n%q", len(draws)-1, screen)
	}
	last := strings.TrimSpace(draws[len(draws)-1])
	for _, want := range []string{fmt.Sprintf("%d/%d done", n, n), "0 running", "0 failed", "1 checkpoints (last: prepare "} {
		if !strings.Contains(last, want) {
			t.Errorf("the last live line %q does not say %q", last, want)
		}
	}
	after := regexp.MustCompile(`[1-9][0-9]* running .*\| +checkpoint \S+ committed`)
	if !slices.ContainsFunc(draws, after.MatchString) {
		t.Errorf("no live line shows rollouts running on after the checkpoint committed:\n%q", screen)
	}
}
