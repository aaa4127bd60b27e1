package bridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/client"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// serveBridge runs a bridge of run that connects as the bridge role, with
// its NATS service, until the test ends; it returns the bridge (whose
// Handler the test may serve over HTTP too). A permissions violation of
// the bridge's connection fails the test (jstest), so the bridge role is
// checked to cover the service.
func serveBridge(t *testing.T, env *jstest.Env) *bridge.Bridge {
	t.Helper()
	b := startBridge(t, env.As(embedded.RoleBridge), bridge.Config{})
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- b.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("bridge Serve: %v", err)
		}
	})
	return b
}

// controllerClient is a client over NATS as the controller role, ready.
func controllerClient(t *testing.T, env *jstest.Env) (*client.Client, *nats.Conn) {
	t.Helper()
	nc, _ := env.As(embedded.RoleController).Connect(t)
	c, err := client.NewNATS(nc, run, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Ready(ctx(t)); err != nil {
		t.Fatal(err)
	}
	return c, nc
}

// TestServiceClient: the Go client over NATS, as the controller role,
// drives a run as over HTTP: a checkpoint, a held one committed, its
// result read back, the status, a restore into a fresh fleet, and the
// final release; errors come back as the HTTP API's codes.
func TestServiceClient(t *testing.T) {
	env := jstest.Start(t, jstest.WithRoles())
	old := fleet(t, env, 2, 2)
	serveBridge(t, env)
	c, _ := controllerClient(t, env)

	res, err := c.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1"})
	if err != nil || res.Status != bridgeapi.StatusCommitted || res.CheckpointID != "c1" || len(res.Members) != 2 {
		t.Fatalf("checkpoint over NATS: %+v, %v", res, err)
	}
	held, err := c.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c2", Hold: true})
	if err != nil || held.Status != bridgeapi.StatusPrepared {
		t.Fatalf("held checkpoint over NATS: %+v, %v", held, err)
	}
	var ce *client.Error
	if _, err := c.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c3"}); !errors.As(err, &ce) || ce.Status != 409 || ce.Code != "checkpoint_conflict" {
		t.Fatalf("a checkpoint while one is held: %v, want 409 checkpoint_conflict", err)
	}
	if st, err := c.Status(ctx(t)); err != nil || st.Held != "c2" {
		t.Fatalf("status over NATS: %+v, %v", st, err)
	}
	if res, err := c.Commit(ctx(t), "c2", false); err != nil || res.Status != bridgeapi.StatusCommitted || res.CheckpointID != "c2" {
		t.Fatalf("commit-held over NATS: %+v, %v", res, err)
	}
	if got, err := c.Get(ctx(t), "c1"); err != nil || got.Status != bridgeapi.StatusCommitted || got.CheckpointID != "c1" {
		t.Fatalf("get over NATS: %+v, %v", got, err)
	}
	if _, err := c.Get(ctx(t), "nope"); !errors.As(err, &ce) || ce.Status != 404 || ce.Code != "not_found" {
		t.Fatalf("get of a missing checkpoint: %v, want 404 not_found", err)
	}
	if _, err := c.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "../etc"}); !errors.As(err, &ce) || ce.Status != 400 || ce.Code != "bad_request" {
		t.Fatalf("a bad id: %v, want 400 bad_request", err)
	}

	for _, h := range old {
		_ = h.Stop()
	}
	membertest.StartMembers(t, env, run, 2, membertest.Options{})
	rr, err := c.Restore(ctx(t), bridgeapi.RestoreRequest{})
	if err != nil || rr.Status != bridgeapi.StatusCompleted || rr.Source != "c2" || len(rr.Restored) != 4 {
		t.Fatalf("restore over NATS: %+v, %v", rr, err)
	}
	br, err := c.Branch(ctx(t), bridgeapi.BranchRequest{Rollouts: []string{"t0-r0"}, N: 2, Seed: 7})
	if err != nil || br.Status != bridgeapi.StatusCompleted || br.Source != "c2" || len(br.Agents) != 2 {
		t.Fatalf("branch over NATS: %+v, %v", br, err)
	}
	rel, err := c.Release(ctx(t), bridgeapi.ReleaseRequest{})
	if err != nil || rel.Status != bridgeapi.StatusCompleted || !slices.Contains(rel.Deleted, "c1") || !slices.Contains(rel.Deleted, "c2") {
		t.Fatalf("final release over NATS: %+v, %v", rel, err)
	}
	if keys := kvKeys(t, env); len(keys) != 0 {
		t.Errorf("manifests left after the final release: %v", keys)
	}
}

