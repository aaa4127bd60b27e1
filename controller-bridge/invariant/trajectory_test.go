package invariant_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/controller-bridge/invariant"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

var trajScript = modelserver.Script{"t": {
	{Content: "Listing.", ToolCalls: []modelserver.ToolCall{modelserver.BashCall("c1", "ls")}},
	{Content: "Done."},
}}

// captured drives trajScript through a capturing relay in front of ms, as
// a harness does, and returns the capture file's bytes.
func captured(t *testing.T, ms *modelserver.Server, episode string) []byte {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Header.Set(modelserver.TaskHeader, "t")
		ms.ServeHTTP(w, r)
	}))
	t.Cleanup(up.Close)
	path := filepath.Join(t.TempDir(), trajectory.FileName)
	rec, err := trajectory.OpenRecorder(path)
	if err != nil {
		t.Fatal(err)
	}
	r, err := relay.New(relay.Config{Upstream: up.URL, Capture: rec, Tokens: true, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Label(episode, episode+".l1", nil); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln) }()
	poll.Wait(t, 5*time.Second, "the relay serving", func() bool { return r.URL() != "" })
	msgs := []any{map[string]any{"role": "user", "content": "list"}}
	for range trajScript["t"] {
		b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
		resp, err := http.Post(r.URL()+"/v1/chat/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var body struct {
			Choices []struct {
				Message map[string]any `json:"message"`
			} `json:"choices"`
		}
		if resp.StatusCode != 200 || json.Unmarshal(raw, &body) != nil || len(body.Choices) == 0 {
			t.Fatalf("%d %s", resp.StatusCode, raw)
		}
		msgs = append(msgs, body.Choices[0].Message, map[string]any{"role": "tool", "tool_call_id": "c1", "content": "a.txt"})
	}
	cancel()
	if err := <-done; err != nil { // Serve closes the recorder: the file is whole
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// Invariant 8 holds for a result whose stored trajectory is the chain the
// model server answered, in the shared store or in the agent's own its
// result names, and fails, naming the rollout, for one whose stored bytes
// are not those the result names, one not in the store its result names,
// one with no trajectory, and one whose calls the model server did not
// answer.
func TestTrajectoriesInvariant(t *testing.T) {
	env := jstest.Start(t)
	ctx := t.Context()
	_, js := env.Connect(t)
	ms := modelserver.New(trajScript)
	data := captured(t, ms, "r1")
	object := run + "/r1.jsonl"
	if _, err := env.Bus.Trajectories.Put(ctx, natsjs.ObjectMeta{Name: object}, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	ref := &agentapi.TrajectoryRef{Object: object, SHA256: hex.EncodeToString(sum[:]), Bytes: int64(len(data)), Calls: 2}
	results := filepath.Join(t.TempDir(), "results.jsonl")
	write := func(ref *agentapi.TrajectoryRef) {
		t.Helper()
		line, _ := json.Marshal(map[string]any{"rollout_id": "r1", "ok": true,
			"result": agentapi.Result{RolloutID: "r1", Trajectory: ref, NoTrajectory: map[bool]string{true: "no relay"}[ref == nil]}})
		if err := os.WriteFile(results, append(line, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	eight := func(r invariant.Run) invariant.Result { return invariant.Trajectories(ctx, r) }
	r := invariant.Run{Run: run, JS: js, Bus: env.Bus, Results: results, Rollouts: []string{"r1"}, Model: ms}

	write(ref)
	if got := eight(r); !got.OK || !strings.Contains(got.Detail, "1 trajectories, 2 calls") {
		t.Fatalf("8 of the answered chain: %+v", got)
	}
	bad := *ref
	bad.Bytes++
	write(&bad)
	if got := eight(r); got.OK || !strings.Contains(got.Detail, "r1: ") || !strings.Contains(got.Detail, "sha256") {
		t.Errorf("8 with bytes the result does not name: %+v", got)
	}
	write(nil)
	if got := eight(r); got.OK || !strings.Contains(got.Detail, "r1: no trajectory (no relay)") {
		t.Errorf("8 with no trajectory: %+v", got)
	}
	// A result of an agent with credentials of its own names its own
	// store, where alone the trajectory is: it is read from there.
	own, err := jetstream.MakeTrajectoriesStore(ctx, js, env.Bus.Trajectories, run, "agent.a1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := own.Put(ctx, natsjs.ObjectMeta{Name: object}, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if err := env.Bus.Trajectories.Delete(ctx, object); err != nil {
		t.Fatal(err)
	}
	write(ref)
	if got := eight(r); got.OK || !strings.Contains(got.Detail, "r1: ") {
		t.Errorf("8 of a trajectory gone from the store its result names: %+v", got)
	}
	inOwn := *ref
	inOwn.Bucket = events.TrajectoriesBucket(run, "agent.a1")
	write(&inOwn)
	if got := eight(r); !got.OK || !strings.Contains(got.Detail, "1 trajectories, 2 calls") {
		t.Fatalf("8 of the answered chain in the agent's own store: %+v", got)
	}
	r.Model = modelserver.New(trajScript) // a server that answered none of it
	if got := eight(r); got.OK || !strings.Contains(got.Detail, "the model server answered 0") {
		t.Errorf("8 against a ledger without its calls: %+v", got)
	}
	r.NoTrajectories = true
	if got := eight(r); !got.OK || !strings.Contains(got.Detail, "not checked") {
		t.Errorf("8 of a run without relays: %+v", got)
	}
}
