package collect

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// lostRestore loses the answer to the first restore, as a bridge killed
// mid-restore does: with done the restore ran first, without it never
// began.
type lostRestore struct {
	Controller
	done  bool
	mu    sync.Mutex
	calls int
}

func (l *lostRestore) Restore(ctx context.Context, req bridgeapi.RestoreRequest) (*bridgeapi.RestoreResult, error) {
	l.mu.Lock()
	l.calls++
	n := l.calls
	l.mu.Unlock()
	if n == 1 {
		if l.done {
			if _, err := l.Controller.Restore(ctx, req); err != nil {
				return nil, err
			}
		}
		return nil, errors.New("client: POST /v1/restore: EOF")
	}
	return l.Controller.Restore(ctx, req)
}

// A restore whose answer is lost (a bridge killed after publishing it) is
// found by its id: its outcome on the stream when the bridge ran it, or
// asked again when it never began.
func TestRestoreAnsweredAfterALostAnswer(t *testing.T) {
	for _, done := range []bool{true, false} {
		name := map[bool]string{true: "ran", false: "never-began"}[done]
		t.Run(name, func(t *testing.T) {
			const run = "lostrestore"
			env := jstest.Start(t)
			old := membertest.StartMembers(t, env, run, 2, membertest.Options{Episodes: 1})
			b, _ := startBridge(t, env, run)
			if res, err := b.Checkpoint(t.Context(), bridgeapi.CheckpointRequest{ID: "c1", Stop: true}); err != nil || res.Status != bridgeapi.StatusCommitted {
				t.Fatalf("%+v %v", res, err)
			}
			for _, h := range old {
				_ = h.Stop()
			}
			membertest.StartMembers(t, env, run, 2, membertest.Options{})
			ctl := &lostRestore{Controller: b, done: done}
			c := &Collector{cfg: Config{Run: run, Controller: ctl, JS: env.JS}, log: zerolog.New(zerolog.NewTestWriter(t))}
			id := c.nextRestoreID(time.Now())
			rr, err := c.askRestore(t.Context(), bridgeapi.RestoreRequest{ID: id})
			if err != nil {
				t.Fatalf("askRestore: %v", err)
			}
			if rr.RestoreID != id || rr.Status != bridgeapi.StatusCompleted || rr.Source != "c1" || len(rr.Restored) != 2 {
				t.Errorf("restore %s after the lost answer: %+v", id, rr)
			}
			want := map[bool]int{true: 1, false: 2}[done] // found on the stream; asked again
			if ctl.calls != want {
				t.Errorf("%d restore requests, want %d", ctl.calls, want)
			}
		})
	}
}

// A restore whose members take longer to install than a checkpoint's
// phase may (forks of many snapshots, microVMs on a busy machine) still
// completes: the collector asks it with its RestoreTimeout, not the
// bridge's phase deadline, and a restore that ran out would have started
// every unfinished rollout over.
func TestRestoreSlowerThanAPhase(t *testing.T) {
	const run = "slowrestore"
	env := jstest.Start(t)
	old := membertest.StartMembers(t, env, run, 2, membertest.Options{Episodes: 1})
	b, _ := startBridgeWith(t, env, run, time.Second)
	if res, err := b.Checkpoint(t.Context(), bridgeapi.CheckpointRequest{ID: "c1", Stop: true}); err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("%+v %v", res, err)
	}
	for _, h := range old {
		_ = h.Stop()
	}
	for _, h := range membertest.StartMembers(t, env, run, 2, membertest.Options{}) {
		h.Participant.SlowInstall(3 * time.Second) // three phase deadlines
	}
	c := &Collector{cfg: Config{Run: run, Controller: b, JS: env.JS, RestoreTimeout: time.Minute}, log: zerolog.New(zerolog.NewTestWriter(t))}
	req := c.restoreRequest(time.Now())
	if req.TimeoutMS != time.Minute.Milliseconds() {
		t.Fatalf("restore request %+v: want the collector's RestoreTimeout as its deadline", req)
	}
	rr, err := c.askRestore(t.Context(), req)
	if err != nil || rr.Status != bridgeapi.StatusCompleted || len(rr.Restored) != 2 {
		t.Fatalf("a restore slower than a phase's deadline: %+v %v", rr, err)
	}
}
