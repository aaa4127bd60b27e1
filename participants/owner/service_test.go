package owner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// serve runs the owner's service until the test ends and returns a client.
func serve(t *testing.T, env *jstest.Env, o *Owner) *ownerapi.Client {
	t.Helper()
	nc, _ := env.Connect(t)
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- o.Serve(ctx, nc) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	c, err := ownerapi.NewClient(env.Conn, testRun, o.cfg.Name)
	if err != nil {
		t.Fatal(err)
	}
	// The service answers once its subscriptions are in.
	poll.Wait(t, 10*time.Second, "the owner service to answer", func() bool {
		_, err := c.SandboxAccess(t.Context(), "probe")
		var se *jetstream.ServiceError
		return errors.As(err, &se)
	})
	return c
}

// The agent's calls over the bus: seed (the task's files go in, the setup
// runs), sandbox access, verify (the grade sees the sandbox and the session
// data), a verify without a sandbox is a 409, close is idempotent, and bad
// requests are refused naming what is wrong.
func TestServiceForAgents(t *testing.T) {
	forEachProvider(t, func(t *testing.T, p fullProvider) {
		env := jstest.Start(t)
		cfg := baseConfig(t, env, p, "o1")
		setup := func(_ context.Context, _ Execer, s *Session, task json.RawMessage) (json.RawMessage, error) {
			if string(task) != `{"prompt":"write 42"}` {
				return nil, fmt.Errorf("setup got task %s", task)
			}
			return json.RawMessage(`{"want":"42"}`), nil
		}
		spec := func(sessionID string, _ events.Episode, task json.RawMessage) (provider.Spec, error) {
			var tk struct{ Prompt string }
			if err := json.Unmarshal(task, &tk); err != nil {
				return provider.Spec{}, err
			}
			return provider.Spec{Files: map[string][]byte{"task.txt": []byte(tk.Prompt)}}, nil
		}
		grade := func(ctx context.Context, x Execer, s *Session) (json.RawMessage, error) {
			res, err := x.Exec(ctx, s.Sandbox.ID, []string{"sh", "-c", "cat answer.txt 2>/dev/null"}, provider.ExecOptions{})
			if err != nil {
				return nil, err
			}
			var data struct{ Want string }
			_ = json.Unmarshal(s.Data, &data)
			ok := strings.TrimSpace(string(res.Stdout)) == data.Want
			return json.Marshal(map[string]any{"reward": map[bool]int{true: 1, false: 0}[ok]})
		}
		cfg.TaskKind = TaskFuncs{SpecFn: spec, SetupFn: setup, GradeFn: grade}
		c := serve(t, env, newOwner(t, cfg))
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()

		info, err := c.SeedSession(ctx, ownerapi.SeedRequest{SessionID: "s1", Episode: "r1", Task: json.RawMessage(`{"prompt":"write 42"}`)})
		if err != nil || info.SandboxID == "" || info.RestartOnly || info.Restored {
			t.Fatalf("seed: %+v %v", info, err)
		}
		if got := sh(t, p, info.SandboxID, "cat task.txt"); got != "write 42" {
			t.Fatalf("task file %q", got)
		}
		if acc, err := c.SandboxAccess(ctx, "s1"); err != nil || acc.SandboxID != info.SandboxID {
			t.Fatalf("sandbox_access: %+v %v", acc, err)
		}
		if v, err := c.Verify(ctx, "s1"); err != nil || string(v.Result) != `{"reward":0}` {
			t.Fatalf("verify before the answer: %s %v", v.Result, err)
		}
		sh(t, p, info.SandboxID, "echo 42 > answer.txt")
		if v, err := c.Verify(ctx, "s1"); err != nil || string(v.Result) != `{"reward":1}` {
			t.Fatalf("verify: %s %v", v.Result, err)
		}
		var se *jetstream.ServiceError
		if _, err := c.Verify(ctx, "nobody"); !errors.As(err, &se) || se.Status != 409 || se.Code != "no_sandbox" {
			t.Fatalf("verify without a sandbox: %v, want 409 no_sandbox", err)
		}
		for _, bad := range []ownerapi.SeedRequest{{SessionID: "../x", Episode: "r2"}, {SessionID: "s2", Episode: "r2-a0"}, {SessionID: "s3", Episode: "r3", Task: json.RawMessage(`[1]`)}} {
			if _, err := c.SeedSession(ctx, bad); !errors.As(err, &se) || se.Status != 400 {
				t.Errorf("seed %+v: %v, want a 400", bad, err)
			}
		}
		if err := c.CloseSession(ctx, "s1"); err != nil {
			t.Fatal(err)
		}
		if err := c.CloseSession(ctx, "s1"); err != nil {
			t.Fatalf("second close: %v", err)
		}
		if _, err := c.SandboxAccess(ctx, "s1"); !errors.As(err, &se) || se.Code != "no_sandbox" {
			t.Fatalf("access after close: %v", err)
		}
	})
}
