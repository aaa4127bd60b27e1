package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxclient"
)

// keptDaemon is a restored sandbox's daemon as the agent calls it, with a
// relay and a launch a snapshot kept: what it answers is the test's, and it
// records what the agent asked of it, in order.
type keptDaemon struct {
	held      sandboxapi.HeldAnswer
	heldErr   error
	resumeErr error
	repErr    error
	// resumeFails and stopFails are what the first Resumes and Stops
	// answer, one each, before resumeErr and success.
	resumeFails []error
	stopFails   []error
	receipt     sandboxapi.Receipt

	mu    sync.Mutex
	calls []string
	gen   uint64
}

func (d *keptDaemon) note(c string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.calls = append(d.calls, c)
}

func (d *keptDaemon) got() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.calls...)
}

func (d *keptDaemon) Launch(_ context.Context, r sandboxapi.LaunchRequest) (sandboxapi.Record, error) {
	d.note("launch")
	return sandboxapi.Record{ID: r.LaunchID}, nil
}

func (d *keptDaemon) Status(_ context.Context, id string) (sandboxapi.Record, error) {
	return sandboxapi.Record{ID: id, State: sandboxapi.StateRunning}, nil
}

func (d *keptDaemon) Stop(_ context.Context, id string, cancel bool) (sandboxapi.Receipt, error) {
	if cancel {
		d.note("kill")
	} else {
		d.note("stop")
	}
	if err := d.next(&d.stopFails); err != nil {
		return sandboxapi.Receipt{}, err
	}
	return sandboxapi.Receipt{ID: id, Outcome: sandboxapi.OutcomeInterrupted}, nil
}

// next takes the first of *errs, if any.
func (d *keptDaemon) next(errs *[]error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(*errs) == 0 {
		return nil
	}
	err := (*errs)[0]
	*errs = (*errs)[1:]
	return err
}

func (d *keptDaemon) WaitReceipt(ctx context.Context, _ string, _ time.Duration) (sandboxapi.Receipt, error) {
	<-ctx.Done()
	return sandboxapi.Receipt{}, ctx.Err()
}

func (d *keptDaemon) Held(context.Context, string, int, sandboxapi.Identity) (sandboxapi.HeldAnswer, error) {
	d.note("held")
	return d.held, d.heldErr
}

func (d *keptDaemon) Resume(_ context.Context, id string, seq int, _ sandboxapi.Identity) (sandboxapi.PauseResult, error) {
	d.note("resume")
	if err := d.next(&d.resumeFails); err != nil {
		return sandboxapi.PauseResult{}, err
	}
	return sandboxapi.PauseResult{Launch: id, Op: "continue", PauseSeq: seq}, d.resumeErr
}

func (d *keptDaemon) Collect(_ context.Context, id string, _ sandboxapi.Identity) (sandboxapi.Receipt, error) {
	d.note("collect")
	return d.receipt, nil
}

func (d *keptDaemon) RelayStatus(context.Context) (sandboxapi.RelayStatus, error) {
	return d.held.Relay, nil
}

func (d *keptDaemon) RepointWith(_ context.Context, rq sandboxapi.RepointRequest) (sandboxapi.RelayStatus, error) {
	url, gen := rq.URL, rq.Generation
	d.note("repoint")
	if d.repErr != nil {
		return sandboxapi.RelayStatus{}, d.repErr
	}
	d.gen = gen
	return sandboxapi.RelayStatus{Up: true, URL: "http://127.0.0.1:18480/v1", Upstream: url, Generation: gen}, nil
}

// rebindAgent is an agent without a bus, enough for rebind: its config,
// its logger, and a run of a rollout whose last launch a checkpoint held.
func rebindAgent(t *testing.T) (*Agent, *run, agentapi.Bookmark) {
	t.Helper()
	a := &Agent{cfg: Config{ModelURL: "http://model.new:8080", ClockPolicy: ClockContinuous, Adapter: testAdapter{}, Metrics: metrics.New()},
		log: testLogger(t)}
	r := &run{key: "r1-a1", ctx: t.Context(), log: testLogger(t)}
	bm := agentapi.Bookmark{V: 1, Next: agentapi.StageLaunch, Rollout: "r1", Attempt: 0, Session: "r1", State: json.RawMessage(`{}`),
		Resume: true, KeepsProcesses: true, RelayGen: 1,
		Launches: []agentapi.LaunchRecord{{ID: "r1.l1", Sandbox: "sb-old", Ended: agentapi.LaunchInterrupted, Pauses: 1, Relay: true,
			Held: &agentapi.HeldPause{Seq: 3, Identity: "7:1234", Wall: time.Unix(1000, 0), Uptime: 50, Frozen: true}}}}
	return a, r, bm
}

