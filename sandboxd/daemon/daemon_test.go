package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/daemon"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxclient"
)

func TestMain(m *testing.M) {
	leak.VerifyTestMain(m, jstest.LeakOptions()...)
}

const run = "run1"

// id makes a launch id unique on the host: launches of every test process
// share the supervisor's default cgroup subtree.
func id(s string) string { return s + "-" + strconv.Itoa(os.Getpid()) }

// start runs a daemon for sandbox sb1 until the test ends.
func start(t *testing.T, env *jstest.Env) (*daemon.Daemon, *sandboxclient.Client) {
	return startWithGrace(t, env, 0)
}

func startWithGrace(t *testing.T, env *jstest.Env, grace time.Duration) (*daemon.Daemon, *sandboxclient.Client) {
	t.Helper()
	nc, js := env.Connect(t)
	bus, err := jetstream.Open(t.Context(), js)
	if err != nil {
		t.Fatal(err)
	}
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	sup, err := sandboxd.New(sandboxd.Config{StateDir: t.TempDir(), Logger: log, Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(daemon.Config{Run: run, SandboxID: "sb1", JS: js, Bus: bus, Supervisor: sup, Logger: log, Grace: grace})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("daemon Run: %v", err)
		}
	})
	membertest.WaitRegistered(t, env, run, d.Name(), nil)
	c, err := sandboxclient.New(nc, run, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	return d, c
}

func size(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// PROTOCOL §6 through the bus: prepare pauses the launch (its ack carries
// the pause report) and nothing of it runs or writes while paused; resume
// continues exactly it (the ack carries that too); a launch asked during
// the checkpoint is refused; a retire stops the launch of the attempt.
func TestPauseAndContinueThroughTheBus(t *testing.T) {
	env := jstest.Start(t)
	d, c := start(t, env)
	bridge := membertest.NewBridge(t, env, run)
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := c.Launch(ctx, sandboxapi.LaunchRequest{LaunchID: id("l1"), Episode: "r1", Dir: dir,
		Command: "while :; do echo x >> out; sleep 0.02; done"}); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 10*time.Second, "the launch to write", func() bool { return size(t, out) > 0 })

	seq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 10*time.Second, d.Name())})
	pa := bridge.Ack(seq, events.PhasePrepare, d.Name()).(events.PrepareAck)
	if !pa.Ready || pa.Pause == nil || pa.Pause.PIDCount < 1 || pa.Pause.PauseSeq != 1 || pa.Pause.Identity == "" {
		t.Fatalf("prepare ack: ready %v, pause %+v", pa.Ready, pa.Pause)
	}
	t.Logf("paused in mode %s: %d processes in %.1f ms", pa.Pause.Mode, pa.Pause.PIDCount, pa.Pause.TookMS)
	before := size(t, out)
	poll.Holds(t, 300*time.Millisecond, func() error {
		if s := size(t, out); s != before {
			return fmt.Errorf("the paused launch wrote: %d -> %d bytes", before, s)
		}
		return nil
	})
	_, err := c.Launch(ctx, sandboxapi.LaunchRequest{LaunchID: id("l2"), Command: "true"})
	var se *sandboxclient.ServiceError
	if !errors.As(err, &se) || se.Code != "admission_closed" || se.Status != 409 {
		t.Fatalf("launch during a checkpoint: %v, want admission_closed", err)
	}

	seq = bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c1", 10*time.Second, d.Name())})
	ra := bridge.Ack(seq, events.PhaseResume, d.Name()).(events.ResumeAck)
	if ra.Pause == nil || ra.Pause.PauseSeq != 1 {
		t.Fatalf("resume ack pause %+v", ra.Pause)
	}
	poll.Wait(t, 10*time.Second, "the launch to write again", func() bool { return size(t, out) > before })

	seq = bridge.Publish(events.Retire{PhaseHeader: bridge.Header("retire-1", 10*time.Second, d.Name()),
		Episodes: []events.Episode{{Rollout: "r1"}}})
	if a := bridge.Ack(seq, events.PhaseRetire, d.Name()); !a.Header().OK {
		t.Fatalf("retire ack %+v", a.Header())
	}
	rc, err := c.Receipt(ctx, id("l1"), true)
	if err != nil || rc.Outcome != sandboxapi.OutcomeInterrupted {
		t.Fatalf("receipt after the retire: %+v %v", rc, err)
	}
	if _, err := c.Launch(ctx, sandboxapi.LaunchRequest{LaunchID: id("l3"), Episode: "r1", Command: "true"}); !errors.As(err, &se) || se.Code != "stale_attempt" {
		t.Fatalf("launch of a retired attempt: %v, want stale_attempt", err)
	}
}

