package collect

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/agent"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// With Trajectories set, each result's trajectory is written beside the
// results, checked against what the result names: r1's bytes as stored;
// r2's result names bytes the store does not hold, so it gets no file,
// and its result is written all the same (the trajectory is not the
// rollout's result, and the store keeps what it has).
func TestTrajectoriesBesideTheResults(t *testing.T) {
	const run = "traj"
	env := jstest.Start(t)
	nc, js := env.Connect(t)
	good := []byte(`{"v":1,"id":"r1-a1.l1.1"}` + "\n")
	put := func(rollout string, data []byte) *agentapi.TrajectoryRef {
		name := run + "/" + rollout + ".jsonl"
		if _, err := env.Bus.Trajectories.Put(t.Context(), natsjs.ObjectMeta{Name: name}, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(data)
		return &agentapi.TrajectoryRef{Object: name, SHA256: hex.EncodeToString(sum[:]), Bytes: int64(len(data)), Calls: 1}
	}
	refs := map[string]*agentapi.TrajectoryRef{"r1": put("r1", good)}
	forged := put("r2", []byte("other bytes\n"))
	forged.SHA256 = refs["r1"].SHA256
	refs["r2"] = forged

	serveResults(t, nc, run, refs)

	dir := t.TempDir()
	trajDir := filepath.Join(dir, "trajectories")
	c, err := New(Config{Run: run, Tasks: []Task{{RolloutID: "r1", Task: json.RawMessage(`{}`)}, {RolloutID: "r2", Task: json.RawMessage(`{}`)}},
		Output: filepath.Join(dir, "results.jsonl"), Trajectories: trajDir, Agents: []string{"a1"}, Conn: nc, JS: js, Bus: env.Bus,
		Controller: noController{}, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Run(t.Context()); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(trajDir, "r1.jsonl"))
	if err != nil || !bytes.Equal(got, good) {
		t.Fatalf("r1.jsonl: %q %v, want %q", got, err, good)
	}
	if _, err := os.Stat(filepath.Join(trajDir, "r2.jsonl")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("r2.jsonl, whose bytes are not those its result names: %v, want none", err)
	}
	res := c.Results()
	if len(res) != 2 || !res["r1"].OK || !res["r2"].OK || res["r2"].Result.Trajectory == nil {
		t.Fatalf("results %+v, want r1 and r2, both ok and naming their trajectories", res)
	}
}

// serveResults serves agent a1 of run on nc: it answers each rollout with
// a result naming the trajectory refs has for it.
func serveResults(t *testing.T, nc *nats.Conn, run string, refs map[string]*agentapi.TrajectoryRef) {
	t.Helper()
	s, err := jetstream.NewService(nc, micro.Config{Name: "test-agent", Version: "1.0.0"},
		events.ServiceSubject(run, events.Member("agent.a1")), func(error) (int, string) { return 500, "rollout_failed" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Stop() })
	if err := s.HandleAsync(t.Context(), "run", func(_ context.Context, body []byte) (any, error) {
		var req struct {
			RolloutID string `json:"rollout_id"`
		}
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, err
		}
		return agentapi.Result{RolloutID: req.RolloutID, Trajectory: refs[req.RolloutID]}, nil
	}); err != nil {
		t.Fatal(err)
	}
}

// A collector with the controller's credentials writes the trajectory a
// result names in its agent's own store (an agent with a user of its own,
// whose store the bridge made when it asked) beside the results; the same
// object in the shared store, other bytes, is not the one it takes.
func TestTrajectoriesFromTheAgentsOwnStore(t *testing.T) {
	const run = "own"
	env := jstest.Start(t, jstest.WithAuthority(run))
	membertest.NewBridge(t, env, run)
	ctx := t.Context()
	_, ajs := env.WithCreds(env.MemberCreds(t, run, "agent.a1")).Connect(t)
	store, err := agent.OwnTrajectories(ctx, ajs, run, "agent.a1")
	if err != nil {
		t.Fatal(err)
	}
	data := []byte(`{"v":3,"id":"r1.l1.1"}` + "\n")
	name := agent.TrajectoryObject(run, "r1")
	if _, err := store.Put(ctx, natsjs.ObjectMeta{Name: name}, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if _, err := env.Bus.Trajectories.Put(ctx, natsjs.ObjectMeta{Name: name}, bytes.NewReader([]byte("other bytes\n"))); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	ref := &agentapi.TrajectoryRef{Object: name, Bucket: events.TrajectoriesBucket(run, "agent.a1"), SHA256: hex.EncodeToString(sum[:]),
		Bytes: int64(len(data)), Calls: 1}
	serveResults(t, env.Conn, run, map[string]*agentapi.TrajectoryRef{"r1": ref})

	b, err := env.Authority.RoleCreds(embedded.RoleController, run)
	if err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(t.TempDir(), "controller.creds")
	if err := os.WriteFile(creds, b, 0o600); err != nil {
		t.Fatal(err)
	}
	nc, js := env.WithCreds(creds).Connect(t)
	bus, err := jetstream.Open(ctx, js)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	trajDir := filepath.Join(dir, "trajectories")
	c, err := New(Config{Run: run, Tasks: []Task{{RolloutID: "r1", Task: json.RawMessage(`{}`)}},
		Output: filepath.Join(dir, "results.jsonl"), Trajectories: trajDir, Agents: []string{"a1"}, Conn: nc, JS: js, Bus: bus,
		Controller: noController{}, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(trajDir, "r1.jsonl")); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("r1.jsonl: %q %v, want %q from the agent's store", got, err, data)
	}
}
