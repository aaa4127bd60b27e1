package bridge_test

import (
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
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
		// The scheme in any case, the token exactly.
		{"GET", "/v1/status", "bearer " + testToken, "", 200, ""},
		{"GET", "/v1/status", "BEARER  " + testToken, "", 200, ""},
		{"GET", "/v1/status", "Basic " + testToken, "", 401, "unauthorized"},
		{"GET", "/v1/status", "Bearer " + strings.ToUpper(testToken), "", 401, "unauthorized"},
		// Every answer is JSON: an unknown route, a wrong method.
		{"GET", "/v1/nope", testToken, "", 404, "not_found"},
		{"GET", "/", "", "", 404, "not_found"},
		{"DELETE", "/v1/status", testToken, "", 405, "method_not_allowed"},
		{"GET", "/v1/checkpoints", testToken, "", 405, "method_not_allowed"},
		{"PUT", "/v1/checkpoints/c1/commit", testToken, "", 405, "method_not_allowed"},
		// A body over the bound.
		{"POST", "/v1/checkpoints", testToken, `{"episodes":["` + strings.Repeat("r", bridgeapi.MaxRequestBody) + `"]}`, 413, "too_large"},
		// A percent-encoded id, refused the same way on every route, even
		// one that decodes to a valid id.
		{"GET", "/v1/checkpoints/c%31", testToken, "", 400, "bad_request"},
		{"GET", "/v1/checkpoints/a%2Fb", testToken, "", 400, "bad_request"},
		{"POST", "/v1/checkpoints/c%31/commit", testToken, `{}`, 400, "bad_request"},
		{"POST", "/v1/checkpoints/a%2Fb/abort", testToken, "", 400, "bad_request"},
		{"POST", "/v1/checkpoints/a.b/abort", testToken, "", 400, "bad_request"},
	}
	for _, c := range cases {
		req := httptest.NewRequest(c.method, srv.URL+c.path, stringsReader(c.body))
		req.RequestURI = ""
		switch {
		case strings.Contains(c.token, " "):
			req.Header.Set("Authorization", c.token)
		case c.token != "":
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
			t.Errorf("%s %s %.80s: %d %q (%s), want %d %q", c.method, c.path, c.body, resp.StatusCode, body.Error.Code, body.Error.Detail, c.status, c.code)
		}
		if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("%s %s: Content-Type %q", c.method, c.path, ct)
		}
		if c.status == 405 && resp.Header.Get("Allow") == "" {
			t.Errorf("%s %s: 405 without an Allow header", c.method, c.path)
		}
		if strings.Contains(c.path, "%") && !strings.Contains(body.Error.Detail, "percent-encoding") {
			t.Errorf("%s %s: %q does not say why", c.method, c.path, body.Error.Detail)
		}
	}
}
