package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/opencode"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm/qemu"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxclient"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// microVMCache is the images and warm templates the microvm tests share
// with the demo (an owner builds them once per kernel and sandboxd).
var microVMCache = filepath.Join(os.TempDir(), "stillpoint-microvm-cache")

// requireMicroVM fails a test that needs QEMU microVMs on a machine that
// cannot run them, saying what to install.
func requireMicroVM(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("the microvm provider runs QEMU as root: run as root")
	}
	if _, err := qemu.FindAssets(""); err != nil {
		t.Fatalf("the microvm tests need QEMU and the guest kernel (apt-get install qemu-system-x86 qemu-utils busybox-static; make microvm-assets): %v", err)
	}
}

// serveModel starts another scripted model server on a new port until the
// test ends: its host address and the server.
func serveModel(t *testing.T, script modelserver.Script) (string, *modelserver.Server) {
	t.Helper()
	ms := modelserver.New(script)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: ms}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-served })
	return ln.Addr().String(), ms
}

// heldLaunch is what the test knows of a rollout's launch the checkpoint
// held: its sandbox, its id, the harness's pid, and the model call the
// snapshot caught in flight.
type heldLaunch struct {
	sandbox, id, session string
	pid                  int
	cut                  string // the digest of the call in flight
	pause                agentapi.HeldPause
}

// inFlight returns the ledger entry of task's call in flight (not
// delivered) at ms, if any.
func inFlight(ms *modelserver.Server, task string) (modelserver.Entry, bool) {
	for _, e := range ms.Ledger() {
		if e.Task == task && e.Delivered.IsZero() {
			return e, true
		}
	}
	return modelserver.Entry{}, false
}

// pauseFiveTimes checkpoints the n rollouts f runs (its model server
// holding from turn 1) five times, each with every rollout's model call in
// flight: four checkpoints catch turns 1 to 4, each let go after it; the
// fifth, c5, catches turn 5 and leaves it held, for the crash that
// follows.
func pauseFiveTimes(ctx context.Context, t *testing.T, f *fleet, n int) {
	t.Helper()
	for turn := 1; turn <= 5; turn++ {
		poll.Wait(t, 4*time.Minute, fmt.Sprintf("every rollout's call of turn %d or later held by the model server", turn), func() bool {
			for i := range n {
				if e, ok := inFlight(f.ms, f.tasks[i].RolloutID); !ok || e.Turn < turn {
					return false
				}
			}
			return f.ms.Held() == n
		})
		res := f.checkpoint(ctx, fmt.Sprintf("c%d", turn))
		if len(res.Continued) != n {
			t.Fatalf("c%d continued %v, want all %d rollouts", turn, res.Continued, n)
		}
		if turn < 5 {
			// Let the calls go; each harness runs a tool (a second) before
			// its next call, which the next turn's hold catches.
			f.ms.Release()
			f.ms.HoldFrom(turn + 1)
		}
	}
}

