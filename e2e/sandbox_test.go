package e2e

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/participants/owner"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/overlay"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxclient"

	"encoding/json"
)

const run = "e2e"

// runUntilCleanup runs fn until the test ends and checks its error.
func runUntilCleanup(t testing.TB, name string, fn func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- fn(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("%s: %v", name, err)
		}
	})
}

func execOut(t *testing.T, p owner.Execer, id, script string) string {
	t.Helper()
	res, err := p.Exec(t.Context(), id, []string{"sh", "-c", script}, provider.ExecOptions{})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec %q in %s: %v exit %d %s", script, id, err, res.ExitCode, res.Stderr)
	}
	return strings.TrimSpace(string(res.Stdout))
}

// TestCheckpointOfALiveSandbox: the owner seeds a session on the overlay
// provider, with the static sandboxd as the sandbox's first process (its
// own namespaces and cgroup); the agent's side launches a writer through
// sandboxd; the bridge takes a checkpoint of the fleet (owner and
// sandboxd): sandboxd freezes the launch at prepare, the owner snapshots
// the sandbox at commit, the resume thaws it. A fork of the snapshot holds
// the writer's file exactly as it was when frozen (no torn line), the live
// sandbox goes on writing, and the final release and the session's end
// leave no sandbox, snapshot, mount or cgroup behind.
func TestCheckpointOfALiveSandbox(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.75, 5*time.Second)
	bin := build.StaticForTest(t, build.Sandboxd)[build.Sandboxd]
	env := jstest.Start(t)
	p, err := overlay.New(overlay.Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatalf("overlay provider (run the tests as root on Linux with overlayfs and cgroup v2): %v", err)
	}
	// Whatever happens, nothing of the test outlives it (registered first,
	// so it runs after the owner, the bridge and the services stopped).
	t.Cleanup(func() {
		for _, id := range p.Sandboxes() {
			if err := p.Stop(context.Background(), id); err != nil {
				t.Errorf("stop sandbox %s: %v", id, err)
			}
		}
		snaps, _ := p.Snapshots()
		for _, id := range snaps {
			_ = p.DeleteSnapshot(context.Background(), id)
		}
	})
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	spec := func(sessionID string, _ events.Episode, _ json.RawMessage) (provider.Spec, error) {
		return owner.SandboxdSpec(provider.Spec{ID: "sb-" + sessionID, Workdir: "/work"},
			owner.SandboxdConfig{Binary: bin, NATSURL: env.URL, Run: run, Args: []string{"--grace", "1s"}}), nil
	}
	o, err := owner.New(owner.Config{Run: run, Name: "o1", JS: env.JS, Bus: env.Bus, Provider: p, Checkpointing: true,
		LendsSandboxes: true, StateDir: t.TempDir(), TaskKind: owner.TaskFuncs{SpecFn: spec}, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, "owner", o.Run)
	nc, _ := env.Connect(t)
	runUntilCleanup(t, "owner service", func(ctx context.Context) error { return o.Serve(ctx, nc) })
	membertest.WaitRegistered(t, env, run, "owner.o1", nil)
	br, err := bridge.New(bridge.Config{Run: run, Conn: env.Conn, JS: env.JS, Bus: env.Bus, Logger: log, PhaseTimeout: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, "bridge", br.Run)

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	oc, _ := ownerapi.NewClient(env.Conn, run, "o1")
	var info ownerapi.SessionInfo
	poll.Wait(t, 30*time.Second, "the owner's service", func() bool {
		info, err = oc.SeedSession(ctx, ownerapi.SeedRequest{SessionID: "s1", Episode: "r1"})
		var se *jetstream.ServiceError
		if errors.As(err, &se) {
			t.Fatalf("seed: %v", err)
		}
		return err == nil
	})
	sandbox := events.Member("sandbox." + info.SandboxID)
	membertest.WaitRegistered(t, env, run, sandbox, nil)
	dc, _ := sandboxclient.New(env.Conn, run, info.SandboxID)
	if _, err := dc.Launch(ctx, sandboxapi.LaunchRequest{LaunchID: "l1", Episode: "r1", Dir: "/work",
		Command: "i=0; while :; do i=$((i+1)); echo line-$i >> /work/out; sleep 0.01; done"}); err != nil {
		t.Fatalf("launch through sandboxd: %v", err)
	}
	poll.Wait(t, 30*time.Second, "the writer", func() bool { return execOut(t, p, info.SandboxID, "wc -l < /work/out 2>/dev/null || echo 0") != "0" })

	res, err := br.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: "c1"})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("checkpoint: %+v %v", res, err)
	}
	if len(res.Members) != 2 || len(res.Continued) != 1 || res.Continued[0] != "r1" {
		t.Fatalf("checkpoint members %v, continued %v", res.Members, res.Continued)
	}
	entries, err := timeline.Read(ctx, env.JS, run, "c1")
	if err != nil {
		t.Fatal(err)
	}
	// The daemon's prepare ack travels on core NATS; the bridge's record of
	// the prepare counts its pause.
	var pauses []events.PauseTally
	for _, e := range entries {
		if rec, ok := e.Data.(events.PrepareAcked); ok && rec.Part == 1 {
			pauses = append(pauses, rec.Pauses...)
		}
	}
	if len(pauses) != 1 || pauses[0].Count != 1 || pauses[0].Mode != "freeze" || !pauses[0].Still || pauses[0].PIDsMin < 1 {
		t.Fatalf("sandboxd's pause as the prepare's record counts it: %+v", pauses)
	}

	snap := owner.SnapshotID("c1", "s1")
	if _, err := p.Fork(ctx, snap, provider.Spec{ID: "fork1"}); err != nil {
		t.Fatalf("fork of %s: %v", snap, err)
	}
	lines := strings.Split(execOut(t, p, "fork1", "cat /work/out"), "\n")
	for i, l := range lines {
		if l != "line-"+strconv.Itoa(i+1) {
			t.Fatalf("the snapshot's file is torn or out of order at line %d: %q", i+1, l)
		}
	}
	poll.Wait(t, 30*time.Second, "the resumed writer", func() bool {
		n, _ := strconv.Atoi(execOut(t, p, info.SandboxID, "wc -l < /work/out"))
		return n > len(lines)
	})
	if err := p.Stop(ctx, "fork1"); err != nil {
		t.Fatal(err)
	}
	if rel, err := br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
		t.Fatalf("final release: %+v %v", rel, err)
	}
	if err := oc.CloseSession(ctx, "s1"); err != nil {
		t.Fatal(err)
	}
	if sbs := p.Sandboxes(); len(sbs) != 0 {
		t.Errorf("sandboxes left: %v", sbs)
	}
	if snaps, err := p.Snapshots(); err != nil || len(snaps) != 0 {
		t.Errorf("snapshots left: %v %v", snaps, err)
	}
}
