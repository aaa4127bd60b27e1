package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"syscall"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
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
)

// TestDaemonKilledUnderAPrepare: two sessions on the overlay provider, each
// with the static sandboxd as its sandbox's first process; one daemon is
// stopped (SIGSTOP), so that it cannot ack, and killed (SIGKILL) once the
// bridge published a prepare that addresses it. Its owner sees the
// sandbox's init exit and deletes the daemon's heartbeat; the bridge's
// members view sees the delete and leaves the daemon out, and the checkpoint
// commits with the owner and the other daemon, long before its 60 s
// deadline, its prepare's record naming the dead daemon missing. Without
// the delete the heartbeat would live on for the sandbox TTL (2 minutes)
// and only the bridge's asking would find the daemon gone.
func TestDaemonKilledUnderAPrepare(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.75, 5*time.Second)
	bin := build.StaticForTest(t, build.Sandboxd)[build.Sandboxd]
	env := jstest.Start(t)
	p, err := overlay.New(overlay.Config{StateDir: t.TempDir()})
	if err != nil {
		t.Fatalf("overlay provider (run the tests as root on Linux with overlayfs and cgroup v2): %v", err)
	}
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
	const deadline = 60 * time.Second
	br, err := bridge.New(bridge.Config{Run: run, Conn: env.Conn, JS: env.JS, Bus: env.Bus, Logger: log, PhaseTimeout: deadline})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, "bridge", br.Run)

	ctx, cancel := context.WithTimeout(t.Context(), 2*deadline)
	defer cancel()
	oc, _ := ownerapi.NewClient(env.Conn, run, "o1")
	daemons := map[string]events.Member{}
	for _, s := range []string{"dies", "lives"} {
		var info ownerapi.SessionInfo
		poll.Wait(t, 30*time.Second, "the owner's service", func() bool {
			info, err = oc.SeedSession(ctx, ownerapi.SeedRequest{SessionID: s, Episode: "r-" + s})
			var se *jetstream.ServiceError
			if errors.As(err, &se) {
				t.Fatalf("seed %s: %v", s, err)
			}
			return err == nil
		})
		daemons[s] = events.Member("sandbox." + info.SandboxID)
		membertest.WaitRegistered(t, env, run, daemons[s], nil)
	}
	dies, lives := daemons["dies"], daemons["lives"]
	sess, ok := o.Session("dies")
	if !ok || sess.Sandbox.InitPID <= 0 {
		t.Fatalf("session dies: %+v %v", sess, ok)
	}
	pid := sess.Sandbox.InitPID
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}

	type result struct {
		res *bridgeapi.CheckpointResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := br.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: "c1"})
		done <- result{res, err}
	}()
	poll.Wait(t, 30*time.Second, "the prepare on the bus", func() bool {
		entries, err := timeline.Read(ctx, env.JS, run, "c1")
		if err != nil {
			t.Fatal(err)
		}
		return slices.ContainsFunc(entries, func(e timeline.Entry) bool { _, ok := e.Data.(events.Prepare); return ok })
	})
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	var r result
	select {
	case r = <-done:
	case <-ctx.Done():
		t.Fatal("the checkpoint never ended")
	}
	took := time.Since(killed)
	if r.err != nil || r.res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("checkpoint %v after the kill: %+v %v, want committed without the dead daemon", took, r.res, r.err)
	}
	t.Logf("the checkpoint committed %v after the daemon's kill (prepare %d ms, deadline %v)", took.Round(time.Millisecond), r.res.PrepareMS, deadline)
	if want := []events.Member{"owner.o1", lives}; !slices.Equal(r.res.Members, want) {
		t.Errorf("the checkpoint's members %v, want %v (the dead daemon %s left out)", r.res.Members, want, dies)
	}

	// The prepare addressed both daemons and names the dead one missing.
	entries, err := timeline.Read(ctx, env.JS, run, "c1")
	if err != nil {
		t.Fatal(err)
	}
	var recs []events.PrepareAcked
	for _, e := range entries {
		if rec, ok := e.Data.(events.PrepareAcked); ok && rec.Part == 1 {
			recs = append(recs, rec)
		}
	}
	if len(recs) != 1 || recs[0].Expected != 2 || recs[0].Answered != 1 || !slices.Equal(recs[0].Missing, []events.Member{dies}) {
		t.Fatalf("the prepare's record %+v, want 2 daemons addressed and %s missing", recs, dies)
	}
	// What left it out is its departure, the owner's delete of its
	// heartbeat, not its asking: the heartbeat is gone.
	if _, err := env.Bus.Daemons.Get(ctx, events.MemberKey(run, dies)); !errors.Is(err, natsjs.ErrKeyNotFound) {
		t.Errorf("the dead daemon's heartbeat: %v, want it deleted by its owner", err)
	}
	if _, err := env.Bus.Daemons.Get(ctx, events.MemberKey(run, lives)); err != nil {
		t.Errorf("the live daemon's heartbeat: %v", err)
	}

	if rel, err := br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
		t.Fatalf("final release: %+v %v", rel, err)
	}
	for _, s := range []string{"dies", "lives"} {
		if err := oc.CloseSession(ctx, s); err != nil {
			t.Fatalf("close %s: %v", s, err)
		}
	}
}
