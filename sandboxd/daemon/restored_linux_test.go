package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/daemon"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxclient"
)

// residentWithRelay runs a Resident whose daemons share a model relay
// (pointed at upstream) until the test ends.
func residentWithRelay(t *testing.T, dir, upstream string) (*daemon.Resident, *relay.Relay) {
	t.Helper()
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)
	sup, err := sandboxd.New(sandboxd.Config{StateDir: dir, Logger: log, Grace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rl, err := relay.New(relay.Config{Upstream: upstream, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r, err := daemon.NewResident(daemon.ResidentConfig{Supervisor: sup, Relay: rl, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done, rdone := make(chan error, 1), make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	go func() { rdone <- rl.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Resident.Run: %v", err)
		}
		if err := <-rdone; err != nil {
			t.Errorf("relay Serve: %v", err)
		}
	})
	poll.Wait(t, 5*time.Second, "the relay serving", func() bool { return rl.URL() != "" })
	return r, rl
}

// modelServer answers with answer and counts the calls.
type modelServer struct {
	*httptest.Server
	calls chan string
}

func newModelServer(t *testing.T, answer http.HandlerFunc) *modelServer {
	t.Helper()
	m := &modelServer{calls: make(chan string, 8)}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		m.calls <- string(b)
		answer(w, r)
	}))
	t.Cleanup(m.Close)
	return m
}

func code(err error) string {
	var se *sandboxclient.ServiceError
	if errors.As(err, &se) {
		return se.Code
	}
	return fmt.Sprint(err)
}