// check_restored (PROTOCOL §6, Restore of a process-keeping snapshot):
// a launch held by the same supervisor with its relay up is re-pointed one
// generation up and continued, in that order; everything else is
// abandoned with a KILL (never a continue) and relaunched, and none of it
// fails the rollout.
func TestRebindOutcomes(t *testing.T) {
	same := sandboxapi.Identity{PID: 7, Start: 1234}
	up := sandboxapi.RelayStatus{Up: true, Generation: 1}
	cases := []struct {
		name    string
		d       *keptDaemon
		outcome string
		calls   []string
		adopted bool
	}{
		{"held: resumed in place", &keptDaemon{held: sandboxapi.HeldAnswer{Verdict: sandboxapi.VerdictHeld, Identity: same, Relay: up, Uptime: 51}},
			agentapi.RebindResumed, []string{"held", "repoint", "resume"}, true},
		{"relay gone", &keptDaemon{held: sandboxapi.HeldAnswer{Verdict: sandboxapi.VerdictHeld, Identity: same}},
			agentapi.RebindRelayGone, []string{"held", "kill"}, false},
		{"identity changed", &keptDaemon{held: sandboxapi.HeldAnswer{Verdict: sandboxapi.VerdictIdentityChanged, Identity: sandboxapi.Identity{PID: 7, Start: 99}, Relay: up}},
			agentapi.RebindIdentityChanged, []string{"held", "kill"}, false},
		{"not holding", &keptDaemon{held: sandboxapi.HeldAnswer{Verdict: sandboxapi.VerdictNotHolding, Identity: same, Relay: up}},
			agentapi.RebindNotHolding, []string{"held", "kill"}, false},
		{"unknown launch", &keptDaemon{held: sandboxapi.HeldAnswer{Verdict: sandboxapi.VerdictUnknownLaunch, Identity: same, Relay: up}},
			agentapi.RebindNotHolding, []string{"held", "kill"}, false},
		{"held fails", &keptDaemon{heldErr: errors.New("daemon gone")},
			agentapi.RebindTakeoverFailed, []string{"held", "kill"}, false},
		{"repoint fails", &keptDaemon{held: sandboxapi.HeldAnswer{Verdict: sandboxapi.VerdictHeld, Identity: same, Relay: up}, repErr: errors.New("stale")},
			agentapi.RebindTakeoverFailed, []string{"held", "repoint", "kill"}, false},
		{"resume fails", &keptDaemon{held: sandboxapi.HeldAnswer{Verdict: sandboxapi.VerdictHeld, Identity: same, Relay: up}, resumeErr: errors.New("not holding")},
			agentapi.RebindTakeoverFailed, []string{"held", "repoint", "resume", "kill"}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, r, bm := rebindAgent(t)
			d := c.d
			lc := LaunchContext{Rollout: "r1", Session: SessionInfo{SessionID: "r1", SandboxID: "sb-new", KeepsProcesses: true, Clock: "continuous"}}
			next, res, err := a.rebind(r, bm, lc, d)
			if err != nil {
				t.Fatalf("rebind: %v (a failed take-over must not fail the rollout)", err)
			}
			last := next.Launches[len(next.Launches)-1]
			if last.Rebind != c.outcome || last.RebindWhy == "" || res.adopted != c.adopted {
				t.Fatalf("rebind = %s (%s), adopted %v; want %s, adopted %v", last.Rebind, last.RebindWhy, res.adopted, c.outcome, c.adopted)
			}
			if got := d.got(); !slices.Equal(got, c.calls) {
				t.Fatalf("calls %v, want %v", got, c.calls)
			}
			f, err := a.cfg.Metrics.Gather()
			if err != nil || f.Sum("stillpoint_rebinds_total", map[string]string{"outcome": c.outcome}) != 1 || f.Sum("stillpoint_rebinds_total", nil) != 1 {
				t.Fatalf("stillpoint_rebinds_total: %v (%v), want one %s", f["stillpoint_rebinds_total"], err, c.outcome)
			}
			if !next.Resume {
				t.Fatal("the bookmark no longer resumes the saved session")
			}
			if c.adopted {
				if d.gen != 2 || next.RelayGen != 2 || last.Sandbox != "sb-new" || last.Ended != agentapi.LaunchRunning {
					t.Fatalf("adopted: relay gen %d, bookmark gen %d, launch %+v", d.gen, next.RelayGen, last)
				}
				if last.Clock == "" {
					t.Fatal("no clock decision recorded")
				}
			} else if last.Held != nil || last.Ended == agentapi.LaunchRunning {
				t.Fatalf("abandoned launch still %+v", last)
			}
		})
	}
}