// Bad requests are refused naming what is wrong.
func TestServiceRefusesBadRequests(t *testing.T) {
	env := jstest.Start(t)
	_, c := start(t, env)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var se *sandboxclient.ServiceError
	for _, r := range []sandboxapi.LaunchRequest{
		{LaunchID: "../x", Command: "true"},
		{LaunchID: id("ok")},
		{LaunchID: id("ok2"), Command: "true", Episode: "r1-a0"},
		{LaunchID: id("ok3"), Command: "true", Mode: "sleepy"},
		{LaunchID: id("ok4"), Command: "true", Episode: "r1", RelayEdits: []string{"no-such-edit"}},
		{LaunchID: id("ok5"), Command: "true", RelayEdits: []string{"no-such-edit"}},
	} {
		if _, err := c.Launch(ctx, r); !errors.As(err, &se) || se.Status/100 != 4 {
			t.Errorf("launch %+v: %v, want a 4xx", r, err)
		} else if r.RelayEdits != nil && (se.Code != "bad_request" || !strings.Contains(se.Error(), `"no-such-edit"`)) {
			t.Errorf("launch with an unknown relay edit: %v, want bad_request naming it", err)
		}
	}
	if _, err := c.Status(ctx, "nope"); !errors.As(err, &se) || se.Code != "unknown_launch" {
		t.Errorf("status of an unknown launch: %v", err)
	}
}

// PROTOCOL §5 lease: a daemon whose bridge never resumes it continues its
// paused launch by itself once the lease (deadline + grace) runs out.
func TestLeaseExpiryContinuesThePausedLaunch(t *testing.T) {
	env := jstest.Start(t)
	d, c := startWithGrace(t, env, 300*time.Millisecond)
	bridge := membertest.NewBridge(t, env, run)
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := c.Launch(ctx, sandboxapi.LaunchRequest{LaunchID: id("l1"), Dir: dir, Command: "while :; do echo x >> out; sleep 0.02; done"}); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 10*time.Second, "the launch to write", func() bool { return size(t, out) > 0 })
	seq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 700*time.Millisecond, d.Name())})
	if pa := bridge.Ack(seq, events.PhasePrepare, d.Name()).(events.PrepareAck); !pa.Ready || pa.Pause == nil {
		t.Fatalf("prepare ack %+v", pa)
	}
	paused := size(t, out)
	rec, err := c.Status(ctx, id("l1"))
	if err != nil || rec.State != sandboxapi.StatePaused {
		t.Fatalf("status while paused: %+v %v", rec.State, err)
	}
	// No resume comes: the lease runs out after about 1 s.
	poll.Wait(t, 10*time.Second, "the lease to continue the launch", func() bool { return size(t, out) > paused })
	poll.Wait(t, 10*time.Second, "the launch to be running again", func() bool {
		rec, err := c.Status(ctx, id("l1"))
		return err == nil && rec.State == sandboxapi.StateRunning
	})
}

