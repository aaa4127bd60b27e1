package collect

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	agent "github.com/stillpoint/stillpoint/participants/agent/agentapi"
)

var errInfra = errors.New("collect test: the sandbox would not start")

// serveInfraAgent serves agent name of run, failing with CodeInfra every
// attempt below okFrom (-1: every attempt), and records the attempts it
// was asked.
func serveInfraAgent(t *testing.T, env *jstest.Env, run, name string, okFrom int, asked *[]string, mu *sync.Mutex) {
	t.Helper()
	nc, _ := env.Connect(t)
	serveRun(t, nc, run, name, errInfra, 502, agent.CodeInfra, func(req agent.Request) (any, error) {
		ep := events.Episode{Rollout: req.RolloutID, Attempt: req.Attempt}.String()
		mu.Lock()
		*asked = append(*asked, name+":"+ep)
		mu.Unlock()
		if okFrom < 0 || req.Attempt < okFrom {
			return nil, errInfra
		}
		return agent.Result{RolloutID: req.RolloutID, Attempt: req.Attempt, Episode: ep, Verdict: json.RawMessage(`{"reward":1}`)}, nil
	})
}

// An attempt the infrastructure ends (agent code infra) is no result: the
// collector retires it and sends the rollout again, to the next agent, as
// its next attempt; once InfraAttempts attempts ended so, the rollout's
// line says infra_failed, which the summary and the metrics count apart
// from the rollout's own failures.
func TestInfraFaultIsNeverAResult(t *testing.T) {
	for _, c := range []struct {
		name    string
		okFrom  int
		outcome string
		attempt int
	}{
		{"a later attempt succeeds", 2, OutcomeGraded, 2},
		{"every attempt fails", -1, OutcomeInfraFailed, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			const run = "infra"
			env := jstest.Start(t)
			nc, js := env.Connect(t)
			var (
				mu    sync.Mutex
				asked []string
			)
			serveInfraAgent(t, env, run, "a1", c.okFrom, &asked, &mu)
			serveInfraAgent(t, env, run, "a2", c.okFrom, &asked, &mu)
			ctl := &retireRecorder{}
			out := filepath.Join(t.TempDir(), "results.jsonl")
			set := metrics.New()
			col, err := New(Config{Run: run, Tasks: []Task{{RolloutID: "r1", Task: json.RawMessage(`{}`)}}, Output: out, Agents: []string{"a1", "a2"},
				Conn: nc, JS: js, Bus: env.Bus, Controller: ctl, Metrics: set, Logger: zerolog.New(zerolog.NewTestWriter(t))})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			sum, err := col.Run(ctx)
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			var res Result
			if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &res) != nil || res.Outcome != c.outcome || res.Attempt != c.attempt {
				t.Fatalf("results %q, want one line, %s, of attempt %d", lines, c.outcome, c.attempt)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(asked) != 3 || asked[0][:2] == asked[1][:2] {
				t.Errorf("asked %v, want three attempts, the second on another agent than the first", asked)
			}
			ctl.mu.Lock()
			defer ctl.mu.Unlock()
			if want := []string{"r1", "r1-a1"}; !slices.Equal(ctl.retired, want) {
				t.Errorf("retired %v, want %v", ctl.retired, want)
			}
			infraFailed := 0
			if c.outcome == OutcomeInfraFailed {
				infraFailed = 1
			}
			if sum.InfraFailed != infraFailed || sum.InfraRetried != 2 {
				t.Errorf("summary: %d infra_failed, %d retried; want %d and 2", sum.InfraFailed, sum.InfraRetried, infraFailed)
			}
			var sb strings.Builder
			WriteSummary(&sb, sum)
			if !strings.Contains(sb.String(), "infra_failed)") {
				t.Errorf("the summary does not count infra_failed:\n%s", sb.String())
			}
			fams, err := set.Gather()
			if err != nil {
				t.Fatal(err)
			}
			if got := fams.Sum("stillpoint_rollout_results_total", map[string]string{"result": metrics.ResultInfraFailed}); got != float64(infraFailed) {
				t.Errorf("metric results{result=infra_failed} = %v, want %d", got, infraFailed)
			}
		})
	}
}