// A launch that ended while held is collected: its receipt is the launch's
// end, nothing is killed or continued.
func TestRebindCollectsAnEndedLaunch(t *testing.T) {
	a, r, bm := rebindAgent(t)
	d := &keptDaemon{held: sandboxapi.HeldAnswer{Verdict: sandboxapi.VerdictEnded, Identity: sandboxapi.Identity{PID: 7, Start: 1234}},
		receipt: sandboxapi.Receipt{ID: "r1.l1", Outcome: sandboxapi.OutcomeFinished, OutputTail: "done", Ended: time.Now()}}
	lc := LaunchContext{Rollout: "r1", Session: SessionInfo{SessionID: "r1", SandboxID: "sb-new", KeepsProcesses: true}}
	next, res, err := a.rebind(r, bm, lc, d)
	if err != nil || !res.done || res.adopted {
		t.Fatalf("rebind of an ended launch: %+v, %v", res, err)
	}
	last := next.Launches[len(next.Launches)-1]
	if last.Rebind != agentapi.RebindCollected || last.Ended != agentapi.LaunchFinished || next.Next != agentapi.StageVerify || last.Held != nil {
		t.Fatalf("collected launch %+v, next %s", last, next.Next)
	}
	if got := d.got(); !slices.Equal(got, []string{"held", "collect"}) {
		t.Fatalf("calls %v, want held, collect", got)
	}
}

// A daemon client without the take-over (a sandbox of a provider that
// keeps files only, or a test double) gets the relaunch path.
func TestRebindWithoutAdopterRelaunches(t *testing.T) {
	a, r, bm := rebindAgent(t)
	sb := newEndlessSandbox()
	next, res, err := a.rebind(r, bm, LaunchContext{Session: SessionInfo{SandboxID: "sb-new"}}, sb)
	if err != nil || res.adopted || res.done || next.Launches[0].Rebind != agentapi.RebindTakeoverFailed || sb.stops.Load() != 1 {
		t.Fatalf("rebind without an adopter: %+v, %v, %+v, %d stops", res, err, next.Launches[0], sb.stops.Load())
	}
}

// A launch that ended interrupted while held is collected once: the
// rollout then relaunches (a new launch, not a second collect of the same
// one, which would never end).
func TestRebindCollectsAnInterruptedLaunchOnce(t *testing.T) {
	a, r, bm := rebindAgent(t)
	d := &keptDaemon{held: sandboxapi.HeldAnswer{Verdict: sandboxapi.VerdictEnded, Identity: sandboxapi.Identity{PID: 7, Start: 1234}},
		receipt: sandboxapi.Receipt{ID: "r1.l1", Outcome: sandboxapi.OutcomeInterrupted, Ended: time.Now()}}
	lc := LaunchContext{Rollout: "r1", Session: SessionInfo{SessionID: "r1", SandboxID: "sb-new", KeepsProcesses: true}}
	next, res, err := a.rebind(r, bm, lc, d)
	if err != nil || !res.done {
		t.Fatalf("rebind: %+v, %v", res, err)
	}
	last := next.Launches[len(next.Launches)-1]
	if next.Next != agentapi.StageLaunch || !next.Resume || last.Held != nil || last.Ended != agentapi.LaunchInterrupted {
		t.Fatalf("after collecting an interrupted launch: next %s resume %v, launch %+v: want a relaunch, the launch no longer held", next.Next, next.Resume, last)
	}
}