// The agent's pauses and the checkpoint's do not undo each other: a launch
// the agent paused stays paused through a checkpoint's resume, and the
// agent cannot continue a launch a checkpoint holds paused.
func TestAgentAndCheckpointPausesStayApart(t *testing.T) {
	env := jstest.Start(t)
	d, c := start(t, env)
	bridge := membertest.NewBridge(t, env, run)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, l := range []string{"mine", "theirs"} {
		if _, err := c.Launch(ctx, sandboxapi.LaunchRequest{LaunchID: id(l), Command: "sleep 30"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Pause(ctx, id("mine"), ""); err != nil {
		t.Fatal(err)
	}
	seq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 10*time.Second, d.Name())})
	if pa := bridge.Ack(seq, events.PhasePrepare, d.Name()).(events.PrepareAck); !pa.Ready {
		t.Fatalf("prepare ack %+v", pa)
	}
	var se *sandboxclient.ServiceError
	if _, err := c.Continue(ctx, id("theirs")); !errors.As(err, &se) || se.Code != "admission_closed" {
		t.Fatalf("the agent continued a launch the checkpoint holds: %v", err)
	}
	seq = bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c1", 10*time.Second, d.Name())})
	bridge.Ack(seq, events.PhaseResume, d.Name())
	if rec, err := c.Status(ctx, id("theirs")); err != nil || rec.State != sandboxapi.StateRunning {
		t.Fatalf("the checkpoint's launch after the resume: %v %v", rec.State, err)
	}
	if rec, err := c.Status(ctx, id("mine")); err != nil || rec.State != sandboxapi.StatePaused {
		t.Fatalf("the agent's paused launch after the checkpoint's resume: %v %v", rec.State, err)
	}
	for _, l := range []string{"mine", "theirs"} {
		if _, err := c.Stop(ctx, id(l), true); err != nil {
			t.Fatal(err)
		}
	}
}

// Run that cannot serve returns its error only once the supervisor it
// started has stopped: the supervisor then takes no launch.
func TestRunThatCannotServeStopsItsSupervisor(t *testing.T) {
	env := jstest.Start(t)
	nc, js := env.Connect(t)
	bus, err := jetstream.Open(t.Context(), js)
	if err != nil {
		t.Fatal(err)
	}
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	sup, err := sandboxd.New(sandboxd.Config{StateDir: t.TempDir(), Logger: log, Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d, err := daemon.New(daemon.Config{Run: run, SandboxID: "sb1", JS: js, Bus: bus, Supervisor: sup, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	nc.Close() // the service cannot be added
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := d.Run(ctx); err == nil {
		t.Fatal("Run on a closed connection returned nil")
	}
	rec, err := sup.Launch(ctx, sandboxd.Spec{ID: id("after"), Command: "true"})
	if !errors.Is(err, sandboxd.ErrClosed) {
		t.Fatalf("launch after Run returned: %+v %v, want ErrClosed: the supervisor still runs", rec.State, err)
	}
}

// PROTOCOL §7, invariant 6: a launch refused because its id is taken
// leaves the launch that has it as it was: a checkpoint still pauses it
// (the refused one asked for none), and a retire of its episode still
// stops it (the refused one named another).
func TestRefusedLaunchLeavesTheLaunchThatHasItsID(t *testing.T) {
	env := jstest.Start(t)
	d, c := start(t, env)
	bridge := membertest.NewBridge(t, env, run)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := c.Launch(ctx, sandboxapi.LaunchRequest{LaunchID: id("l1"), Episode: "r1", Command: "sleep 600"}); err != nil {
		t.Fatal(err)
	}
	var se *sandboxclient.ServiceError
	if _, err := c.Launch(ctx, sandboxapi.LaunchRequest{LaunchID: id("l1"), Episode: "r2", NoPause: true, Command: "true"}); !errors.As(err, &se) || se.Code != sandboxapi.CodeLaunchExists {
		t.Fatalf("a second launch of the same id: %v, want launch_exists", err)
	}
	seq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 10*time.Second, d.Name())})
	if pa := bridge.Ack(seq, events.PhasePrepare, d.Name()).(events.PrepareAck); !pa.Ready || pa.Pause == nil || pa.Pause.PIDCount < 1 {
		t.Fatalf("prepare ack: ready %v, pause %+v; want the launch paused", pa.Ready, pa.Pause)
	}
	bridge.Ack(bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c1", 10*time.Second, d.Name())}), events.PhaseResume, d.Name())
	seq = bridge.Publish(events.Retire{PhaseHeader: bridge.Header("retire-1", 10*time.Second, d.Name()),
		Episodes: []events.Episode{{Rollout: "r1"}}})
	if a := bridge.Ack(seq, events.PhaseRetire, d.Name()); !a.Header().OK {
		t.Fatalf("retire ack %+v", a.Header())
	}
	if rec, err := c.Status(ctx, id("l1")); err != nil || rec.State != sandboxapi.StateEnded {
		t.Fatalf("the launch of retired r1: %v %v, want ended", rec.State, err)
	}
}
