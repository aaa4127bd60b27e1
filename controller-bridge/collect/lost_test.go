package collect

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	agent "github.com/stillpoint/stillpoint/participants/agent/agentapi"
)

// retireRecorder is a bridge that only retires, recording what.
type retireRecorder struct {
	noController
	mu      sync.Mutex
	retired []string
}

func (r *retireRecorder) Retire(_ context.Context, eps []string) (*bridgeapi.OpResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retired = append(r.retired, eps...)
	return &bridgeapi.OpResult{Status: bridgeapi.StatusCompleted}, nil
}

var errLost = errors.New("collect test: the attempt's sandbox is lost")

// serveRun serves agent name's run endpoint of run on nc with handle: an
// error that is sentinel answers status and code, any other
// rollout_failed.
func serveRun(t *testing.T, nc *nats.Conn, run, name string, sentinel error, status int, code string, handle func(agent.Request) (any, error)) {
	t.Helper()
	s, err := jetstream.NewService(nc, micro.Config{Name: "test-agent", Version: "1.0.0"},
		events.ServiceSubject(run, events.Member("agent."+name)),
		func(err error) (int, string) {
			if errors.Is(err, sentinel) {
				return status, code
			}
			return 500, agent.CodeRolloutFailed
		})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	err = s.HandleAsync(t.Context(), agent.EndpointRun, func(_ context.Context, body []byte) (any, error) {
		var req agent.Request
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, err
		}
		return handle(req)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// An attempt the agent answers sandbox_lost (its sandbox's daemon died, or
// the owner restarted without its session) is no result: the collector
// retires it and sends the rollout again one attempt later, whose result
// is the one written.
func TestSandboxLostStartsOver(t *testing.T) {
	const run = "lost"
	env := jstest.Start(t)
	nc, js := env.Connect(t)
	serveRun(t, nc, run, "a1", errLost, 409, agent.CodeSandboxLost, func(req agent.Request) (any, error) {
		if req.Attempt == 0 {
			return nil, errLost
		}
		return agent.Result{RolloutID: req.RolloutID, Attempt: req.Attempt, Episode: events.Episode{Rollout: req.RolloutID, Attempt: req.Attempt}.String(),
			Verdict: json.RawMessage(`{"reward":1}`)}, nil
	})
	ctl := &retireRecorder{}
	out := filepath.Join(t.TempDir(), "results.jsonl")
	c, err := New(Config{Run: run, Tasks: []Task{{RolloutID: "r1", Task: json.RawMessage(`{}`)}}, Output: out, Agents: []string{"a1"},
		Conn: nc, JS: js, Bus: env.Bus, Controller: ctl, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := c.Run(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	var res Result
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &res) != nil || !res.OK || res.Attempt != 1 {
		t.Fatalf("results %q, want one, ok, of attempt 1", lines)
	}
	ctl.mu.Lock()
	defer ctl.mu.Unlock()
	if lost := (events.Episode{Rollout: "r1"}).String(); len(ctl.retired) != 1 || ctl.retired[0] != lost {
		t.Fatalf("retired %v, want the lost attempt %s", ctl.retired, lost)
	}
}

// A rollout whose attempts keep starting over (its session still held
// while the owner starts an earlier attempt's sandbox) is sent again with
// growing waits, not at once: sent at once, one went through a hundred
// attempts in a minute, each retired on the bus.
func TestStartOversWait(t *testing.T) {
	const run = "held"
	env := jstest.Start(t)
	nc, js := env.Connect(t)
	var (
		mu    sync.Mutex
		times []time.Time
	)
	serveRun(t, nc, run, "a1", errLost, 409, "session_exists", func(req agent.Request) (any, error) {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		if req.Attempt < 3 {
			return nil, errLost
		}
		return agent.Result{RolloutID: req.RolloutID, Attempt: req.Attempt, Episode: events.Episode{Rollout: req.RolloutID, Attempt: req.Attempt}.String(),
			Verdict: json.RawMessage(`{"reward":1}`)}, nil
	})
	c, err := New(Config{Run: run, Tasks: []Task{{RolloutID: "r1", Task: json.RawMessage(`{}`)}}, Output: filepath.Join(t.TempDir(), "results.jsonl"),
		Agents: []string{"a1"}, Conn: nc, JS: js, Bus: env.Bus, Controller: &retireRecorder{}, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := c.Run(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(times) != 4 {
		t.Fatalf("%d sends, want 4 (attempts 0 to 3)", len(times))
	}
	// The second start-over waits retryAfter, the third twice that.
	for i, want := range []time.Duration{retryAfter, 2 * retryAfter} {
		if got := times[i+2].Sub(times[i+1]); got < want {
			t.Errorf("start-over %d sent %s after the one before, want at least %s", i+2, got, want)
		}
	}
	if startOverWait(1) != 0 || startOverWait(100) != maxStartOverWait {
		t.Errorf("startOverWait: first %s (want 0), hundredth %s (want %s)", startOverWait(1), startOverWait(100), maxStartOverWait)
	}
}

// A failed rejoin retired the next attempt of each lost rollout on the
// members that came back: the collector retires the lost attempt and
// sends the rollout again above both, never as the attempt the bridge
// retired (its agent would refuse it, stale).
func TestRejoinFailedStartsOverAboveTheRetired(t *testing.T) {
	env := jstest.Start(t)
	nc, js := env.Connect(t)
	ctl := &retireRecorder{}
	c, err := New(Config{Run: "rejoin", Tasks: []Task{{RolloutID: "r1", Task: json.RawMessage(`{}`)}, {RolloutID: "r2", Task: json.RawMessage(`{}`)}},
		Output: filepath.Join(t.TempDir(), "results.jsonl"), Agents: []string{"a1", "a2"},
		Conn: nc, JS: js, Bus: env.Bus, Controller: ctl, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	// r1 ran on a2, which came back as another process; r2 on a1, which
	// still runs.
	live := map[string]string{"agent.a1": "i1", "agent.a2": "i2-new"}
	c.sentTo["r1"] = dispatchEntry{RolloutID: "r1", Attempt: 0, Agent: "a2", Instance: "i2-old"}
	c.sentTo["r2"] = dispatchEntry{RolloutID: "r2", Attempt: 0, Agent: "a1", Instance: "i1"}
	c.attempt["r1"], c.attempt["r2"] = 0, 0
	if err := c.rejoinFailed(t.Context(), live, []string{"r1-a1"}); err != nil {
		t.Fatal(err)
	}
	if c.attempt["r1"] != 2 || c.attempt["r2"] != 0 {
		t.Errorf("attempts r1 %d, r2 %d; want r1 sent again as 2 (above the retired 1), r2 asked again as 0", c.attempt["r1"], c.attempt["r2"])
	}
	if len(c.queue) != 2 {
		t.Errorf("queue %v, want both rollouts", c.queue)
	}
	ctl.mu.Lock()
	defer ctl.mu.Unlock()
	if len(ctl.retired) != 1 || ctl.retired[0] != "r1" {
		t.Errorf("retired %v, want the lost attempt r1", ctl.retired)
	}
}

// statusRetirer is a bridge whose status lists fixed members and that
// records what it retires.
type statusRetirer struct {
	retireRecorder
	members []events.MemberInfo
}

func (s *statusRetirer) Status(context.Context) (*bridgeapi.Status, error) {
	return &bridgeapi.Status{Members: s.members}, nil
}

var errAgain = errors.New("collect test: stopping, ask again")

// An attempt asked again names the agent process it went to
// (Request.SentTo). When another process of the agent answers that the
// attempt is lost with the one it went to (attempt_lost), the collector
// recovers before the fleet watch has seen the new process: it retires
// the attempt and sends the rollout again, one attempt later, as a first
// send. The successor never runs the lost attempt from its task.
func TestAttemptLostWithItsProcessStartsOver(t *testing.T) {
	const run = "sentto"
	env := jstest.Start(t)
	nc, js := env.Connect(t)
	b, _ := json.Marshal(events.MemberInfo{Run: run, Member: "agent.a1", Instance: "i1"})
	if _, err := env.Bus.Members.Put(t.Context(), events.MemberKey(run, "agent.a1"), b); err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen []agent.Request
	)
	s, err := jetstream.NewService(nc, micro.Config{Name: "test-agent", Version: "1.0.0"},
		events.ServiceSubject(run, "agent.a1"),
		func(err error) (int, string) {
			switch {
			case errors.Is(err, errAgain):
				return 503, agent.CodeStopping
			case errors.Is(err, errLost):
				return 409, agent.CodeAttemptLost
			}
			return 500, agent.CodeRolloutFailed
		})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	err = s.HandleAsync(t.Context(), agent.EndpointRun, func(_ context.Context, body []byte) (any, error) {
		var req agent.Request
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, err
		}
		mu.Lock()
		seen = append(seen, req)
		n := len(seen)
		mu.Unlock()
		switch n {
		case 1:
			return nil, errAgain // the first process stops
		case 2:
			return nil, errLost // its successor holds nothing of attempt 0
		}
		return agent.Result{RolloutID: req.RolloutID, Attempt: req.Attempt, Episode: events.Episode{Rollout: req.RolloutID, Attempt: req.Attempt}.String(),
			Verdict: json.RawMessage(`{"reward":1}`)}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	ctl := &statusRetirer{members: []events.MemberInfo{{Run: run, Member: "agent.a1", Instance: "i2"}}}
	out := filepath.Join(t.TempDir(), "results.jsonl")
	c, err := New(Config{Run: run, Tasks: []Task{{RolloutID: "r1", Task: json.RawMessage(`{}`)}}, Output: out, Agents: []string{"a1"},
		Conn: nc, JS: js, Bus: env.Bus, Controller: ctl, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	if _, err := c.Run(ctx); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []agent.Request{{RolloutID: "r1", Attempt: 0}, {RolloutID: "r1", Attempt: 0, SentTo: "i1"}, {RolloutID: "r1", Attempt: 1}}
	if len(seen) != len(want) {
		t.Fatalf("the agent was asked %d times (%+v), want %d", len(seen), seen, len(want))
	}
	for i, w := range want {
		if g := seen[i]; g.RolloutID != w.RolloutID || g.Attempt != w.Attempt || g.SentTo != w.SentTo {
			t.Errorf("request %d: rollout %s attempt %d sent_to %q, want %s %d %q", i+1, g.RolloutID, g.Attempt, g.SentTo, w.RolloutID, w.Attempt, w.SentTo)
		}
	}
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	var res Result
	if len(lines) != 1 || json.Unmarshal([]byte(lines[0]), &res) != nil || !res.OK || res.Attempt != 1 {
		t.Fatalf("results %q, want one, ok, of attempt 1", lines)
	}
	ctl.mu.Lock()
	defer ctl.mu.Unlock()
	if len(ctl.retired) != 1 || ctl.retired[0] != "r1" {
		t.Fatalf("retired %v, want the lost attempt r1", ctl.retired)
	}
}
