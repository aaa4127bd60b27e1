package daemon_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxclient"
)

// A launch with a Branch labels its harness's model calls: the relay
// sends them with the branch's headers and seed; a re-point with another
// Branch labels the calls after it. A Branch that is no "b<k>", or without
// an episode, is a bad request, and so is one on a daemon without a relay.
func TestLaunchWithBranchLabelsItsCalls(t *testing.T) {
	if _, err := os.Stat("/usr/bin/curl"); err != nil {
		t.Fatal("curl is needed (apt-get install curl)")
	}
	type got struct{ branch, seed, body string }
	calls := make(chan got, 8)
	model := newModelServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"choices":[{"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`))
	})
	// The model server's handler sees the body first (modelServer.calls);
	// the headers come through a wrapper.
	inner := model.Config.Handler
	model.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, s := r.Header.Get(sandboxapi.BranchHeader), r.Header.Get(sandboxapi.SeedHeader)
		inner.ServeHTTP(w, r)
		calls <- got{branch: b, seed: s, body: <-model.calls}
	})
	env := jstest.Start(t)
	res, rl := residentWithRelay(t, t.TempDir(), model.URL)
	join(t, env, res, "br", 0)
	nc, _ := env.Connect(t)
	c, err := sandboxclient.New(nc, run, "br")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	var se *sandboxclient.ServiceError
	for _, r := range []sandboxapi.LaunchRequest{
		{LaunchID: id("bad1"), Command: "true", Episode: "r1", Branch: &sandboxapi.BranchLabel{Label: "b0"}},
		{LaunchID: id("bad2"), Command: "true", Episode: "r1", Branch: &sandboxapi.BranchLabel{Label: "1"}},
		{LaunchID: id("bad3"), Command: "true", Branch: &sandboxapi.BranchLabel{Label: "b1"}},
	} {
		if _, err := c.Launch(ctx, r); !errors.As(err, &se) || se.Code != sandboxapi.CodeBadRequest || !strings.Contains(se.Error(), "branch") {
			t.Errorf("launch with branch %+v, episode %q: %v, want bad_request naming the branch", r.Branch, r.Episode, err)
		}
	}
	if _, err := c.RepointWith(ctx, sandboxapi.RepointRequest{URL: model.URL, Generation: 1, Branch: &sandboxapi.BranchLabel{Label: "b-1"}}); code(err) != sandboxapi.CodeBadRequest {
		t.Errorf("repoint with branch b-1: %v, want bad_request", err)
	}

	dir := t.TempDir()
	call := `curl -sS -X POST -H 'Content-Type: application/json' -d '{"model":"m","messages":[{"role":"user","content":"hi"}]}' ` +
		rl.URL() + `/v1/chat/completions -o reply`
	if _, err := c.Launch(ctx, sandboxapi.LaunchRequest{LaunchID: id("r1b2-l1"), Episode: "r1.b2-a2", Dir: dir, Command: call,
		Branch: &sandboxapi.BranchLabel{Label: "b2", Seed: 1234}}); err != nil {
		t.Fatal(err)
	}
	check := func(g got, label, seed string) {
		t.Helper()
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(g.body), &m); err != nil {
			t.Fatalf("the model got %q: %v", g.body, err)
		}
		if g.branch != label || g.seed != seed || string(m["seed"]) != seed {
			t.Errorf("the model got branch %q seed %q body seed %s, want %s %s", g.branch, g.seed, m["seed"], label, seed)
		}
	}
	select {
	case g := <-calls:
		check(g, "b2", "1234")
	case <-time.After(20 * time.Second):
		t.Fatal("the launch's harness made no model call")
	}
	poll.Wait(t, 10*time.Second, "the harness's reply", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, "reply"))
		return strings.Contains(string(b), `"ok"`)
	})
	if st := rl.Status(); st.Branch == nil || st.Branch.Label != "b2" {
		t.Errorf("relay status branch %+v", st.Branch)
	}
	st, err := c.RepointWith(ctx, sandboxapi.RepointRequest{URL: model.URL, Generation: 1, Branch: &sandboxapi.BranchLabel{Label: "b3", Seed: 9}})
	if err != nil {
		t.Fatal(err)
	}
	if st.Branch == nil || *st.Branch != (sandboxapi.BranchLabel{Label: "b3", Seed: 9}) {
		t.Errorf("repoint answered branch %+v", st.Branch)
	}
	resp, err := http.Post(rl.URL()+"/v1/chat/completions", "application/json", strings.NewReader(`{"messages":[]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	check(<-calls, "b3", "9")
}

// A Branch on a daemon without a model relay is a bad request.
func TestLaunchWithBranchNeedsARelay(t *testing.T) {
	env := jstest.Start(t)
	_, c := start(t, env)
	_, err := c.Launch(t.Context(), sandboxapi.LaunchRequest{LaunchID: id("nb"), Command: "true", Episode: "r1",
		Branch: &sandboxapi.BranchLabel{Label: "b1", Seed: 1}})
	if code(err) != sandboxapi.CodeBadRequest || !strings.Contains(err.Error(), "relay") {
		t.Fatalf("launch with a branch and no relay: %v, want bad_request naming the relay", err)
	}
}