// TestTakeOverARestoredLaunch plays the restore of a snapshot that kept
// processes (PROTOCOL §6): a checkpoint holds a launch and its model call
// in flight, the sandbox is re-identified in place as a fork in the
// restore's epoch (no resume ever comes for that checkpoint), and the new
// agent asks whether the launch is still held, re-points the relay at a new
// model server, and resumes the pause: the cut call reaches the new server
// once, the harness gets its answer, the launch runs on with the same pid.
// A launch that ended while held is collected. Wrong identities, pauses
// and generations are refused with their codes.
func TestTakeOverARestoredLaunch(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, run)
	gone := newModelServer(t, func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	fresh := newModelServer(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{"answer":"new"}`) })
	res, rl := residentWithRelay(t, t.TempDir(), gone.URL)
	orig := join(t, env, res, "orig", 0)
	nc, _ := env.Connect(t)
	c, err := sandboxclient.New(nc, run, "orig")
	if err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	rec, err := c.Launch(t.Context(), sandboxapi.LaunchRequest{LaunchID: id("held"), Episode: id("held"), Dir: work,
		Command: "while :; do echo x >> out; sleep 0.02; done", Mode: "hold", Freeze: true})
	if err != nil {
		t.Fatal(err)
	}
	ended, err := c.Launch(t.Context(), sandboxapi.LaunchRequest{LaunchID: id("ends"), Episode: id("ends"), Dir: work,
		Command: "while [ ! -e go ]; do sleep 0.01; done", Mode: "hold"})
	if err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 10*time.Second, "the launch to write", func() bool { return size(t, filepath.Join(work, "out")) > 0 })

	// The harness's model call, in flight at the old server.
	cutBody := `{"messages":[{"role":"user","content":"go on"}]}`
	answer := make(chan string, 1)
	go func() {
		resp, err := http.Post(rl.URL()+"/v1/chat/completions", "application/json", strings.NewReader(cutBody))
		if err != nil {
			answer <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answer <- string(b)
	}()
	<-gone.calls

	seq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 10*time.Second, orig)})
	ack := bridge.Ack(seq, events.PhasePrepare, orig).(events.PrepareAck)
	if !ack.Ready || ack.Pause == nil || ack.Pause.Mode != "hold" || ack.Pause.PauseSeq != 1 || ack.Pause.Identity == "" {
		t.Fatalf("prepare ack: %+v pause %+v", ack, ack.Pause)
	}
	if !rl.Holding() {
		t.Fatal("the prepare did not hold the relay")
	}
	identity, err := sandboxapi.ParseIdentity(ack.Pause.Identity)
	if err != nil {
		t.Fatal(err)
	}
	// The launch that ends does so while held (a hold stops nothing).
	if err := os.WriteFile(filepath.Join(work, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}

	// The crash and the restore: the same process, a new identity on the
	// bus in epoch 1; the checkpoint's resume never comes.
	bridge.Epoch = 1
	join(t, env, res, "f1", 1)
	c1, err := sandboxclient.New(nc, run, "f1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	held, err := c1.Held(ctx, id("held"), 1, identity)
	if err != nil || held.Verdict != sandboxapi.VerdictHeld || held.Record == nil || held.Record.PID != rec.PID ||
		!held.Relay.Up || !held.Relay.Holding || held.Relay.Calls.InFlight != 1 || held.Uptime <= 0 {
		t.Fatalf("Held: %+v, %v", held, err)
	}
	for _, q := range []struct {
		seq  int
		id   sandboxapi.Identity
		want sandboxapi.Verdict
	}{
		{2, identity, sandboxapi.VerdictNotHolding},
		{1, sandboxapi.Identity{PID: identity.PID, Start: identity.Start + 1}, sandboxapi.VerdictIdentityChanged},
	} {
		if a, err := c1.Held(ctx, id("held"), q.seq, q.id); err != nil || a.Verdict != q.want {
			t.Errorf("Held(pause %d, %s) = %v (%s), %v; want %v", q.seq, q.id, a.Verdict, a.Reason, err, q.want)
		}
	}
	if a, err := c1.Held(ctx, id("nothing"), 1, identity); err != nil || a.Verdict != sandboxapi.VerdictUnknownLaunch {
		t.Errorf("Held(unknown) = %+v, %v", a, err)
	}
	if _, err := c1.Resume(ctx, id("held"), 2, identity); code(err) != sandboxapi.CodeNotHolding {
		t.Errorf("Resume of pause 2: %v, want %s", err, sandboxapi.CodeNotHolding)
	}

	st, err := c1.Repoint(ctx, fresh.URL, 1)
	if err != nil || st.Generation != 1 || st.Upstream != fresh.URL {
		t.Fatalf("Repoint: %+v, %v", st, err)
	}
	if _, err := c1.Repoint(ctx, fresh.URL, 1); code(err) != sandboxapi.CodeStaleGeneration {
		t.Errorf("second Repoint at generation 1: %v, want %s", err, sandboxapi.CodeStaleGeneration)
	}
	select {
	case a := <-answer:
		t.Fatalf("the harness got %q before the resume", a)
	default:
	}
	rep, err := c1.Resume(ctx, id("held"), 1, identity)
	if err != nil || rep.State != sandboxapi.StateRunning || rep.PauseSeq != 1 {
		t.Fatalf("Resume: %+v, %v", rep, err)
	}
	if got := <-fresh.calls; got != cutBody {
		t.Fatalf("the new model server got %q, want the cut call", got)
	}
	if a := <-answer; a != `{"answer":"new"}` {
		t.Fatalf("the harness got %q", a)
	}
	if rl.Holding() {
		t.Error("the relay still holds after the take-over")
	}
	n := size(t, filepath.Join(work, "out"))
	poll.Wait(t, 10*time.Second, "the launch to write on", func() bool { return size(t, filepath.Join(work, "out")) > n })
	if st, _ := c1.Status(ctx, id("held")); st.PID != rec.PID || st.State != sandboxapi.StateRunning {
		t.Fatalf("the launch after the take-over: %+v", st)
	}
	if _, err := c1.Collect(ctx, id("held"), identity); code(err) != sandboxapi.CodeNotHolding {
		t.Errorf("Collect of a running launch: %v, want %s", err, sandboxapi.CodeNotHolding)
	}

	// The launch that ended while held is collected.
	poll.Wait(t, 10*time.Second, "the other launch to end", func() bool {
		a, err := c1.Held(ctx, ended.ID, 1, identity)
		return err == nil && a.Verdict == sandboxapi.VerdictEnded
	})
	if _, err := c1.Collect(ctx, ended.ID, sandboxapi.Identity{PID: 1, Start: 1}); code(err) != sandboxapi.CodeIdentityChanged {
		t.Errorf("Collect under another identity: %v", err)
	}
	rc, err := c1.Collect(ctx, ended.ID, identity)
	if err != nil || rc.Outcome != sandboxapi.OutcomeFinished || rc.ExitCode != 0 {
		t.Fatalf("Collect: %+v, %v", rc, err)
	}
	if _, err := c1.Stop(ctx, id("held"), true); err != nil {
		t.Fatal(err)
	}
}

// A daemon without a relay says so.
func TestRelayEndpointsWithoutARelay(t *testing.T) {
	env := jstest.Start(t)
	_, c := start(t, env)
	if _, err := c.RelayStatus(t.Context()); code(err) != sandboxapi.CodeNoRelay {
		t.Errorf("RelayStatus: %v, want %s", err, sandboxapi.CodeNoRelay)
	}
	if _, err := c.Repoint(t.Context(), "http://127.0.0.1:1", 1); code(err) != sandboxapi.CodeNoRelay {
		t.Errorf("Repoint: %v, want %s", err, sandboxapi.CodeNoRelay)
	}
}

// The identity failpoint makes the restore endpoints see another
// supervisor for the launches it names, and only for them.
func TestIdentityFailpoint(t *testing.T) {
	env := jstest.Start(t)
	res := resident(t, t.TempDir())
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := res.Join(ctx, daemon.Identity{Run: run, SandboxID: "fp", Conn: env.ConnConfig("sandboxd-fp"),
		Failpoints: daemon.Failpoints{IdentityPrefix: "fp-"}}); err != nil {
		t.Fatal(err)
	}
	work := t.TempDir()
	c, rec := launch(t, env, "fp", "fp-"+id("a"), work)
	_, other := launch(t, env, "fp", id("b"), t.TempDir())
	for _, l := range []struct {
		id   string
		want sandboxapi.Verdict
	}{{rec.ID, sandboxapi.VerdictIdentityChanged}, {other.ID, sandboxapi.VerdictNotHolding}} {
		a, err := c.Held(t.Context(), l.id, 1, rec.Supervisor)
		if err != nil || a.Verdict != l.want {
			t.Errorf("Held(%s) = %v (%s), %v; want %v", l.id, a.Verdict, a.Reason, err, l.want)
		}
	}
}

// A checkpoint's resume releases the relay its prepare held; a launch asked
// while a relay is left holding with admission open (a restore's hold whose
// launch was abandoned) drops what it held: the abandoned harness's call
// never reaches the model server, the new launch's calls flow.
func TestResumeAndNewLaunchReleaseTheRelay(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, run)
	model := newModelServer(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{}`) })
	res, rl := residentWithRelay(t, t.TempDir(), model.URL)
	m := join(t, env, res, "rel", 0)
	c, _ := launch(t, env, "rel", id("r1"), t.TempDir())
	seq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 10*time.Second, m)})
	if a := bridge.Ack(seq, events.PhasePrepare, m).(events.PrepareAck); !a.Ready || !rl.Holding() {
		t.Fatalf("prepare: ready %v, relay holding %v", a.Ready, rl.Holding())
	}
	bridge.Ack(bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c1", 10*time.Second, m)}), events.PhaseResume, m)
	poll.Wait(t, 10*time.Second, "the relay released by the resume", func() bool { return !rl.Holding() })

	rl.Hold() // as a restored snapshot leaves it
	abandoned := make(chan int, 1)
	go func() {
		resp, err := http.Post(rl.URL()+"/v1/chat/completions", "application/json", strings.NewReader(`{"q":"abandoned"}`))
		if err != nil {
			abandoned <- 0
			return
		}
		resp.Body.Close()
		abandoned <- resp.StatusCode
	}()
	poll.Wait(t, 10*time.Second, "the abandoned harness's call held", func() bool { return rl.Status().Calls.Held == 1 })
	if _, err := c.Launch(t.Context(), sandboxapi.LaunchRequest{LaunchID: id("r2"), Episode: id("r2"), Command: "sleep 30"}); err != nil {
		t.Fatal(err)
	}
	if rl.Holding() {
		t.Fatal("a launch with admission open left the relay holding")
	}
	if code := <-abandoned; code != http.StatusServiceUnavailable {
		t.Fatalf("the abandoned call got %d, want 503", code)
	}
	select {
	case got := <-model.calls:
		t.Fatalf("the model server got %q from an abandoned launch", got)
	default:
	}
	for _, l := range []string{id("r1"), id("r2")} {
		if _, err := c.Stop(t.Context(), l, true); err != nil {
			t.Fatal(err)
		}
	}
}

