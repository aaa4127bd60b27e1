package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// TestBranchCommand: `stillpoint branch -n 2 ROLLOUT` prints a line per
// branch with its parent and seed; --output json prints the result; a bad
// request exits 2 naming what is wrong.
func TestBranchCommand(t *testing.T) {
	const run, token = "cli-branch", "t0ken"
	env := jstest.Start(t)
	membertest.StartMembers(t, env, run, 1, membertest.Options{Episodes: 1})
	nc, js := env.Connect(t)
	b, err := bridge.New(bridge.Config{Run: run, Conn: nc, JS: js, Bus: env.Bus, PhaseTimeout: 30 * time.Second,
		Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	srv := httptest.NewServer(b.Handler(token))
	t.Cleanup(srv.Close)
	t.Setenv("STILLPOINT_BRIDGE_TOKEN", token)
	if res, err := b.Checkpoint(t.Context(), bridgeapi.CheckpointRequest{ID: "c1"}); err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("checkpoint: %+v %v", res, err)
	}

	var out, errb bytes.Buffer
	if code := Main([]string{"branch", "--bridge", srv.URL, "-n", "2", "--seed", "11", "t0-r0"}, &out, &errb); code != 0 {
		t.Fatalf("branch exits %d\n%s%s", code, out.String(), errb.String())
	}
	lines := map[string]bool{}
	for _, l := range strings.Split(out.String(), "\n") {
		lines[strings.Join(strings.Fields(l), " ")] = true
	}
	for k := 1; k <= 2; k++ {
		line := "t0-r0.b" + strconv.Itoa(k) + " t0-r0 " + strconv.FormatUint(bridgeapi.BranchSeed(11, "t0-r0", k), 10) + " agent.t0"
		if !lines[line] {
			t.Errorf("branch printed %q, without the line %q", out.String(), line)
		}
	}
	out.Reset()
	if code := Main([]string{"branch", "--bridge", srv.URL, "--checkpoint", "c1", "--first", "3", "--output", "json", "t0-r0"}, &out, &errb); code != 0 {
		t.Fatalf("branch --output json exits %d\n%s%s", code, out.String(), errb.String())
	}
	var res bridgeapi.BranchResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil || res.Status != bridgeapi.StatusCompleted || res.Branches[0].K != 3 {
		t.Fatalf("branch --output json printed %q: %+v, %v", out.String(), res, err)
	}
	out.Reset()
	errb.Reset()
	if code := Main([]string{"branch", "--bridge", srv.URL, "t7-r0"}, &out, &errb); code != ExitUsage || !strings.Contains(errb.String(), "t7-r0") {
		t.Fatalf("a branch of an unknown rollout exits %d (want %d) printing %q%q", code, ExitUsage, out.String(), errb.String())
	}
}
