package e2e

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/collect/tasks"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// TestTrajectoryThroughFourPausesAndACrashMidCall: one rollout is paused
// by four checkpoints, each caught with a model call in flight; a fifth
// checkpoint catches the next call in flight, and the agent and the owner
// are killed (-9) before its reply comes. After the restore the rollout
// relaunches on its saved session, asks that call again, and finishes.
// Its trajectory is the model server's surviving chain exactly: every
// call it answered on that chain, in order, token ids chaining from call
// to call, the call the crash lost absent and its re-issue there once.
func TestTrajectoryThroughFourPausesAndACrashMidCall(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.25, 15*time.Second)
	f := startFleet(t, fleetOptions{n: 1, steps: 6})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	id := tasks.ID(0)
	lost, abandon := context.WithCancel(ctx)
	defer abandon()
	first := f.dispatch(lost, 0, 0)

	// held waits until the reply of a turn at or after turn is held, and
	// returns the held call's ledger entry.
	held := func(turn int) modelserver.Entry {
		t.Helper()
		f.ms.HoldFrom(turn)
		var e modelserver.Entry
		poll.Wait(t, time.Minute, fmt.Sprintf("a reply of turn %d or later held", turn), func() bool {
			l := f.ms.Ledger()
			if len(l) == 0 {
				return false
			}
			e = l[len(l)-1]
			return f.ms.Held() == 1 && e.Turn >= turn && e.Delivered.IsZero()
		})
		return e
	}
	for i := 1; i <= 4; i++ {
		e := held(i)
		res := f.checkpoint(ctx, fmt.Sprintf("c%d", i))
		if len(res.Continued) != 1 {
			t.Fatalf("c%d continued %v", i, res.Continued)
		}
		t.Logf("c%d paused the launch at turn %d, its call in flight", i, e.Turn)
		f.ms.Release()
	}
	inFlight := held(5)
	began := time.Now()
	res := f.checkpoint(ctx, "c5")
	if len(res.Continued) != 1 {
		t.Fatalf("c5 continued %v", res.Continued)
	}
	f.kill9("agent-a1", "owner")
	abandon()
	if o := <-first; o.err == nil {
		t.Fatalf("the rollout returned across the crash: %+v", o.res)
	}
	// The restarted owner stops the sandbox the crash left, with the call
	// still held: its reply never reaches it.
	f.startOwner()
	f.startAgent("a1")
	rr, err := f.br.Restore(ctx, bridgeapi.RestoreRequest{})
	if err != nil || rr.Status != bridgeapi.StatusCompleted {
		t.Fatalf("restore: %+v %v", rr, err)
	}
	f.ms.Release()
	o := <-f.dispatch(ctx, 0, 1)
	if o.err != nil {
		t.Fatalf("%s after the restore: %v", id, o.err)
	}
	reward(t, o.res)
	f.checkLedger(began)
	f.checkTrajectory(o.res)
	if len(o.res.Launches) != 2 || o.res.Launches[0].Pauses < 4 || !o.res.Launches[1].Continued {
		t.Errorf("launch log %+v: want a launch paused at least four times, then one that continued its session", o.res.Launches)
	}

	x := readTrajectory(ctx, t, f, o.res.Trajectory)
	all := x.Calls()
	rep := trajectory.Check(all)
	seqs := trajectory.Chains(all)
	if !rep.OK() || rep.TokenBreaks != 0 || rep.Replaced != 0 || len(seqs) != 1 || len(seqs[0].Calls) != len(all) {
		t.Fatalf("trajectory: %s %v; %d chains: want every call on one chain of token ids", rep, rep.Problems, len(seqs))
	}
	// Every call of the chain is the model server's answer there, in
	// order: the delivered entries of the task, less the one whose reply
	// the crash lost.
	var want []modelserver.Entry
	for _, e := range f.ms.Ledger() {
		if e.Task == id && !e.Delivered.IsZero() && e.Sent == len(e.TokenIDs) {
			want = append(want, e)
		}
	}
	if len(want) != len(all) {
		t.Fatalf("the trajectory holds %d calls, the model server delivered %d whole", len(all), len(want))
	}
	again := 0
	for i, c := range all {
		if !slices.Equal(c.AllPromptIDs, want[i].PromptTokenIDs) || !slices.Equal(c.CompletionIDs, want[i].TokenIDs) {
			t.Errorf("call %d (%s) is not the model server's answer %d (turn %d)", i+1, c.ID, i+1, want[i].Turn)
		}
		if i > 0 && !slices.Equal(c.AllPromptIDs[:len(all[i-1].AllPromptIDs)+len(all[i-1].CompletionIDs)], slices.Concat(all[i-1].AllPromptIDs, all[i-1].CompletionIDs)) {
			t.Errorf("call %s: its prompt ids do not begin with %s's prompt and completion", c.ID, all[i-1].ID)
		}
		if slices.Equal(c.AllPromptIDs, inFlight.PromptTokenIDs) {
			again++
			if c.Episode+"."+c.Launch != o.res.Launches[len(o.res.Launches)-1].ID {
				t.Errorf("call %s asks turn %d, whose reply the crash lost, from launch %s.%s: want the relaunch's re-issue alone",
					c.ID, inFlight.Turn, c.Episode, c.Launch)
			}
		}
	}
	if again != 1 {
		t.Errorf("the call of turn %d (in flight at the crash) is in the trajectory %d times, want once (its re-issue)", inFlight.Turn, again)
	}
	if n := len(f.ms.Ledger()) - len(want); n != 1 {
		t.Errorf("%d calls of the model server undelivered, want the one the crash lost", n)
	}
}

// readTrajectory reads and indexes the trajectory ref names.
func readTrajectory(ctx context.Context, t *testing.T, f *fleet, ref *agentapi.TrajectoryRef) *trajectory.Index {
	t.Helper()
	if ref == nil {
		t.Fatal("the result names no trajectory")
	}
	data, err := ref.Read(ctx, f.env.Bus)
	if err != nil {
		t.Fatal(err)
	}
	x, err := trajectory.Read(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return x
}