// TestServiceSameAsHTTP: a request answers the same JSON over both
// transports, an error included (the service's micro error headers carry
// the HTTP status and "code: detail" on one line).
func TestServiceSameAsHTTP(t *testing.T) {
	env := jstest.Start(t, jstest.WithRoles())
	fleet(t, env, 1, 1)
	b := serveBridge(t, env)
	srv := httptest.NewServer(b.Handler(testToken))
	t.Cleanup(srv.Close)
	_, nc := controllerClient(t, env)
	subject := bridgeapi.ServiceSubject(run, "") + "."

	post := func(path, body string) (int, map[string]any) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx(t), http.MethodPost, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		var v map[string]any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatalf("HTTP %s: %q: %v", path, raw, err)
		}
		return resp.StatusCode, v
	}
	request := func(endpoint, body string) (*nats.Msg, map[string]any) {
		t.Helper()
		m, err := nc.RequestWithContext(ctx(t), subject+endpoint, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		var v map[string]any
		if err := json.Unmarshal(m.Data, &v); err != nil {
			t.Fatalf("NATS %s: %q: %v", endpoint, m.Data, err)
		}
		return m, v
	}
	for _, tc := range []struct {
		path, endpoint, body string
		status               int
		code                 string
		httpBody             string // when the route takes another body (the id in its path)
	}{
		{bridgeapi.PathCheckpoints, bridgeapi.EndpointCheckpoint, `{"checkpoint_id":"x","bogus":1}`, 400, "bad_request", ""},
		{bridgeapi.PathCheckpoints, bridgeapi.EndpointCheckpoint, `{"checkpoint_id":"x"} {}`, 400, "bad_request", ""},
		{bridgeapi.PathCheckpoints, bridgeapi.EndpointCheckpoint, `{"hold":true,"stop":true,"episodes":["-"]}`, 400, "bad_request", ""},
		{bridgeapi.PathRetire, bridgeapi.EndpointRetire, `{}`, 400, "bad_request", ""},
		{bridgeapi.PathBranch, bridgeapi.EndpointBranch, `{"rollouts":["t0-r0"],"n":0}`, 400, "bad_request", ""},
		{bridgeapi.CommitPath("nothing-held"), bridgeapi.EndpointCommitHeld, `{"checkpoint_id":"nothing-held"}`, 404, "not_found", `{"stop":false}`},
	} {
		hb := tc.httpBody
		if hb == "" {
			hb = tc.body
		}
		hs, hv := post(tc.path, hb)
		m, nv := request(tc.endpoint, tc.body)
		if hs != tc.status || !equalJSON(hv, nv) || hv["error"].(map[string]any)["code"] != tc.code {
			t.Errorf("%s %s: HTTP %d %v, NATS %v, want %d %s and the same body", tc.endpoint, tc.body, hs, hv, nv, tc.status, tc.code)
		}
		if got := m.Header.Get(micro.ErrorCodeHeader); got != strconv.Itoa(tc.status) {
			t.Errorf("%s: error code header %q, want %d", tc.endpoint, got, tc.status)
		}
		if d := m.Header.Get(micro.ErrorHeader); !strings.HasPrefix(d, tc.code+": ") || strings.ContainsAny(d, "\r\n") {
			t.Errorf("%s: error header %q, want %q and one line", tc.endpoint, d, tc.code+": …")
		}
	}
	// A success: the same checkpoint asked again answers its result on both.
	hs, hv := post(bridgeapi.PathCheckpoints, `{"checkpoint_id":"same"}`)
	_, nv := request(bridgeapi.EndpointCheckpoint, `{"checkpoint_id":"same"}`)
	if hs != 200 || hv["status"] != bridgeapi.StatusCommitted || !equalJSON(hv, nv) {
		t.Errorf("checkpoint: HTTP %d %v, NATS %v, want the same committed result", hs, hv, nv)
	}
	// Status takes an empty body, as nats req sends one.
	if _, v := request(bridgeapi.EndpointStatus, ""); v["run"] != run {
		t.Errorf("status with an empty body: %v", v)
	}
}

func equalJSON(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return string(x) == string(y)
}

