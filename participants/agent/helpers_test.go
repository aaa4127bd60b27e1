package agent

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/participants/owner"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, jstest.LeakOptions()...)
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
// its calls, and an agent of the scripted adapter.
type world struct {
	env    *jstest.Env
	prov   *provider.Dir
	owner  *owner.Owner
	agent  *Agent
	grades atomic.Int32
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
	if w.prov, err = provider.NewDir(t.TempDir()); err != nil {
		t.Fatal(err)
	}
	var prov provider.Provider = w.prov
	if restartOnly {
		prov = provider.NewNoSnapshot(w.prov)
	}
	t.Cleanup(func() {
		for _, id := range w.prov.Sandboxes() {
			if err := w.prov.Stop(context.Background(), id); err != nil {
				t.Errorf("stop %s: %v", id, err)
			}
		}
	})
	w.owner, err = owner.New(owner.Config{Run: testRun, Name: "o1", JS: w.env.JS, Bus: w.env.Bus, Provider: prov,
		Checkpointing: true, LendsSandboxes: true, StateDir: t.TempDir(), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, "owner", w.owner.Run)
	grade := func(context.Context, provider.Provider, *owner.Session) (json.RawMessage, error) {
		w.grades.Add(1)
		return json.RawMessage(`{"reward":1}`), nil
	}
	nc, _ := w.env.Connect(t)
	runUntilCleanup(t, "owner service", func(ctx context.Context) error { return w.owner.Serve(ctx, nc, nil, grade) })
	membertest.WaitRegistered(t, w.env, testRun, "owner.o1", nil)
	w.agent, err = New(Config{Run: testRun, Name: "a1", JS: w.env.JS, Bus: w.env.Bus, Owner: "o1", SandboxService: sandboxes,
		Adapter: &Scripted{Binary: "/nonexistent/harness", ModelURL: "http://127.0.0.1:1"}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, "agent", w.agent.Run)
	membertest.WaitRegistered(t, w.env, testRun, "agent.a1", nil)
	return w
}
