package cli

import (
	"bytes"
	"context"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// TestReleaseThatFailsExitsOne: `stillpoint release` on a fleet where one
// member cannot release prints the failure naming it and exits 1; once
// the member can, the same command exits 0.
func TestReleaseThatFailsExitsOne(t *testing.T) {
	const run, token = "cli-release", "t0ken"
	env := jstest.Start(t)
	hs := membertest.StartMembers(t, env, run, 2, membertest.Options{Episodes: 1})
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
	for _, id := range []string{"c1", "c2"} {
		if res, err := b.Checkpoint(t.Context(), bridgeapi.CheckpointRequest{ID: id}); err != nil || res.Status != bridgeapi.StatusCommitted {
			t.Fatalf("checkpoint %s: %+v %v", id, res, err)
		}
	}

	hs[1].Participant.FailRelease(errors.New("snapshot store unreachable"))
	var out, errb bytes.Buffer
	if code := Main([]string{"release", "--bridge", srv.URL, "--keep", "c2"}, &out, &errb); code != ExitFailure {
		t.Fatalf("a failed release exits %d, want %d\n%s%s", code, ExitFailure, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), ": failed") || !strings.Contains(out.String(), string(hs[1].Name)) ||
		!strings.Contains(out.String(), "snapshot store unreachable") {
		t.Errorf("the failed release printed %q: it does not say it failed and who failed it", out.String())
	}

	hs[1].Participant.FailRelease(nil)
	out.Reset()
	if code := Main([]string{"release", "--bridge", srv.URL, "--keep", "c2"}, &out, &errb); code != 0 {
		t.Fatalf("the release once the member is fixed exits %d\n%s%s", code, out.String(), errb.String())
	}
	if !strings.Contains(out.String(), ": completed") {
		t.Errorf("the release printed %q", out.String())
	}
}
