package e2e

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream/attack"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
)

// TestTwoRunsUnderAttack is issue 29's acceptance: two runs, r1 and r2, each
// a demo against one `stillpoint server --auth-dir` (each run its own
// account), while the credentials of one of r1's sandboxes, read from the
// file its workload can read, run every attack of `stillpoint attack` in a
// loop. Every attack is refused, and both demos end invariants ok with every
// checkpoint committed. Their agents, each with a user of its own, stored
// their trajectories in stores of their own (ownTrajectories).
func TestTwoRunsUnderAttack(t *testing.T) {
	tier.E2E(t)
	parallel(t, 2, 3*time.Minute)
	b := buildBins(t)
	dir := t.TempDir()
	auth := filepath.Join(dir, "auth")
	srv := child.StartForTest(t, child.Spec{Name: "server", Path: b.stillpoint,
		Args: []string{"server", "--dir", filepath.Join(dir, "nats"), "--listen", "127.0.0.1:0", "--auth-dir", auth}})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	m, err := srv.WaitOutput(ctx, regexp.MustCompile(`NATS ready at (\S+)`))
	if err != nil {
		t.Fatal(err)
	}
	url := m[1]
	demos := map[string]*child.Process{}
	dirs := map[string]string{}
	for _, run := range []string{"r1", "r2"} {
		dirs[run] = filepath.Join(dir, run)
		demos[run] = child.StartForTest(t, child.Spec{Name: "demo " + run, Path: b.stillpoint, Dir: "..",
			Args: []string{"--nats-url", url, "demo", "--dir", dirs[run], "--auth-dir", auth, "--run", run}})
	}
	// The first sandbox of r1 to have its credentials: what its workload reads.
	var creds string
	poll.Wait(t, 3*time.Minute, "a sandbox of r1 with credentials of its own", func() bool {
		files, _ := filepath.Glob(filepath.Join(dirs["r1"], "owner-*", "creds", "*", "nats.creds"))
		if len(files) == 0 {
			return false
		}
		creds = files[0]
		return true
	})
	sandbox := filepath.Base(filepath.Dir(creds))
	att := child.StartForTest(t, child.Spec{Name: "attack", Path: b.stillpoint,
		Args: []string{"--nats-url", url, "--creds", creds, "attack", "--run", "r1", "--member", "sandbox." + sandbox,
			"--victims", "agent.a1,agent.a2,owner.o1,owner.o2", "--rounds", "0", "--every", "500ms"}})

	for run, p := range demos {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
		exit, err := p.Wait(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		out := p.Output()
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if last := lines[len(lines)-1]; !exit.Success() || !strings.Contains(last, "invariants ok") {
			t.Errorf("demo %s under attack: %s, last line %q\n%s", run, exit, last, out)
		}
		for _, l := range lines {
			if f := strings.Fields(l); len(f) > 1 && strings.HasPrefix(f[0], "c-") && f[1] != "committed" {
				t.Errorf("demo %s under attack: checkpoint %s %s", run, f[0], f[1])
			}
		}
	}
	for run := range demos {
		ownTrajectories(t, b, url, auth, run, dirs[run])
	}
	att.Stop()
	rounds, refused := map[int]bool{}, 0
	for _, l := range strings.Split(strings.TrimSpace(att.Output()), "\n") {
		var o struct {
			Round int `json:"round"`
			attack.Outcome
		}
		if json.Unmarshal([]byte(l), &o) != nil || o.Attack == "" {
			continue
		}
		rounds[o.Round] = true
		if o.Round == 1 {
			t.Logf("round 1: %s", o.Outcome)
		}
		if !o.Refused {
			t.Errorf("round %d: %s got through: %s", o.Round, o.Attack, o.Detail)
			continue
		}
		refused++
	}
	if len(rounds) < 2 {
		t.Errorf("the attacks ran %d rounds while the demos ran, want several:\n%s", len(rounds), att.Output())
	}
	t.Logf("%d rounds of attacks, %d refused", len(rounds), refused)
}

// ownTrajectories checks that every result of run (its demo in dir, its
// collector's results.jsonl, which invariant 8 read) names its trajectory
// in its agent's own store (issue 29: the shared store is no agent's to
// write), and that `stillpoint trajectory`, as the run's controller, reads
// each from there.
func ownTrajectories(t *testing.T, b bins, url, auth, run, dir string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(dir, "results.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{} // rollout -> bucket
	for _, line := range strings.Split(strings.TrimSpace(string(raw)), "\n") {
		var cr collect.Result
		if err := json.Unmarshal([]byte(line), &cr); err != nil {
			t.Fatalf("%s's results: %q: %v", run, line, err)
		}
		if !cr.OK || cr.Result == nil || cr.Result.Trajectory == nil {
			continue
		}
		bucket := events.TrajectoriesBucket(run, events.Member("agent."+strings.TrimPrefix(cr.Agent, "agent.")))
		if got := cr.Result.Trajectory.Bucket; got != bucket {
			t.Errorf("%s: %s's trajectory is in %q, want its agent's own %s", run, cr.RolloutID, got, bucket)
		}
		want[cr.RolloutID] = bucket
	}
	if len(want) == 0 {
		t.Fatalf("%s: no result names a trajectory", run)
	}
	p := child.StartForTest(t, child.Spec{Name: "trajectory " + run, Path: b.stillpoint,
		Args: []string{"--nats-url", url, "--creds", embedded.CredsFile(embedded.RunDir(auth, run), embedded.RoleController),
			"trajectory", "--run", run}})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	if exit, err := p.Wait(ctx); err != nil || !exit.Success() {
		t.Fatalf("stillpoint trajectory --run %s as the controller: %s %v\n%s", run, exit, err, p.Output())
	}
	got := map[string]string{}
	for _, line := range strings.Split(p.Output(), "\n") {
		var rt struct{ Rollout, Bucket string }
		if json.Unmarshal([]byte(line), &rt) == nil && rt.Rollout != "" {
			got[rt.Rollout] = rt.Bucket
		}
	}
	for rollout, bucket := range want {
		if got[rollout] != bucket {
			t.Errorf("%s: stillpoint trajectory read %s's from %q, want %s", run, rollout, got[rollout], bucket)
		}
	}
}
