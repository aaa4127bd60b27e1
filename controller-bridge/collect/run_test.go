package collect

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// errStopping is what the test's agent answers a rollout it will not run:
// the answer of an agent that is shutting down (503 stopping).
var errStopping = errors.New("collect: the agent is stopping")

// serveAgent serves agent name's run endpoint on the bus until the test
// ends: answer gets each request's rollout id and the service's context
// (which ends when the service stops).
func serveAgent(t *testing.T, env *jstest.Env, run, name string, answer func(ctx context.Context, rollout string) error) {
	t.Helper()
	nc, _ := env.Connect(t)
	s, err := jetstream.NewService(nc, micro.Config{Name: "test-agent", Version: "1.0.0"},
		events.ServiceSubject(run, events.Member("agent."+name)),
		func(err error) (int, string) {
			if errors.Is(err, errStopping) {
				return 503, "stopping"
			}
			return 500, "rollout_failed"
		})
	if err != nil {
		t.Fatal(err)
	}
	err = s.HandleAsync(t.Context(), "run", func(ctx context.Context, body []byte) (any, error) {
		var req struct {
			RolloutID string `json:"rollout_id"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, err
		}
		return struct{}{}, answer(ctx, req.RolloutID)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop the test agent: %v", err)
		}
	})
}

// noController is the controller of a collection that takes no
// checkpoint: every call is refused (an answer, not a lost one, which the
// collector would ask again for minutes).
type noController struct{}

var errNoController = fmt.Errorf("collect: this test takes no checkpoint: %w", bridgeapi.ErrNotFound)

func (noController) Checkpoint(context.Context, bridgeapi.CheckpointRequest) (*bridgeapi.CheckpointResult, error) {
	return nil, errNoController
}

func (noController) Restore(context.Context, bridgeapi.RestoreRequest) (*bridgeapi.RestoreResult, error) {
	return nil, errNoController
}

func (noController) Retire(context.Context, []string) (*bridgeapi.OpResult, error) {
	return nil, errNoController
}

func (noController) Release(context.Context, bridgeapi.ReleaseRequest) (*bridgeapi.OpResult, error) {
	return nil, errNoController
}

func (noController) Status(context.Context) (*bridgeapi.Status, error) { return nil, errNoController }

func (noController) Branch(context.Context, bridgeapi.BranchRequest) (*bridgeapi.BranchResult, error) {
	return nil, errNoController
}

// collectorGoroutines returns the stacks of the goroutines that run the
// collector's code, at this instant.
func collectorGoroutines() []string {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "controller-bridge/collect.(*Collector)") {
			out = append(out, g)
		}
	}
	return out
}

// TestRunJoinsItsGoroutines: when Run returns, none of the goroutines it
// started is left: not the request still in flight (r1, which the agent
// never answers), not the retry of an unfinished rollout (r2, which the
// agent answers "stopping" and which is asked again a second later), not
// the fleet watcher. So no late answer can reach the output after Run
// closed it.
func TestRunJoinsItsGoroutines(t *testing.T) {
	const run = "joins"
	env := jstest.Start(t)
	asked := make(chan string, 16)
	serveAgent(t, env, run, "a1", func(ctx context.Context, rollout string) error {
		asked <- rollout
		if rollout == "r1" {
			<-ctx.Done() // in flight until the service stops
			return ctx.Err()
		}
		return errStopping
	})
	nc, js := env.Connect(t)
	c, err := New(Config{Run: run, Tasks: []Task{{RolloutID: "r1", Task: json.RawMessage(`{}`)}, {RolloutID: "r2", Task: json.RawMessage(`{}`)}},
		Output: filepath.Join(t.TempDir(), "results.jsonl"), Agents: []string{"a1"}, Conn: nc, JS: js, Bus: env.Bus,
		Controller: noController{}, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Run(ctx)
		done <- err
	}()

	counts := map[string]int{}
	timeout := time.After(20 * time.Second)
	for counts["r1"] < 1 || counts["r2"] < 2 {
		select {
		case id := <-asked:
			counts[id]++
		case err := <-done:
			t.Fatalf("Run returned early: %v", err)
		case <-timeout:
			t.Fatalf("the agent was asked %v, want r1 once and r2 twice (asked again after its answer)", counts)
		}
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want context.Canceled", err)
	}
	if gs := collectorGoroutines(); len(gs) > 0 {
		t.Fatalf("%d goroutines of the collector outlive Run:\n\n%s", len(gs), strings.Join(gs, "\n\n"))
	}
}

// TestRunStopsWhenTheFleetWatchCloses: nats.go closes a heartbeat watch's
// channel when its subscription closes (here, its connection). Run then
// stops with an error instead of reading the closed channel for ever, or
// running on without seeing the fleet restart.
func TestRunStopsWhenTheFleetWatchCloses(t *testing.T) {
	const run = "watchcloses"
	env := jstest.Start(t)
	asked := make(chan string, 1)
	serveAgent(t, env, run, "a1", func(ctx context.Context, rollout string) error {
		asked <- rollout
		<-ctx.Done() // in flight until the service stops
		return ctx.Err()
	})
	nc, js := env.Connect(t)
	_, watchJS := env.Connect(t)
	bus, err := jetstream.Open(t.Context(), watchJS)
	if err != nil {
		t.Fatal(err)
	}
	c, err := New(Config{Run: run, Tasks: []Task{{RolloutID: "r1", Task: json.RawMessage(`{}`)}},
		Output: filepath.Join(t.TempDir(), "results.jsonl"), Agents: []string{"a1"}, Conn: nc, JS: js, Bus: bus,
		Controller: noController{}, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Run(ctx)
		done <- err
	}()
	select {
	case <-asked:
	case err := <-done:
		t.Fatalf("Run returned early: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the agent was never asked")
	}
	watchJS.Conn().Close()
	select {
	case err := <-done:
		if err == nil || errors.Is(err, context.Canceled) {
			t.Fatalf("Run after its fleet watch closed: %v, want the watch's failure", err)
		}
		t.Logf("Run: %v", err)
	case <-time.After(10 * time.Second):
		cancel()
		<-done
		t.Fatal("Run went on after its fleet watch closed")
	}
}

// countingController counts the checkpoints and status reads asked of it;
// every checkpoint fails, every status read too.
type countingController struct {
	noController
	checkpoints, statuses atomic.Int32
	status                *bridgeapi.Status // what Status answers; nil: it fails
}

func (c *countingController) Checkpoint(context.Context, bridgeapi.CheckpointRequest) (*bridgeapi.CheckpointResult, error) {
	c.checkpoints.Add(1)
	return &bridgeapi.CheckpointResult{Status: bridgeapi.StatusFailed}, nil
}

func (c *countingController) Status(context.Context) (*bridgeapi.Status, error) {
	c.statuses.Add(1)
	if c.status != nil {
		return c.status, nil
	}
	return nil, errNoController
}

// TestNoCheckpointBeforeTheRecovery: a checkpoint falls due while a
// member's restart waits to be recovered from; the collector recovers
// first (it reads the bridge's status) and asks no checkpoint, which the
// restarted members would prepare and so never be restored into. With no
// restart waiting, it asks the checkpoint.
func TestNoCheckpointBeforeTheRecovery(t *testing.T) {
	env := jstest.Start(t)
	nc, js := env.Connect(t)
	ctl := &countingController{}
	c, err := New(Config{Run: "gate", Tasks: []Task{{RolloutID: "r1", Task: json.RawMessage(`{}`)}},
		Output: filepath.Join(t.TempDir(), "results.jsonl"), Agents: []string{"a1"}, Conn: nc, JS: js, Bus: env.Bus,
		Controller: ctl, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	c.fleet <- "agent.a1 restarted"
	if err := c.checkpointOrRecover(t.Context()); err == nil || !errors.Is(err, errNoController) {
		t.Fatalf("checkpointOrRecover with a restart waiting: %v, want the recovery's status read failing", err)
	}
	if n, s := ctl.checkpoints.Load(), ctl.statuses.Load(); n != 0 || s == 0 {
		t.Fatalf("with a restart waiting: %d checkpoints asked, %d status reads; want none, and the recovery's", n, s)
	}
	if err := c.checkpointOrRecover(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := ctl.checkpoints.Load(); n != 1 {
		t.Fatalf("with no restart waiting: %d checkpoints asked, want 1", n)
	}

	// A recovery that succeeds (here a late notice of a restart already
	// recovered from: the agent is up and nothing is lost) does not drop
	// the checkpoint asked with it.
	ctl.status = &bridgeapi.Status{Members: []events.MemberInfo{{Member: "agent.a1", Instance: "i2", Served: true}}}
	serveMember(t, env, "gate", "agent.a1", "i2")
	c.fleet <- "agent.a1 restarted"
	if err := c.checkpointOrRecover(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := ctl.checkpoints.Load(); n != 2 {
		t.Fatalf("after a recovery that succeeded: %d checkpoints asked in all, want 2", n)
	}
}
