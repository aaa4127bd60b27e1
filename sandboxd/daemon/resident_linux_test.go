package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/daemon"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxclient"
)

// resident runs a Resident on a supervisor of dir until the test ends.
func resident(t *testing.T, dir string) *daemon.Resident {
	t.Helper()
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	sup, err := sandboxd.New(sandboxd.Config{StateDir: dir, Logger: log, Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r, err := daemon.NewResident(daemon.ResidentConfig{Supervisor: sup, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Resident.Run: %v", err)
		}
	})
	return r
}

func join(t *testing.T, env *jstest.Env, r *daemon.Resident, sandbox string, epoch uint64) events.Member {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	m, err := r.Join(ctx, daemon.Identity{Run: run, SandboxID: sandbox, Conn: env.ConnConfig("sandboxd-" + sandbox), AdoptEpoch: epoch})
	if err != nil {
		t.Fatalf("join as %s: %v", sandbox, err)
	}
	return m
}

func info(t *testing.T, env *jstest.Env, m events.Member) (events.MemberInfo, uint64) {
	t.Helper()
	e, err := env.Bus.Heartbeats(m.Kind()).Get(t.Context(), events.MemberKey(run, m))
	if err != nil {
		t.Fatalf("heartbeat of %s: %v", m, err)
	}
	var mi events.MemberInfo
	if err := json.Unmarshal(e.Value(), &mi); err != nil {
		t.Fatal(err)
	}
	return mi, e.Revision()
}

func launch(t *testing.T, env *jstest.Env, sandbox, launchID, dir string) (*sandboxclient.Client, sandboxapi.Record) {
	t.Helper()
	nc, _ := env.Connect(t)
	c, err := sandboxclient.New(nc, run, sandbox)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := c.Launch(t.Context(), sandboxapi.LaunchRequest{LaunchID: launchID, Episode: launchID, Dir: dir,
		Command: "while :; do echo x >> out; sleep 0.02; done"})
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out")
	poll.Wait(t, 10*time.Second, "launch "+launchID+" to write", func() bool { return size(t, out) > 0 })
	return c, rec
}

// TestReidentifyAFork plays two forks of one memory snapshot in one host
// namespace (docs/MICROVM.md, Re-identification). Fork 1 is the snapshot's
// own process re-identified in place: same supervisor, its launch goes on
// with the same pid under the new member. Fork 2 is a second daemon whose
// state directory is a copy of the snapshot's daemon files (its position
// file names the old member); it runs a launch of its own (processes cannot
// be copied in one namespace). Both join with their own ids (instance,
// inbox) in the restore's epoch, both pause and continue their launches in
// a checkpoint of that epoch, the old member is neither heard from again
// nor removed (its name belongs to the original sandbox, which may still
// run), and neither fork touches the other's member key.
func TestReidentifyAFork(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, run)
	dirA := t.TempDir()
	ra := resident(t, dirA)
	orig := join(t, env, ra, "orig", 0)
	work := t.TempDir()
	cOrig, l1 := launch(t, env, "orig", id("l1"), work)
	// The original serves a checkpoint, so that its position file holds a
	// stream sequence.
	seq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 10*time.Second, orig)})
	if a := bridge.Ack(seq, events.PhasePrepare, orig).(events.PrepareAck); !a.Ready {
		t.Fatalf("prepare of the original: %+v", a)
	}
	bridge.Ack(bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c1", 10*time.Second, orig)}), events.PhaseResume, orig)
	origInfo, origRev := info(t, env, orig)
	if !origInfo.Served || origInfo.Epoch != 0 {
		t.Fatalf("original: %+v", origInfo)
	}

	// The snapshot: the daemon's files as they are now.
	dirB := t.TempDir()
	for _, f := range []string{"position.json", "episodes.json"} {
		b, err := os.ReadFile(filepath.Join(dirA, f))
		if err != nil {
			t.Fatalf("the snapshot's %s: %v", f, err)
		}
		if err := os.WriteFile(filepath.Join(dirB, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	// The restore opens epoch 1 and forks twice.
	bridge.Epoch = 1
	f1 := join(t, env, ra, "f1", 1) // in place
	rb := resident(t, dirB)
	f2 := join(t, env, rb, "f2", 1)

	i1, _ := info(t, env, f1)
	i2, rev2 := info(t, env, f2)
	for _, i := range []events.MemberInfo{i1, i2} {
		if i.Epoch != 1 || !i.Served {
			t.Errorf("%s: epoch %d served %v; want the restore's epoch 1, served", i.Member, i.Epoch, i.Served)
		}
	}
	if i1.Instance == i2.Instance || i1.Instance == origInfo.Instance || i2.Instance == origInfo.Instance {
		t.Errorf("instances repeat: orig %s, f1 %s, f2 %s", origInfo.Instance, i1.Instance, i2.Instance)
	}
	if i1.PID != origInfo.PID {
		t.Errorf("fork 1 is not the same process: pid %d, was %d", i1.PID, origInfo.PID)
	}

	// The launch of fork 1 goes on, same pid, served under the new name;
	// the old name's service is gone.
	c1, err := sandboxclient.New(env.Conn, run, "f1")
	if err != nil {
		t.Fatal(err)
	}
	st, err := c1.Status(t.Context(), id("l1"))
	if err != nil || st.PID != l1.PID || st.State != sandboxapi.StateRunning {
		t.Fatalf("fork 1's launch: %+v %v; want running pid %d", st, err, l1.PID)
	}
	short, cancel := context.WithTimeout(t.Context(), time.Second)
	if _, err := cOrig.Status(short, id("l1")); err == nil {
		t.Error("the old member's service still answers after the re-identification")
	}
	cancel()
	_, l2 := launch(t, env, "f2", id("l2"), t.TempDir())

	// Both pause and continue in a checkpoint of the new epoch.
	seq = bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c2", 10*time.Second, f1, f2)})
	for _, m := range []events.Member{f1, f2} {
		a := bridge.Ack(seq, events.PhasePrepare, m).(events.PrepareAck)
		if !a.Ready || a.Epoch != 1 || a.Pause == nil || a.Pause.PIDCount < 1 {
			t.Fatalf("prepare of %s: ready %v epoch %d pause %+v", m, a.Ready, a.Epoch, a.Pause)
		}
	}
	if st, _ := c1.Status(t.Context(), id("l1")); st.State != sandboxapi.StatePaused || st.PID != l1.PID {
		t.Fatalf("fork 1's launch at the prepare: %+v", st)
	}
	seq = bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c2", 10*time.Second, f1, f2)})
	for _, m := range []events.Member{f1, f2} {
		if a := bridge.Ack(seq, events.PhaseResume, m).(events.ResumeAck); a.Pause == nil {
			t.Fatalf("resume of %s continued nothing", m)
		}
	}
	poll.Wait(t, 10*time.Second, "fork 1's launch to write again", func() bool {
		st, err := c1.Status(t.Context(), id("l1"))
		return err == nil && st.State == sandboxapi.StateRunning
	})

	// Fork 2 reads from where it joined, and keeps its own position.
	b, err := os.ReadFile(filepath.Join(dirB, "position.json"))
	if err != nil {
		t.Fatal(err)
	}
	var pos struct{ Member string }
	if err := json.Unmarshal(b, &pos); err != nil || pos.Member != string(f2) {
		t.Fatalf("fork 2's position file: %s %v", b, err)
	}

	// The old member: its key as the original left it, and no leave of it
	// on the stream (a sandbox daemon announces no membership at all:
	// PROTOCOL §3).
	if _, rev := info(t, env, orig); rev != origRev {
		t.Errorf("the original's heartbeat key moved (%d -> %d) after its snapshot was re-identified", origRev, rev)
	}
	if m, err := env.Bus.Stream.GetLastMsgForSubject(t.Context(), events.MemberSubject(run, orig)); !errors.Is(err, natsjs.ErrMsgNotFound) {
		t.Errorf("a membership event of %s on the stream (%v, %v), want none", orig, m, err)
	}
	// Neither fork wrote the other's key.
	if i, rev := info(t, env, f2); i.Instance != i2.Instance || (rev != rev2 && i.PID != i2.PID) {
		t.Errorf("fork 2's key was written by another: %+v", i)
	}
	_ = l2
}

// TestResidentSupersededStopsItsLaunches: a resident daemon that a newer
// epoch supersedes stops its launches, as a daemon's Run does (PROTOCOL §5,
// Epochs fence zombies), and says so; the supervisor stays for a later
// identity.
func TestResidentSupersededStopsItsLaunches(t *testing.T) {
	env := jstest.Start(t)
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	sup, err := sandboxd.New(sandboxd.Config{StateDir: t.TempDir(), Logger: log, Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan error, 1)
	r, err := daemon.NewResident(daemon.ResidentConfig{Supervisor: sup, Logger: log,
		Stopped: func(_ events.Member, err error) { stopped <- err }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Resident.Run: %v", err)
		}
	}()
	m := join(t, env, r, "s1", 1)
	c, _ := launch(t, env, "s1", id("l1"), t.TempDir())
	bridge := membertest.NewBridge(t, env, run)
	bridge.Epoch = 2
	bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c9", 10*time.Second, m)})
	select {
	case err := <-stopped:
		if !errors.Is(err, member.ErrSuperseded) {
			t.Fatalf("stopped with %v, want ErrSuperseded", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the superseded daemon did not stop")
	}
	rc, err := sup.Receipt(id("l1"))
	if err != nil || rc.ExitCode == 0 {
		t.Fatalf("the superseded daemon's launch: %+v %v, want it stopped", rc, err)
	}
	if _, ok := r.Member(); ok {
		t.Error("Member() still names the superseded daemon")
	}
	_ = c
}