// TestMicroVMRestoreContinuesHeldRolloutsInPlace: on the microvm provider,
// whose snapshots keep processes, rollouts are paused by four checkpoints,
// each caught in the middle of a model call, then checkpointed a fifth
// time the same way (the model server holds its replies, the sandbox's
// relay holds the call). The agent and the owner are then killed
// with SIGKILL, and a new agent and owner, with a NEW model server on a new
// address, restore: every held launch is taken over in place (the same
// harness pid in the fork), the call the snapshot cut reaches the new model
// server exactly once (its ledger), no call is repeated and no user turn
// injected, and the clock is kept continuous (the pause froze the launch,
// and the fork's clock runs on from the snapshot).
func TestMicroVMRestoreContinuesHeldRolloutsInPlace(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.75, 20*time.Second)
	requireMicroVM(t)
	const n = 2
	f := startFleet(t, fleetOptions{n: n, concurrency: n, toolSeconds: 1, steps: 6, provider: "microvm"})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	f.ms.HoldFrom(1)
	lost, abandon := context.WithCancel(ctx)
	var first []<-chan outcome
	for i := range n {
		first = append(first, f.dispatch(lost, i, 0))
	}
	pauseFiveTimes(ctx, t, f, n)
	bms := f.agentRecords(ctx, "c5", "a1")
	held := map[string]heldLaunch{}
	for i := range n {
		id := f.tasks[i].RolloutID
		bm, ok := bms[id]
		if !ok || !bm.KeepsProcesses || len(bm.Launches) != 1 || bm.Launches[0].Held == nil || !bm.Launches[0].Relay {
			t.Fatalf("%s: exported bookmark %+v: want one relay launch held by the checkpoint", id, bm)
		}
		if !bm.Launches[0].Held.Frozen {
			t.Errorf("%s: the hold did not freeze the launch (restore_sandbox_clock is on)", id)
		}
		dc, err := sandboxclient.New(f.env.Conn, f.run, bm.Sandbox)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := dc.Status(ctx, bm.Launches[0].ID)
		if err != nil || rec.PID == 0 {
			t.Fatalf("%s: status of %s in %s: %+v %v", id, bm.Launches[0].ID, bm.Sandbox, rec, err)
		}
		h := heldLaunch{sandbox: bm.Sandbox, id: bm.Launches[0].ID, session: bm.Session, pid: rec.PID, pause: *bm.Launches[0].Held}
		if e, ok := inFlight(f.ms, id); ok {
			h.cut = e.Digest
		}
		if h.cut == "" {
			t.Fatalf("%s: no call in flight in the model server's ledger", id)
		}
		held[id] = h
	}
	f.kill9("agent-a1", "owner")
	abandon()
	for _, ch := range first {
		if o := <-ch; o.err == nil {
			t.Fatalf("a rollout returned across the crash: %+v", o.res)
		}
	}
	// A new model server on a new address; the old one never answers.
	addr, ms2 := serveModel(t, f.script)
	f.later = append(f.later, ms2)
	ms2.Hold()
	f.upstream = addr
	f.startOwner()
	f.startAgent("a1", "--concurrency", "2")
	rr, err := f.br.Restore(ctx, bridgeapi.RestoreRequest{})
	if err != nil || rr.Status != bridgeapi.StatusCompleted {
		t.Fatalf("restore: %+v %v", rr, err)
	}
	var second []<-chan outcome
	for i := range n {
		second = append(second, f.dispatch(ctx, i, 1))
	}
	// The relay re-sends each cut call to the new server, which holds it:
	// meanwhile the fork's launch is the snapshot's, the same harness.
	poll.Wait(t, 4*time.Minute, "the cut calls re-sent to the new model server", func() bool { return ms2.Held() == n })
	oc, err := ownerapi.NewClient(f.env.Conn, f.run, "o1")
	if err != nil {
		t.Fatal(err)
	}
	for id, h := range held {
		info, err := oc.SandboxAccess(ctx, h.session)
		if err != nil || info.SandboxID == h.sandbox || !info.KeepsProcesses {
			t.Fatalf("%s: sandbox after the restore: %+v %v (want a fork of %s on a provider that keeps processes)", id, info, err, h.sandbox)
		}
		dc, err := sandboxclient.New(f.env.Conn, f.run, info.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := dc.Status(ctx, h.id)
		if err != nil || rec.PID != h.pid {
			t.Errorf("%s: launch %s in the fork %s: pid %d (%v), want the snapshot's harness, pid %d", id, h.id, info.SandboxID, rec.PID, err, h.pid)
		}
		// The clock after the take-over: the fork's wall clock is the
		// pause's plus the uptime since (continuous: nothing of the launch
		// saw the time between the snapshot and the restore).
		ident, err := sandboxapi.ParseIdentity(h.pause.Identity)
		if err != nil {
			t.Fatal(err)
		}
		ans, err := dc.Held(ctx, h.id, h.pause.Seq, ident)
		if err != nil {
			t.Fatalf("%s: held after the take-over: %v", id, err)
		}
		want := h.pause.Wall.Add(time.Duration((ans.Uptime - h.pause.Uptime) * float64(time.Second)))
		d := ans.Wall.Sub(want)
		t.Logf("%s: the fork's wall clock after the take-over is %s off the pause's plus %.3fs of uptime", id, d, ans.Uptime-h.pause.Uptime)
		if d < -2*time.Second || d > 2*time.Second {
			t.Errorf("%s: the fork's wall clock %s after the take-over is %s off the pause's %s plus %.3fs of uptime since it",
				id, ans.Wall.UTC().Format(time.RFC3339Nano), d, h.pause.Wall.UTC().Format(time.RFC3339Nano), ans.Uptime-h.pause.Uptime)
		}
	}
	ms2.Release()
	for i, ch := range second {
		o := <-ch
		id := f.tasks[i].RolloutID
		if o.err != nil {
			t.Fatalf("%s after the restore: %v", id, o.err)
		}
		reward(t, o.res)
		f.checkTrajectory(o.res)
		if len(o.res.Launches) != 1 {
			t.Fatalf("%s: launch log %+v: want the one launch, continued in place", id, o.res.Launches)
		}
		l := o.res.Launches[0]
		if !o.res.Restored || l.Rebind != agentapi.RebindResumed || l.Attempt != 0 || l.Ended != agentapi.LaunchFinished || l.Pauses < 5 {
			t.Errorf("%s: restored %v, launch %+v: want the attempt-0 launch, paused five times, resumed in place and finished", id, o.res.Restored, l)
		}
		if !strings.HasPrefix(l.Clock, "kept_continuous") {
			t.Errorf("%s: clock decision %q, want kept_continuous (the pause froze, the fork's clock runs on)", id, l.Clock)
		}
		cut := 0
		var resent modelserver.Entry
		for _, e := range ms2.Ledger() {
			if e.Task == id && e.Digest == held[id].cut {
				cut++
				resent = e
			}
		}
		if cut != 1 {
			t.Errorf("%s: the cut call reached the new model server %d times, want once", id, cut)
			continue
		}
		// The trajectory holds the cut call once, with the reply the new
		// server gave to the re-send, on the one chain of token ids.
		all := readTrajectory(ctx, t, f, o.res.Trajectory).Calls()
		once := 0
		for _, c := range all {
			if slices.Equal(c.AllPromptIDs, resent.PromptTokenIDs) {
				once++
				if !slices.Equal(c.CompletionIDs, resent.TokenIDs) || c.Resends < 1 {
					t.Errorf("%s: the cut call %s: %d resends, its completion %v the new server's %v", id, c.ID, c.Resends, c.CompletionIDs, resent.TokenIDs)
				}
			}
		}
		if seqs := trajectory.Chains(all); once != 1 || len(seqs) != 1 || len(seqs[0].Calls) != len(all) {
			t.Errorf("%s: the cut call is in the trajectory %d times (want once); %d chains of token ids (want one of all %d calls)", id, once, len(seqs), len(all))
		}
	}
	for _, ms := range []*modelserver.Server{f.ms, ms2} {
		if r := ms.Repeats(); len(r) != 0 {
			t.Errorf("repeated model calls: %v", r)
		}
		for _, e := range ms.Ledger() {
			if e.UserTurns != 1 {
				t.Errorf("%s: a request with %d user turns: a turn was injected", e.Task, e.UserTurns)
			}
		}
	}
	if rel, err := f.br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
		t.Fatalf("final release: %+v %v", rel, err)
	}
}

