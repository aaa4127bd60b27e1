package collect

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	agent "github.com/stillpoint/stillpoint/participants/agent/agentapi"
)

// asked is one rollout request an agent of the test got.
type asked struct {
	agent   string
	rollout string
	attempt int
	sentTo  string
}

// agents serves the run endpoint of each named agent: every request is
// recorded, then answered by answer (nil error: an empty result, graded
// with reward 1).
type agents struct {
	mu   sync.Mutex
	got  []asked
	seen chan asked
}

func serveAgents(t *testing.T, env *jstest.Env, run string, names []string, answer func(ctx context.Context, a asked) error) *agents {
	t.Helper()
	ag := &agents{seen: make(chan asked, 64)}
	for _, name := range names {
		nc, _ := env.Connect(t)
		s, err := jetstream.NewService(nc, micro.Config{Name: "test-agent", Version: "1.0.0"},
			events.ServiceSubject(run, events.Member("agent."+name)), func(error) (int, string) { return 500, "rollout_failed" })
		if err != nil {
			t.Fatal(err)
		}
		err = s.HandleAsync(t.Context(), "run", func(ctx context.Context, body []byte) (any, error) {
			var req agent.Request
			if err := json.Unmarshal(body, &req); err != nil {
				return nil, err
			}
			a := asked{agent: name, rollout: req.RolloutID, attempt: req.Attempt, sentTo: req.SentTo}
			ag.mu.Lock()
			ag.got = append(ag.got, a)
			ag.mu.Unlock()
			ag.seen <- a
			if err := answer(ctx, a); err != nil {
				return nil, err
			}
			return agent.Result{RolloutID: req.RolloutID, Attempt: req.Attempt, Verdict: json.RawMessage(`{"reward":1}`)}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Stop() })
	}
	return ag
}

// requests returns the requests for rollout.
func (ag *agents) requests(rollout string) []asked {
	ag.mu.Lock()
	defer ag.mu.Unlock()
	var out []asked
	for _, a := range ag.got {
		if a.rollout == rollout {
			out = append(out, a)
		}
	}
	return out
}

// publish publishes d into the stream as the bridge does.
func publish(t *testing.T, env *jstest.Env, d events.Data) {
	t.Helper()
	msg, err := events.Marshal("bridge.main", d)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jetstream.PublishDedup(t.Context(), env.JS, msg); err != nil {
		t.Fatal(err)
	}
}

// branchOf returns branch k of r1's attempt 0, with its BranchCompleted's
// parts.
func branchOp(run, op string, agents map[string]events.Member, ks ...int) (events.Branch, events.BranchCompleted) {
	var specs []events.BranchSpec
	for _, k := range ks {
		specs = append(specs, events.NewBranchSpec(events.Episode{Rollout: "r1"}, k, uint64(100+k)))
	}
	ph := events.Branch{PhaseHeader: events.PhaseHeader{Run: run, CheckpointID: op, Seq: 7, Deadline: time.Now().Add(time.Minute)},
		Source: "c1", Branches: specs}
	out := events.BranchCompleted{OutcomeHeader: events.OutcomeHeader{Run: run, CheckpointID: op}, Source: "c1", Branches: specs, Agents: agents}
	return ph, out
}

// resultLines reads the results file: its lines by rollout, each counted.
func resultLines(t *testing.T, path string) (map[string]Result, map[string]int) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	by, n := map[string]Result{}, map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r Result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		by[r.RolloutID] = r
		n[r.RolloutID]++
	}
	return by, n
}

func runCollector(t *testing.T, ctx context.Context, c *Collector) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := c.Run(ctx)
		done <- err
	}()
	return done
}