// A take-over refused because a checkpoint of the new epoch is open waits
// for its resume: nothing is abandoned, the bookmark keeps the held
// launch, and the stage is asked again (errAdmissionClosed).
func TestRebindWaitsForAnOpenCheckpoint(t *testing.T) {
	a, r, bm := rebindAgent(t)
	closed := &sandboxclient.ServiceError{Code: sandboxapi.CodeAdmissionClosed, Status: 409}
	d := &keptDaemon{held: sandboxapi.HeldAnswer{Verdict: sandboxapi.VerdictHeld, Identity: sandboxapi.Identity{PID: 7, Start: 1234}, Relay: sandboxapi.RelayStatus{Up: true, Generation: 1}},
		resumeErr: closed}
	lc := LaunchContext{Rollout: "r1", Session: SessionInfo{SessionID: "r1", SandboxID: "sb-new", KeepsProcesses: true, Clock: "continuous"}}
	next, res, err := a.rebind(r, bm, lc, d)
	if !errors.Is(err, errAdmissionClosed) || res.adopted || res.done {
		t.Fatalf("rebind under an open checkpoint: %+v, %v, want errAdmissionClosed", res, err)
	}
	last := next.Launches[0]
	if last.Held == nil || last.Rebind != "" || slices.Contains(d.got(), "kill") {
		t.Fatalf("launch %+v, calls %v: want it still held, undecided, not killed", last, d.got())
	}
}