// TestMicroVMOpenCodeContinuesInPlace: one real OpenCode rollout on the
// microvm provider (1 GiB guest, OpenCode's directory beside the bin
// directory on the harness disk), checkpointed while OpenCode waits for a
// model reply; the agent and the owner are killed with SIGKILL, and a new
// agent and owner with a new model server restore. The OpenCode process
// the snapshot kept is taken over in place, its cut calls and every later
// one reach the new model server, and it finishes with its grade.
func TestMicroVMOpenCodeContinuesInPlace(t *testing.T) {
	tier.Heavy(t)
	parallel(t, 1, 4*time.Minute) // the guest under TCG, and OpenCode in it
	requireMicroVM(t)
	if _, err := opencode.Binary(); err != nil {
		t.Fatal(err)
	}
	if _, err := opencode.Ripgrep(); err != nil {
		t.Fatal(err)
	}
	b := buildBins(t)
	ts, script := openCodeTasks("ocvm", 1, 1)
	began := time.Now()
	ownerArgs := []string{"--opencode", b.driver, "--microvm-mem", "1024"}
	if os.Getenv("STILLPOINT_MICROVM_FULL_COPY") != "" { // docs/BENCHMARKS.md: the restore before RAM files
		ownerArgs = append(ownerArgs, "--microvm-full-copy")
	}
	f := startFleet(t, fleetOptions{n: 1, concurrency: 1, tasks: ts, script: script, provider: "microvm",
		ownerArgs: ownerArgs,
		agentArgs: []string{"--adapter", "opencode", "--launch-timeout", "30m"}})
	ctx, cancel := context.WithTimeout(t.Context(), 25*time.Minute)
	defer cancel()
	f.ms.Hold()
	lost, abandon := context.WithCancel(ctx)
	first := f.dispatch(lost, 0, 0)
	wait, stop := context.WithTimeout(ctx, 15*time.Minute)
	err := poll.Until(wait, poll.Every(100*time.Millisecond), func() (bool, error) { return f.ms.Held() > 0, nil })
	stop()
	if err != nil {
		f.showLaunch(ctx, f.id(0))
		t.Fatalf("OpenCode's first model call held by the model server: %v after %s", err, time.Since(began).Round(time.Second))
	}
	started := time.Since(began)
	f.checkpoint(ctx, "c1")
	bm := f.agentRecords(ctx, "c1", "a1")[f.id(0)]
	if len(bm.Launches) != 1 || bm.Launches[0].Held == nil || !bm.Launches[0].Relay {
		t.Fatalf("exported bookmark %+v: want the OpenCode launch held through the relay", bm)
	}
	f.kill9("agent-a1", "owner")
	abandon()
	if o := <-first; o.err == nil {
		t.Fatalf("the rollout returned across the crash: %+v", o.res)
	}
	addr, ms2 := serveModel(t, f.script)
	f.later = append(f.later, ms2)
	f.upstream = addr
	f.startOwner()
	f.startAgent("a1", "--concurrency", "1")
	t1 := time.Now()
	if rr, err := f.br.Restore(ctx, bridgeapi.RestoreRequest{}); err != nil || rr.Status != bridgeapi.StatusCompleted {
		t.Fatalf("restore: %+v %v", rr, err)
	}
	restoreTook := time.Since(t1)
	o := <-f.dispatch(ctx, 0, 1)
	if o.err != nil {
		t.Fatalf("after the restore: %v", o.err)
	}
	reward(t, o.res)
	f.checkTrajectory(o.res)
	if len(o.res.Launches) != 1 || o.res.Launches[0].Rebind != agentapi.RebindResumed || o.res.Launches[0].Ended != agentapi.LaunchFinished {
		t.Fatalf("launch log %+v: want the one OpenCode launch resumed in place and finished", o.res.Launches)
	}
	if len(ms2.Ledger()) == 0 {
		t.Fatal("no model call reached the new model server")
	}
	for _, ms := range []*modelserver.Server{f.ms, ms2} {
		if r := ms.Repeats(); len(r) != 0 {
			t.Errorf("repeated model calls: %v", r)
		}
	}
	t.Logf("cost: to OpenCode's first model call %s (the template included), the restore %s, restore to the grade %s, %d calls to the new model server",
		started.Round(time.Second), restoreTook.Round(100*time.Millisecond), time.Since(t1).Round(time.Second), len(ms2.Ledger()))
	if rel, err := f.br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
		t.Fatalf("final release: %+v %v", rel, err)
	}
}

