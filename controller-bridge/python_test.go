package bridge_test

import (
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// TestPythonController runs the documented Python example (standard
// library only) against a live bridge and fleet: the calls a training loop
// makes — checkpoint, release, restore after a crash, the final release.
func TestPythonController(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is needed to test the documented Python controller: apt-get install -y python3")
	}
	env := jstest.Start(t)
	old := membertest.StartMembers(t, env, run, 2, membertest.Options{Episodes: 2})
	b := startBridge(t, env, bridge.Config{})
	srv := httptest.NewServer(b.Handler(testToken))
	t.Cleanup(srv.Close)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(testToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join("..", "docs", "examples", "controller.py")
	call := func(wantExit int, args ...string) map[string]any {
		t.Helper()
		cmd := exec.CommandContext(t.Context(), py, append([]string{script, srv.URL, tokenFile}, args...)...)
		out, err := cmd.Output()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
			t.Logf("stderr: %s", ee.Stderr)
		} else if err != nil {
			t.Fatal(err)
		}
		var res map[string]any
		if err := json.Unmarshal(out, &res); err != nil {
			t.Fatalf("python %v printed %q: %v", args, out, err)
		}
		if code != wantExit {
			t.Fatalf("python %v exited %d, want %d: %s", args, code, wantExit, out)
		}
		return res
	}

	cycle := call(0, "cycle")
	if cycle["release"].(map[string]any)["deleted"].([]any)[0] != cycle["first"].(map[string]any)["checkpoint_id"] {
		t.Errorf("release kept the wrong checkpoint: %v", cycle["release"])
	}
	// An API error (a path-like id) exits 2 with the bridge's error code.
	if res := call(2, "checkpoint", "../etc"); res["error"].(map[string]any)["code"] != "bad_request" {
		t.Errorf("bad id: %v", res)
	}
	// A crash: the fleet dies, a fresh one starts, the loop restores.
	if res := call(0, "checkpoint", "before-crash"); res["status"] != "committed" {
		t.Fatalf("%v", res)
	}
	for _, h := range old {
		_ = h.Stop()
	}
	membertest.StartMembers(t, env, run, 2, membertest.Options{})
	res := call(0, "restore")
	if res["status"] != "completed" || res["source_checkpoint_id"] != "before-crash" || len(res["restored"].([]any)) != 4 {
		t.Fatalf("restore: %v", res)
	}
	if res := call(0, "release"); res["status"] != "completed" {
		t.Fatalf("final release: %v", res)
	}
	if keys := kvKeys(t, env); len(keys) != 0 {
		t.Errorf("the final release left %v", keys)
	}
}

// TestHTTPAuthAndErrors: the token is required and compared; bad bodies
// and ids are refused naming what is wrong.
func TestHTTPAuthAndErrors(t *testing.T) {
	env := jstest.Start(t)
	b := startBridge(t, env, bridge.Config{})
	srv := httptest.NewServer(b.Handler(testToken))
	t.Cleanup(srv.Close)
	cases := []struct {
		method, path, token, body string
		status                    int
		code                      string
	}{
		{"GET", "/v1/status", "", "", 401, "unauthorized"},
		{"GET", "/v1/status", "wrong", "", 401, "unauthorized"},
		{"GET", "/v1/status", testToken, "", 200, ""},
		{"GET", "/healthz", "", "", 200, ""},
		{"POST", "/v1/checkpoints", testToken, `{"checkpoint_id":"a.b"}`, 400, "bad_request"},
		{"POST", "/v1/checkpoints", testToken, `{"checkpointid":"x"}`, 400, "bad_request"},
		{"POST", "/v1/checkpoints", testToken, `{"checkpoint_id":"x"} {}`, 400, "bad_request"},
		{"POST", "/v1/retire", testToken, `{"episodes":["r1-a0"]}`, 400, "bad_request"},
		{"POST", "/v1/restore", testToken, `{}`, 404, "not_found"},
		{"GET", "/v1/checkpoints/nope", testToken, "", 404, "not_found"},
		{"POST", "/v1/checkpoints/nope/commit", testToken, `{}`, 404, "not_found"},
		{"POST", "/v1/release", testToken, `{"keep":["nope"]}`, 404, "not_found"},
	}
	for _, c := range cases {
		req := httptest.NewRequest(c.method, srv.URL+c.path, stringsReader(c.body))
		req.RequestURI = ""
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Error struct{ Code, Detail string }
		}
		_ = json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		if resp.StatusCode != c.status || body.Error.Code != c.code {
			t.Errorf("%s %s %s: %d %q (%s), want %d %q", c.method, c.path, c.body, resp.StatusCode, body.Error.Code, body.Error.Detail, c.status, c.code)
		}
	}
}