// How a launch reaches the model: through the relay on every provider,
// with a model URL and a relay that is up and takes the re-point (one
// generation above the relay's and the bookmark's). Without a model URL,
// a daemon client with a relay, or a relay the owner runs (its choice),
// the harness calls the model directly; a relay that is there but down,
// or refuses the re-point, is errRelayUnready (the stage runs again),
// never a launch around it.
func TestPlanLaunch(t *testing.T) {
	keeps := SessionInfo{SandboxID: "sb1", KeepsProcesses: true}
	up := sandboxapi.HeldAnswer{Relay: sandboxapi.RelayStatus{Up: true, Generation: 4}}
	noRelay := &sandboxclient.ServiceError{Code: sandboxapi.CodeNoRelay, Status: 409, Detail: "no relay"}
	cases := []struct {
		name    string
		info    SessionInfo
		model   string
		d       Sandbox
		relay   bool
		gen     uint64
		unready bool
	}{
		{"keeps processes, relay up", keeps, "http://m:1", &keptDaemon{held: up}, true, 6, false},
		{"files only", SessionInfo{SandboxID: "sb1"}, "http://m:1", &keptDaemon{held: up}, true, 6, false},
		{"no model URL", keeps, "", &keptDaemon{held: up}, false, 0, false},
		{"the owner runs no relay", keeps, "http://m:1", &keptDaemon{held: up, repErr: noRelay}, false, 0, false},
		{"relay down", keeps, "http://m:1", &keptDaemon{}, false, 0, true},
		{"re-point refused", keeps, "http://m:1", &keptDaemon{held: up, repErr: errors.New("stale generation")}, false, 0, true},
		{"re-point under an open checkpoint", keeps, "http://m:1", &keptDaemon{held: up, repErr: &sandboxclient.ServiceError{Code: sandboxapi.CodeAdmissionClosed, Status: 409}}, false, 0, false},
		{"a daemon client without a relay", keeps, "http://m:1", newEndlessSandbox(), false, 0, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a, r, bm := rebindAgent(t)
			a.cfg.ModelURL = c.model
			bm.RelayGen = 5
			p, err := a.planLaunch(r, bm, c.info, c.d)
			if c.unready {
				if !errors.Is(err, errRelayUnready) {
					t.Fatalf("planLaunch = %+v, %v: want errRelayUnready", p, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("planLaunch: %v", err)
			}
			if closed := strings.Contains(c.name, "open checkpoint"); p.admissionClosed != closed {
				t.Fatalf("planLaunch = %+v: admission closed %v, want %v", p, p.admissionClosed, closed)
			}
			if p.relay != c.relay || p.gen != c.gen || (p.relay && p.modelURL != "http://127.0.0.1:18480") || (!p.relay && p.why == "") {
				t.Fatalf("planLaunch = %+v, want relay %v at generation %d", p, c.relay, c.gen)
			}
		})
	}
}

// A resume whose answer does not come in time is asked again (the daemon
// answers the same request the same), not taken for a failed take-over:
// the launch it may have continued is adopted, not killed and relaunched
// beside itself.
func TestRebindAsksAResumeThatTimedOutAgain(t *testing.T) {
	a, r, bm := rebindAgent(t)
	d := &keptDaemon{held: sandboxapi.HeldAnswer{Verdict: sandboxapi.VerdictHeld, Identity: sandboxapi.Identity{PID: 7, Start: 1234}, Relay: sandboxapi.RelayStatus{Up: true, Generation: 1}},
		resumeFails: []error{fmt.Errorf("sandboxapi: resume: %w", context.DeadlineExceeded), nats.ErrTimeout}}
	lc := LaunchContext{Rollout: "r1", Session: SessionInfo{SessionID: "r1", SandboxID: "sb-new", KeepsProcesses: true, Clock: "continuous"}}
	next, res, err := a.rebind(r, bm, lc, d)
	if err != nil || !res.adopted {
		t.Fatalf("rebind: %+v, %v; want the launch adopted", res, err)
	}
	if last := next.Launches[0]; last.Rebind != agentapi.RebindResumed {
		t.Fatalf("launch %+v", last)
	}
	if got, want := d.got(), []string{"held", "repoint", "resume", "resume", "resume"}; !slices.Equal(got, want) {
		t.Fatalf("calls %v, want %v", got, want)
	}
}

// An abandon asks for the kill again until the daemon confirms it; one it
// never confirms is an error, with the bookmark as it was (the launch
// still held, to be re-bound by a later try), never a relaunch beside a
// launch that may run.
func TestRebindAbandonWaitsForAConfirmedKill(t *testing.T) {
	unconfirmed := &sandboxclient.ServiceError{Code: sandboxapi.CodeInternal, Status: 500, Detail: "sandboxd: kill not confirmed"}
	notHolding := sandboxapi.HeldAnswer{Verdict: sandboxapi.VerdictNotHolding, Identity: sandboxapi.Identity{PID: 7, Start: 1234}}
	lc := LaunchContext{Rollout: "r1", Session: SessionInfo{SessionID: "r1", SandboxID: "sb-new", KeepsProcesses: true}}

	a, r, bm := rebindAgent(t)
	d := &keptDaemon{held: notHolding, stopFails: []error{unconfirmed, errors.New("nats: timeout")}}
	next, res, err := a.rebind(r, bm, lc, d)
	if err != nil || res.adopted || res.done {
		t.Fatalf("rebind, the kill confirmed at the third try: %+v, %v", res, err)
	}
	if got, want := d.got(), []string{"held", "kill", "kill", "kill"}; !slices.Equal(got, want) {
		t.Fatalf("calls %v, want %v", got, want)
	}
	if last := next.Launches[0]; last.Held != nil || last.Rebind != agentapi.RebindNotHolding {
		t.Fatalf("abandoned launch %+v", last)
	}

	a, r, bm = rebindAgent(t)
	d = &keptDaemon{held: notHolding, stopFails: slices.Repeat([]error{unconfirmed}, killTries)}
	next, res, err = a.rebind(r, bm, lc, d)
	if err == nil || errors.Is(err, errAdmissionClosed) || res.adopted || res.done {
		t.Fatalf("rebind, the kill never confirmed: %+v, %v; want an error", res, err)
	}
	if got := d.got(); len(got) != 1+killTries || slices.Contains(got, "launch") {
		t.Fatalf("calls %v, want held and %d kills, no launch", got, killTries)
	}
	if last := next.Launches[0]; last.Held == nil || last.Rebind != "" || len(next.Launches) != 1 {
		t.Fatalf("bookmark after an unconfirmed kill: %+v; want it as it was", next.Launches)
	}
}
