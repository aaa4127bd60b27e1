package agent

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/participants/owner"
	"github.com/stillpoint/stillpoint/participants/owner/provider/dir"
	"github.com/stillpoint/stillpoint/participants/owner/provider/nosnapshot"
)

func TestMain(m *testing.M) {
	leak.VerifyTestMain(m, jstest.LeakOptions()...)
}

const testRun = "run1"

func testLogger(t *testing.T) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
}

// runUntilCleanup runs fn until the test ends and checks its error.
func runUntilCleanup(t *testing.T, name string, fn func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v", name, err)
		}
	})
}

// world is an owner on the dir provider, serving, with a grade that counts
// its calls, and an agent of the test adapter.
type world struct {
	env    *jstest.Env
	prov   *dir.Provider
	owner  *owner.Owner
	agent  *Agent
	grades atomic.Int32
	// gate, when set, holds every grade until it is closed.
	gate atomic.Pointer[chan struct{}]
}

func newWorld(t *testing.T) *world { return newWorldWith(t, false, nil) }

// newWorldOn builds the world; with restartOnly the owner's provider cannot
// snapshot, so the owner is restart_only.
func newWorldOn(t *testing.T, restartOnly bool) *world { return newWorldWith(t, restartOnly, nil) }

// newWorldWith builds the world with the agent's Config.SandboxService
// (nil: the daemons' clients).
func newWorldWith(t *testing.T, restartOnly bool, sandboxes func(string) (Sandbox, error)) *world {
	t.Helper()
	w := &world{env: jstest.Start(t)}
	var err error
	if w.prov, err = dir.New(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	var prov owner.Provider = w.prov
	if restartOnly {
		prov = nosnapshot.New(w.prov)
	}
	t.Cleanup(func() {
		for _, id := range w.prov.Sandboxes() {
			if err := w.prov.Stop(context.Background(), id); err != nil {
				t.Errorf("stop %s: %v", id, err)
			}
		}
	})
	grade := func(ctx context.Context, _ owner.Execer, _ *owner.Session) (json.RawMessage, error) {
		w.grades.Add(1)
		if g := w.gate.Load(); g != nil {
			select {
			case <-*g:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return json.RawMessage(`{"reward":1}`), nil
	}
	w.owner, err = owner.New(owner.Config{Run: testRun, Name: "o1", JS: w.env.JS, Bus: w.env.Bus, Provider: prov,
		Checkpointing: true, LendsSandboxes: true, StateDir: t.TempDir(), TaskKind: owner.TaskFuncs{GradeFn: grade}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, "owner", w.owner.Run)
	nc, _ := w.env.Connect(t)
	runUntilCleanup(t, "owner service", func(ctx context.Context) error { return w.owner.Serve(ctx, nc) })
	membertest.WaitRegistered(t, w.env, testRun, "owner.o1", nil)
	w.agent, err = New(Config{Run: testRun, Name: "a1", JS: w.env.JS, Bus: w.env.Bus, Owner: "o1", SandboxService: sandboxes,
		Adapter: testAdapter{}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, "agent", w.agent.Run)
	membertest.WaitRegistered(t, w.env, testRun, "agent.a1", nil)
	return w
}

// testAdapter is the adapter of the tests: a task names its script
// ({"task": <name>}, refused without one), a rollout's state is its
// session folder, and a launch runs a harness that is not in the sandbox.
// The dir sandboxes of the tests run no sandbox daemon, so no launch
// starts: a run that gets to its harness stage stays there.
type testAdapter struct{}

func (testAdapter) Name() string              { return "test" }
func (testAdapter) PausesAtCheckpoints() bool { return true }

func (testAdapter) ValidateTask(task json.RawMessage) error {
	var t struct{ Task string }
	if err := json.Unmarshal(task, &t); err != nil {
		return err
	}
	if t.Task == "" {
		return errors.New("test task: no task name")
	}
	return nil
}

func (testAdapter) NewState(r agentapi.Request) (json.RawMessage, error) {
	return json.Marshal(map[string]string{"data_dir": "/var/lib/test-harness/" + r.RolloutID})
}

func (testAdapter) Command(lc LaunchContext) (Command, error) {
	return Command{Argv: []string{lc.Session.InSandbox("/nonexistent/harness")}, Dir: lc.Session.InSandbox(lc.Session.Workdir)}, nil
}

func (testAdapter) ResumeDecision(context.Context, LaunchContext) (Decision, error) {
	return Decision{Continue: true, Reason: "test"}, nil
}

func (testAdapter) Answer(_ LaunchContext, out ExecResult) (json.RawMessage, error) {
	return json.Marshal(out.Output)
}