// TestMicroVMRestoreAbandonsWhatItCannotTakeOver: as above, but the forks'
// daemons are told to fail the take-over (failpoints of sandboxd member):
// the first rollout's launch shows another supervisor (identity_changed),
// and the second rollout's fork has its relay down (relay_gone). Each held
// launch is abandoned, killed without a continue. The first rollout
// relaunches from the saved session through its fork's relay, whose
// restored hold the relaunch drops (the abandoned call never reaches the
// new model server), and finishes with its grade and its trajectory. The
// second's fork cannot capture a relaunch: a relay that is down is an
// infrastructure fault, never a reason to call the model around it, so the
// attempt's sandbox is lost (sandbox_lost, not a result) and the rollout
// starts over one attempt later, in a new sandbox, with its trajectory.
// None of it stops the restore.
func TestMicroVMRestoreAbandonsWhatItCannotTakeOver(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.75, 20*time.Second)
	requireMicroVM(t)
	const n = 2
	f := startFleet(t, fleetOptions{n: n, concurrency: n, toolSeconds: 1, steps: 6, provider: "microvm"})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	f.ms.HoldFrom(1)
	lost, abandon := context.WithCancel(ctx)
	var first []<-chan outcome
	for i := range n {
		first = append(first, f.dispatch(lost, i, 0))
	}
	pauseFiveTimes(ctx, t, f, n)
	bms := f.agentRecords(ctx, "c5", "a1")
	abandoned := map[string]modelserver.Entry{}
	for i := range n {
		id := f.tasks[i].RolloutID
		e, ok := inFlight(f.ms, id)
		if !ok {
			t.Fatalf("%s: no call in flight in the model server's ledger", id)
		}
		abandoned[id] = e
	}
	f.kill9("agent-a1", "owner")
	abandon()
	for _, ch := range first {
		if o := <-ch; o.err == nil {
			t.Fatalf("a rollout returned across the crash: %+v", o.res)
		}
	}
	addr, ms2 := serveModel(t, f.script)
	f.later = append(f.later, ms2)
	f.upstream = addr
	f.ownerArgs = append(f.ownerArgs, "--sandboxd-arg=--failpoint=identity="+f.tasks[0].RolloutID+".l",
		"--sandboxd-arg=--failpoint=relay-down="+f.tasks[1].RolloutID+".l")
	f.startOwner()
	f.startAgent("a1", "--concurrency", "2")
	if rr, err := f.br.Restore(ctx, bridgeapi.RestoreRequest{}); err != nil || rr.Status != bridgeapi.StatusCompleted {
		t.Fatalf("restore: %+v %v", rr, err)
	}
	want := []string{agentapi.RebindIdentityChanged, agentapi.RebindRelayGone}
	oc, err := ownerapi.NewClient(f.env.Conn, f.run, "o1")
	if err != nil {
		t.Fatal(err)
	}
	ms2.Hold()
	var second []<-chan outcome
	for i := range n {
		second = append(second, f.dispatch(ctx, i, 1))
	}
	// The first rollout's relaunch calls the new model server through its
	// fork's relay, which holds it; the second's attempt finds its fork's
	// relay down, tries again, and gives the sandbox up.
	poll.Wait(t, 4*time.Minute, "the first rollout's relaunch's first call at the new model server", func() bool { return ms2.Held() == 1 })
	o1 := <-second[1]
	var se *jetstream.ServiceError
	if !errors.As(o1.err, &se) || se.Code != agentapi.CodeSandboxLost {
		t.Fatalf("%s: attempt 1 in a fork whose relay is down: %+v, %v; want sandbox_lost (an infrastructure fault, not a result)", f.tasks[1].RolloutID, o1.res, o1.err)
	}
	for i := range n {
		id, old := f.tasks[i].RolloutID, bms[f.tasks[i].RolloutID].Launches[0].ID
		info, err := oc.SandboxAccess(ctx, bms[id].Session)
		if i == 1 {
			// Given up: the owner keeps no sandbox for the lost attempt.
			if !errors.As(err, &se) || se.Code != "no_sandbox" {
				t.Errorf("%s: the lost attempt's sandbox: %+v, %v; want none (no_sandbox)", id, info, err)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		dc, err := sandboxclient.New(f.env.Conn, f.run, info.SandboxID)
		if err != nil {
			t.Fatal(err)
		}
		rec, err := dc.Status(ctx, old)
		if err != nil || rec.State != sandboxapi.StateEnded || rec.Receipt == nil || rec.Receipt.StopReason != sandboxapi.StopCancelled {
			t.Errorf("%s: the abandoned launch %s in %s: %+v %v, want ended by a cancel stop", id, old, info.SandboxID, rec.Receipt, err)
		}
		if i == 0 {
			// The relaunch through the relay dropped the restored hold.
			if st, err := dc.RelayStatus(ctx); err != nil || !st.Up || st.Holding {
				t.Errorf("%s: the fork's relay after the relaunch: %+v %v, want up and no longer holding", id, st, err)
			}
		}
	}
	// The controller's part: retire the lost attempt, start it over.
	if r, err := f.br.Retire(ctx, []string{events.Episode{Rollout: f.tasks[1].RolloutID, Attempt: 1}.String()}); err != nil || r.Status != bridgeapi.StatusCompleted {
		t.Fatalf("retire of the lost attempt: %+v %v", r, err)
	}
	second[1] = f.dispatch(ctx, 1, 2)
	ms2.Release()
	for i, ch := range second {
		id := f.tasks[i].RolloutID
		o := <-ch
		if o.err != nil {
			t.Fatalf("%s after the restore: %v", id, o.err)
		}
		reward(t, o.res)
		f.checkTrajectory(o.res)
		ls := o.res.Launches
		if i == 0 {
			// The relaunch decides on the saved session as on a files-only
			// provider (here it holds no reply yet: the held call was the
			// first).
			if len(ls) != 2 || ls[0].Rebind != want[i] || ls[0].Ended != agentapi.LaunchInterrupted || ls[1].Why == "" ||
				ls[1].Attempt != 1 || ls[1].Ended != agentapi.LaunchFinished || !ls[1].Relay {
				t.Errorf("%s: launch log %+v: want the held launch abandoned (%s), then a relaunch through the relay", id, ls, want[i])
			}
		} else if len(ls) != 1 || ls[0].Attempt != 2 || ls[0].Ended != agentapi.LaunchFinished || !ls[0].Captured {
			t.Errorf("%s: launch log %+v: want the one launch of attempt 2, captured, finished", id, ls)
		}
		// The abandoned launch's call (its digest, in its episode) never
		// reached the new model server: dropped, not sent on.
		a := abandoned[id]
		for _, e := range ms2.Ledger() {
			if e.Task == id && e.Digest == a.Digest && e.Episode == a.Episode {
				t.Errorf("%s: the abandoned launch's call %s (episode %s) reached the new model server", id, a.Digest, a.Episode)
			}
		}
	}
	if r := ms2.Repeats(); len(r) != 0 {
		t.Errorf("repeated model calls: %v", r)
	}
	for _, e := range ms2.Ledger() {
		if e.UserTurns != 1 {
			t.Errorf("%s: a request with %d user turns: a turn was injected", e.Task, e.UserTurns)
		}
	}
	if rel, err := f.br.Release(ctx, bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
		t.Fatalf("final release: %+v %v", rel, err)
	}
}