// The resume ack's pause report counts the model calls the relay held for
// the checkpoint (held_calls): the bridge turns it into
// stillpoint_relay_held_calls_total. The call held then reaches the model.
func TestResumeAckCountsHeldCalls(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, run)
	model := newModelServer(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{}`) })
	res, rl := residentWithRelay(t, t.TempDir(), model.URL)
	m := join(t, env, res, "held", 0)
	c, _ := launch(t, env, "held", id("r1"), t.TempDir())
	seq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 10*time.Second, m)})
	if a := bridge.Ack(seq, events.PhasePrepare, m).(events.PrepareAck); !a.Ready || !rl.Holding() {
		t.Fatalf("prepare: ready %v, relay holding %v", a.Ready, rl.Holding())
	}
	answered := make(chan int, 1)
	go func() {
		resp, err := http.Post(rl.URL()+"/v1/chat/completions", "application/json", strings.NewReader(`{"q":"held"}`))
		if err != nil {
			answered <- 0
			return
		}
		resp.Body.Close()
		answered <- resp.StatusCode
	}()
	poll.Wait(t, 10*time.Second, "the call held", func() bool { return rl.Status().Calls.Held == 1 })
	a := bridge.Ack(bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c1", 10*time.Second, m)}), events.PhaseResume, m).(events.ResumeAck)
	if a.Pause == nil || a.Pause.HeldCalls != 1 {
		t.Fatalf("resume ack pause report %+v, want held_calls 1", a.Pause)
	}
	if code := <-answered; code != http.StatusOK {
		t.Fatalf("the held call got %d after the resume, want 200", code)
	}
	if _, err := c.Stop(t.Context(), id("r1"), true); err != nil {
		t.Fatal(err)
	}
}

// The hold a restore left belongs to the take-over: a checkpoint of the
// new epoch that opens before it (PROTOCOL-HISTORY §27: the take-over waits for its
// resume, the launch still held) neither re-points the relay (refused
// admission_closed, as the resume is) nor releases the hold at its resume,
// so the cut call reaches no model server until the take-over has
// re-pointed the relay and continued the launch; then it reaches the new
// one, once.
func TestRestoredHoldSurvivesTheNextCheckpoint(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, run)
	gone := newModelServer(t, func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	fresh := newModelServer(t, func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{"answer":"new"}`) })
	res, rl := residentWithRelay(t, t.TempDir(), gone.URL)
	orig := join(t, env, res, "orig", 0)
	nc, _ := env.Connect(t)
	c, err := sandboxclient.New(nc, run, "orig")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Launch(t.Context(), sandboxapi.LaunchRequest{LaunchID: id("held"), Episode: id("held"), Dir: t.TempDir(),
		Command: "while :; do sleep 0.05; done", Mode: "hold", Freeze: true}); err != nil {
		t.Fatal(err)
	}
	answer := make(chan string, 1)
	go func() {
		resp, err := http.Post(rl.URL()+"/v1/chat/completions", "application/json", strings.NewReader(`{"q":"cut"}`))
		if err != nil {
			answer <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		answer <- string(b)
	}()
	<-gone.calls
	ack := bridge.Ack(bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 10*time.Second, orig)}), events.PhasePrepare, orig).(events.PrepareAck)
	identity, err := sandboxapi.ParseIdentity(ack.Pause.Identity)
	if err != nil {
		t.Fatal(err)
	}

	// The restore: the sandbox is re-identified as a fork in epoch 1, and
	// no resume of c1 ever comes.
	bridge.Epoch = 1
	f1 := join(t, env, res, "f1", 1)
	c1, err := sandboxclient.New(nc, run, "f1")
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	pa := bridge.Ack(bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c2", 10*time.Second, f1)}), events.PhasePrepare, f1).(events.PrepareAck)
	if !pa.Ready {
		t.Fatalf("c2's prepare: %+v", pa)
	}
	if _, err := c1.Repoint(ctx, fresh.URL, 1); code(err) != sandboxapi.CodeAdmissionClosed {
		t.Fatalf("Repoint under c2: %v, want admission_closed", err)
	}
	if _, err := c1.Resume(ctx, id("held"), 1, identity); code(err) != sandboxapi.CodeAdmissionClosed {
		t.Fatalf("Resume under c2: %v, want admission_closed", err)
	}
	bridge.Ack(bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c2", 10*time.Second, f1)}), events.PhaseResume, f1)
	if !rl.Holding() {
		t.Fatal("c2's resume released the hold the restore left, before any take-over")
	}
	if st, err := c1.Status(ctx, id("held")); err != nil || st.State != sandboxapi.StatePaused || st.Pauses.Seq != 1 {
		t.Fatalf("the held launch after c2: %+v, %v; want still paused in pause 1", st, err)
	}

	// The take-over, now that admission is open.
	if _, err := c1.Repoint(ctx, fresh.URL, 1); err != nil {
		t.Fatalf("Repoint: %v", err)
	}
	if rep, err := c1.Resume(ctx, id("held"), 1, identity); err != nil || rep.State != sandboxapi.StateRunning {
		t.Fatalf("Resume: %+v, %v", rep, err)
	}
	if got := <-fresh.calls; got != `{"q":"cut"}` {
		t.Fatalf("the new model server got %q", got)
	}
	if a := <-answer; a != `{"answer":"new"}` {
		t.Fatalf("the harness got %q", a)
	}
	select {
	case got := <-fresh.calls:
		t.Fatalf("the new model server got a second call %q", got)
	default:
	}
	if _, err := c1.Stop(ctx, id("held"), true); err != nil {
		t.Fatal(err)
	}
}