// TestServicePermissions: the controller role (and admin) may call the
// bridge's service and find it through micro's discovery; the member roles
// may neither call it nor serve its subjects in its place.
func TestServicePermissions(t *testing.T) {
	env := jstest.Start(t, jstest.WithRoles())
	fleet(t, env, 1, 1)
	serveBridge(t, env)
	c, cnc := controllerClient(t, env)
	if _, err := c.Status(ctx(t)); err != nil {
		t.Fatalf("controller calling status: %v", err)
	}
	if m, err := cnc.RequestWithContext(ctx(t), "$SRV.PING."+bridgeapi.ServiceName, nil); err != nil || !strings.Contains(string(m.Data), bridgeapi.ServiceName) {
		t.Fatalf("controller pinging the service: %v", err)
	}
	admin, err := client.NewNATS(env.Conn, run, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := admin.Status(ctx(t)); err != nil {
		t.Fatalf("admin calling status: %v", err)
	}

	subject := bridgeapi.ServiceSubject(run, "") + "." + bridgeapi.EndpointCheckpoint
	for _, role := range []embedded.Role{embedded.RoleSandbox, embedded.RoleAgent, embedded.RoleOwner} {
		t.Run(string(role), func(t *testing.T) {
			nc, errs := connectWatching(t, env, role)
			// Calling: the publish is refused, so nobody answers.
			mc, err := client.NewNATS(nc, run, "")
			if err != nil {
				t.Fatal(err)
			}
			cctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
			defer cancel()
			if _, err := mc.Checkpoint(cctx, bridgeapi.CheckpointRequest{ID: "by-" + string(role)}); err == nil {
				t.Fatalf("a %s credential took a checkpoint", role)
			}
			waitViolation(t, errs, "Publish", subject)
			// Serving in the bridge's place: the subscription is refused.
			if _, err := nc.SubscribeSync(bridgeapi.ServiceSubject(run, "") + ".>"); err != nil {
				t.Fatal(err)
			}
			waitViolation(t, errs, "Subscription", bridgeapi.ServiceSubject(run, "")+".>")
		})
	}
	if got := manifestOf(t, env, "by-sandbox"); got != nil {
		t.Errorf("a checkpoint a sandbox asked for exists: %+v", got)
	}
}

// connectWatching connects as role and returns the connection with its
// async errors, which the test reads (a refusal is what it wants to see,
// so jstest's failing on violations is not used).
func connectWatching(t *testing.T, env *jstest.Env, role embedded.Role) (*nats.Conn, <-chan error) {
	t.Helper()
	errs := make(chan error, 16)
	closed := make(chan struct{})
	var once sync.Once
	nc, err := jetstream.Connect(ctx(t), env.As(role).ConnConfig(t.Name()),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}),
		nats.ClosedHandler(func(*nats.Conn) { once.Do(func() { close(closed) }) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		nc.Close()
		<-closed
	})
	return nc, errs
}

// waitViolation waits for a permissions violation of kind ("Publish" or
// "Subscription") on subject.
func waitViolation(t *testing.T, errs <-chan error, kind, subject string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case err := <-errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), kind) && strings.Contains(err.Error(), `"`+subject+`"`) {
				return
			}
			t.Logf("other async error: %v", err)
		case <-timeout:
			t.Fatalf("no permissions violation for %s to %s", kind, subject)
		}
	}
}

// TestServiceNatsCLI: the real natscli takes a checkpoint with `nats req`
// as the controller role, and `nats micro ls` lists the service.
func TestServiceNatsCLI(t *testing.T) {
	natsCLI, err := exec.LookPath("nats")
	if err != nil {
		t.Fatal("natscli is needed to test the bridge service with nats req: go install github.com/nats-io/natscli/nats@v0.5.0")
	}
	env := jstest.Start(t, jstest.WithRoles())
	fleet(t, env, 2, 1)
	serveBridge(t, env)
	controllerClient(t, env) // waits for the service to answer
	home := t.TempDir()
	nats := func(args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx(t), natsCLI, append([]string{"--server", env.URL,
			"--nkey", embedded.SeedFile(env.AuthDir, embedded.RoleController), "--timeout", "60s"}, args...)...)
		// No context of the machine's user: only the flags count.
		cmd.Env = append(os.Environ(), "HOME="+home, "XDG_CONFIG_HOME="+filepath.Join(home, ".config"))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("nats %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	subject := bridgeapi.ServiceSubject(run, "") + "." + bridgeapi.EndpointCheckpoint
	out := nats("req", "--raw", subject, `{"checkpoint_id":"from-natscli"}`)
	var res bridgeapi.CheckpointResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &res); err != nil {
		t.Fatalf("nats req printed %q: %v", out, err)
	}
	if res.Status != bridgeapi.StatusCommitted || res.CheckpointID != "from-natscli" || len(res.Members) != 2 {
		t.Fatalf("nats req took %+v, want checkpoint from-natscli committed by 2 members", res)
	}
	if m := manifestOf(t, env, "from-natscli"); m == nil {
		t.Fatal("no manifest of the checkpoint natscli took")
	}
	out = nats("req", "--raw", bridgeapi.ServiceSubject(run, "")+"."+bridgeapi.EndpointBranch, `{"rollouts":["t0-r0"],"n":2,"seed":9}`)
	var br bridgeapi.BranchResult
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &br); err != nil {
		t.Fatalf("nats req branch printed %q: %v", out, err)
	}
	if br.Status != bridgeapi.StatusCompleted || br.Source != "from-natscli" || len(br.Branches) != 2 || br.Branches[1].Seed != bridgeapi.BranchSeed(9, "t0-r0", 2) {
		t.Fatalf("nats req branch took %+v, want 2 branches of t0-r0 from from-natscli", br)
	}
	if ls := nats("micro", "ls"); !strings.Contains(ls, bridgeapi.ServiceName) {
		t.Errorf("nats micro ls does not list %s:\n%s", bridgeapi.ServiceName, ls)
	}
	info := nats("micro", "info", bridgeapi.ServiceName)
	for _, ep := range bridgeapi.Endpoints() {
		if want := bridgeapi.ServiceSubject(run, "") + "." + ep; !strings.Contains(info, want) {
			t.Errorf("nats micro info does not show endpoint %s:\n%s", want, info)
		}
	}
}