// The collector adopts the branches a BranchCompleted on the stream
// names: each is sent at its attempt, first as a restored attempt (no
// process named), to the agent that installed it (not the one a hash
// would pick), with its parent's task; its results line names its parent
// and number. A collection whose parent's result is written while the
// branch operation is open (its phase on the stream, no outcome yet) does
// not end until the outcome came and its branches were collected.
func TestBranchesAdopted(t *testing.T) {
	const run = "branches"
	env := jstest.Start(t)
	parentDone := make(chan struct{})
	ag := serveAgents(t, env, run, []string{"a1", "a2"}, func(ctx context.Context, a asked) error {
		if a.rollout == "r1" {
			select {
			case <-parentDone:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	nc, js := env.Connect(t)
	out := filepath.Join(t.TempDir(), "results.jsonl")
	c, err := New(Config{Run: run, Tasks: []Task{{RolloutID: "r1", Task: json.RawMessage(`{"n":1}`)}}, Output: out,
		Agents: []string{"a1", "a2"}, Conn: nc, JS: js, Bus: env.Bus, Controller: noController{}, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := runCollector(t, ctx, c)
	select {
	case <-ag.seen:
	case <-time.After(20 * time.Second):
		t.Fatal("r1 was never sent")
	}
	// The two branches go to the agents the hash would not pick.
	names := map[string]events.Member{"r1.b1": "agent.a1", "r1.b2": "agent.a1"}
	for _, r := range []string{"r1.b1", "r1.b2"} {
		if c.agentOf(r) == "a1" {
			names[r] = "agent.a2"
		}
	}
	phase, completed := branchOp(run, "b-1", names, 1, 2)
	publish(t, env, phase)
	poll.Wait(t, 10*time.Second, "the branch operation open", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.branchOpen["b-1"]
	})
	close(parentDone)
	poll.Wait(t, 10*time.Second, "r1's result", func() bool { _, ok := c.Results()["r1"]; return ok })
	select {
	case err := <-done:
		t.Fatalf("the collection ended with a branch operation open: %v", err)
	case <-time.After(3 * settleEvery):
	}
	publish(t, env, completed)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the collection did not end after its branches")
	}
	by, n := resultLines(t, out)
	for _, r := range []string{"r1", "r1.b1", "r1.b2"} {
		if n[r] != 1 {
			t.Errorf("%s has %d results lines, want 1", r, n[r])
		}
	}
	for k, r := range []string{"r1.b1", "r1.b2"} {
		if got := by[r]; got.BranchOf != "r1" || got.Branch != k+1 || got.Attempt != 1 || !got.OK {
			t.Errorf("%s's line: %+v, want branch %d of r1 at attempt 1, graded", r, got, k+1)
		}
		reqs := ag.requests(r)
		if len(reqs) != 1 || reqs[0].agent != names[r].Name() || reqs[0].attempt != 1 || reqs[0].sentTo != "" {
			t.Errorf("%s was asked %+v, want once of %s at attempt 1 as a first send", r, reqs, names[r])
		}
	}
	if by["r1"].BranchOf != "" {
		t.Errorf("the parent's line names a parent: %+v", by["r1"])
	}
	s := c.Summary()
	if s.Rollouts != 3 || len(s.Branches) != 2 {
		t.Fatalf("summary: %d rollouts, branches %+v; want 3 and 2", s.Rollouts, s.Branches)
	}
	for _, b := range s.Branches {
		if b.BranchOf != "r1" || b.Outcome != OutcomeGraded || b.Reward == nil || *b.Reward != 1 || b.Source != "c1" || b.Seed != uint64(100+b.Branch) {
			t.Errorf("summary's branch %+v", b)
		}
	}
}

// Each branch's result is written exactly once across a collector
// restart: one written before is not asked again, one in flight is asked
// again of the process it went to, and the parent's line is untouched.
func TestBranchResultsOnceAcrossARestart(t *testing.T) {
	const run = "branchrestart"
	env := jstest.Start(t)
	// The agent's heartbeat and service, as the process i1 it stays.
	info, _ := json.Marshal(events.MemberInfo{Run: run, Member: "agent.a1", Instance: "i1", Served: true})
	if _, err := env.Bus.Members.Put(t.Context(), events.MemberKey(run, "agent.a1"), info); err != nil {
		t.Fatal(err)
	}
	serveMember(t, env, run, "agent.a1", "i1")
	ctl := statusController{members: []events.MemberInfo{{Run: run, Member: "agent.a1", Instance: "i1", Served: true}}}
	var hold sync.Map // rollout -> chan struct{}: held until closed
	for _, r := range []string{"r2", "r1.b2"} {
		hold.Store(r, make(chan struct{}))
	}
	ag := serveAgents(t, env, run, []string{"a1"}, func(ctx context.Context, a asked) error {
		if ch, ok := hold.Load(a.rollout); ok {
			select {
			case <-ch.(chan struct{}):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	out := filepath.Join(t.TempDir(), "results.jsonl")
	collector := func() *Collector {
		nc, js := env.Connect(t)
		c, err := New(Config{Run: run, Tasks: []Task{{RolloutID: "r1", Task: json.RawMessage(`{}`)}, {RolloutID: "r2", Task: json.RawMessage(`{}`)}},
			Output: out, Agents: []string{"a1"}, Conn: nc, JS: js, Bus: env.Bus, Controller: ctl, RecoverGrace: 5 * time.Second,
			Logger: zerolog.New(zerolog.NewTestWriter(t))})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ctx, cancel := context.WithCancel(t.Context())
	first := collector()
	done := runCollector(t, ctx, first)
	poll.Wait(t, 20*time.Second, "r1's result", func() bool { _, ok := first.Results()["r1"]; return ok })
	_, completed := branchOp(run, "b-1", map[string]events.Member{"r1.b1": "agent.a1", "r1.b2": "agent.a1"}, 1, 2)
	publish(t, env, completed)
	poll.Wait(t, 20*time.Second, "r1.b1's result and r1.b2 sent", func() bool {
		_, ok := first.Results()["r1.b1"]
		return ok && len(ag.requests("r1.b2")) == 1
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the first collector: %v", err)
	}

	// Started again: the branches are found again on the stream.
	for _, r := range []string{"r2", "r1.b2"} {
		ch, _ := hold.Load(r)
		close(ch.(chan struct{}))
	}
	again := collector()
	select {
	case err := <-runCollector(t, t.Context(), again):
		if err != nil {
			t.Fatalf("the collector started again: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("the collector started again did not end")
	}
	by, n := resultLines(t, out)
	for _, r := range []string{"r1", "r2", "r1.b1", "r1.b2"} {
		if n[r] != 1 {
			t.Errorf("%s has %d results lines, want 1", r, n[r])
		}
	}
	if got := by["r1.b2"]; got.BranchOf != "r1" || got.Branch != 2 || got.Attempt != 1 {
		t.Errorf("r1.b2's line %+v", got)
	}
	if reqs := ag.requests("r1.b1"); len(reqs) != 1 {
		t.Errorf("r1.b1, written before the restart, was asked %d times: %+v", len(reqs), reqs)
	}
	if reqs := ag.requests("r1.b2"); len(reqs) != 2 || reqs[1].sentTo != "i1" || reqs[1].attempt != 1 {
		t.Errorf("r1.b2 was asked %+v; want again after the restart, of the process it went to", reqs)
	}
	if s := again.Summary(); len(s.Branches) != 2 || s.Rollouts != 4 {
		t.Errorf("summary after the restart: %d rollouts, branches %+v", s.Rollouts, s.Branches)
	}
}

// branchingController is a bridge that makes every branch asked of it,
// at the attempt asked, installed on agent a1; or refuses with err.
type branchingController struct {
	noController
	err  error
	mu   sync.Mutex
	asks []bridgeapi.BranchRequest
}

func (b *branchingController) Branch(_ context.Context, req bridgeapi.BranchRequest) (*bridgeapi.BranchResult, error) {
	b.mu.Lock()
	b.asks = append(b.asks, req)
	b.mu.Unlock()
	if b.err != nil {
		return nil, b.err
	}
	s := events.NewBranchSpec(events.Episode{Rollout: req.Rollouts[0]}, req.FirstK(), bridgeapi.BranchSeed(req.Seed, req.Rollouts[0], req.FirstK())).Again(req.Attempt)
	return &bridgeapi.BranchResult{Status: bridgeapi.StatusCompleted, Source: req.Source, Branches: []events.BranchSpec{s},
		Agents: map[string]events.Member{s.Episode.Rollout: "agent.a1"}}, nil
}

// A branch whose next send would start it from its task's input (its
// first attempt retired: lost with a fleet a restore replaced before any
// checkpoint held it) is never sent so: started over it would not
// continue from its branch point. It is made again from its source, at
// its next attempt, and continues there; only when the bridge cannot make
// it again is it written infra_failed, once, naming why.
func TestBranchLostIsMadeAgainFromItsSource(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{{"made again", nil}, {"cannot be", fmt.Errorf("%w: checkpoint c1 is released", bridgeapi.ErrReleased)}} {
		t.Run(tc.name, func(t *testing.T) {
			run := "branchlost" + map[bool]string{true: "a", false: "b"}[tc.err == nil]
			env := jstest.Start(t)
			ag := serveAgents(t, env, run, []string{"a1"}, func(context.Context, asked) error { return nil })
			nc, js := env.Connect(t)
			out := filepath.Join(t.TempDir(), "results.jsonl")
			ctl := &branchingController{err: tc.err}
			c, err := New(Config{Run: run, Tasks: []Task{{RolloutID: "r1", Task: json.RawMessage(`{}`)}}, Output: out,
				Agents: []string{"a1"}, Conn: nc, JS: js, Bus: env.Bus, Controller: ctl, Logger: zerolog.New(zerolog.NewTestWriter(t))})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.openFiles(); err != nil {
				t.Fatal(err)
			}
			defer c.out.Close()
			defer c.dlog.Close()
			_, completed := branchOp(run, "b-1", map[string]events.Member{"r1.b1": "agent.a1"}, 1)
			c.mu.Lock()
			c.adopt(completed, nil)
			// What continueRestored does to an unfinished rollout the restore
			// did not hold: its attempt retired, the next one queued.
			c.attempt["r1.b1"]++
			delete(c.restoredQ, "r1.b1")
			c.queue = []string{"r1.b1"}
			c.mu.Unlock()
			c.dispatch(t.Context())
			c.work.Wait() // the bridge asked to make it again
			if len(ctl.asks) != 1 || ctl.asks[0].Source != "c1" || ctl.asks[0].Rollouts[0] != "r1" || ctl.asks[0].First != 1 || ctl.asks[0].Attempt != 2 {
				t.Fatalf("asked the bridge %+v; want branch 1 of r1 from c1 again, at attempt 2", ctl.asks)
			}
			if tc.err != nil {
				by, n := resultLines(t, out)
				if got := by["r1.b1"]; n["r1.b1"] != 1 || got.Outcome != OutcomeInfraFailed || !strings.Contains(got.Error, "released") {
					t.Fatalf("r1.b1's lines: %d, %+v; want one, infra_failed, naming why", n["r1.b1"], got)
				}
				if reqs := ag.requests("r1.b1"); len(reqs) != 0 {
					t.Fatalf("a branch that could not be made again was sent: %+v", reqs)
				}
				return
			}
			c.dispatch(t.Context())
			select {
			case a := <-ag.seen:
				if a.rollout != "r1.b1" || a.attempt != 2 {
					t.Fatalf("sent %+v; want r1.b1 at attempt 2", a)
				}
			case <-time.After(30 * time.Second):
				t.Fatal("the branch made again was never sent")
			}
			c.work.Wait()
		})
	}
}
