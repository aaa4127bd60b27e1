package collect

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/client"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// restartingBridge is the bridge as a collector sees it across a restart:
// the first checkpoint goes to bridge one, which dies in the middle of
// the commit (its context ends: it publishes nothing more, as after a
// kill), and the collector gets the error the HTTP client gives when the
// connection drops; everything after goes to bridge two, started on the
// same bus.
type restartingBridge struct {
	Controller
	first   *bridge.Bridge
	kill    func()        // ends bridge one's request
	writing chan struct{} // a member is writing the commit's records
	release func()        // lets the member finish the write

	mu    sync.Mutex
	calls int
}

func (r *restartingBridge) Checkpoint(ctx context.Context, req bridgeapi.CheckpointRequest) (*bridgeapi.CheckpointResult, error) {
	r.mu.Lock()
	r.calls++
	n := r.calls
	r.mu.Unlock()
	if n > 1 {
		return r.Controller.Checkpoint(ctx, req)
	}
	ctx1, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { _, err := r.first.Checkpoint(ctx1, req); done <- err }()
	<-r.writing
	cancel()
	r.kill()
	<-done
	r.release()
	return nil, errors.New("client: POST /v1/checkpoints: EOF")
}

func startBridge(t *testing.T, env *jstest.Env, run string) (*bridge.Bridge, func()) {
	t.Helper()
	return startBridgeWith(t, env, run, 30*time.Second)
}

// startBridgeWith is startBridge with phases of the given deadline.
func startBridgeWith(t *testing.T, env *jstest.Env, run string, phase time.Duration) (*bridge.Bridge, func()) {
	t.Helper()
	nc, js := env.Connect(t)
	b, err := bridge.New(bridge.Config{Run: run, Conn: nc, JS: js, Bus: env.Bus, PhaseTimeout: phase,
		Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return b, stop
}

// TestCheckpointAnsweredAfterABridgeRestart: the bridge dies in the
// middle of a commit, so the collector's request gets no answer; the
// collector asks the next bridge what became of the checkpoint it named,
// and its summary holds that checkpoint once, committed, under its id,
// with the timings the bridge recorded (no blank-id failed row, none
// missing from the count).
func TestCheckpointAnsweredAfterABridgeRestart(t *testing.T) {
	const run = "restart"
	env := jstest.Start(t)
	hs := membertest.StartMembers(t, env, run, 1, membertest.Options{Episodes: 1})
	writing, hold := make(chan struct{}), make(chan struct{})
	var entered, released sync.Once
	hs[0].Participant.SetWriteHook(func(ctx context.Context, _ string, _ int) {
		entered.Do(func() { close(writing) })
		select {
		case <-hold:
		case <-ctx.Done():
		}
	})
	one, killOne := startBridge(t, env, run)
	two, _ := startBridge(t, env, run)
	ctl := &restartingBridge{Controller: two, first: one, kill: killOne, writing: writing,
		release: func() { released.Do(func() { close(hold) }) }}
	t.Cleanup(ctl.release)

	c := &Collector{cfg: Config{Run: run, Controller: ctl}, log: zerolog.New(zerolog.NewTestWriter(t)), redrawNow: make(chan struct{}, 1)}
	res := c.checkpoint(t.Context(), false)
	if res == nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("checkpoint after the restart: %+v", res)
	}
	if len(c.sum.Checkpoints) != 1 {
		t.Fatalf("summary rows %+v, want the one checkpoint", c.sum.Checkpoints)
	}
	row := c.sum.Checkpoints[0]
	got, err := two.Get(t.Context(), row.ID)
	if err != nil {
		t.Fatalf("the bridge does not know the summary's checkpoint %q: %v", row.ID, err)
	}
	if row.ID == "" || row.ID != res.CheckpointID || row.Status != bridgeapi.StatusCommitted {
		t.Errorf("summary row %+v, want checkpoint %s committed", row, res.CheckpointID)
	}
	if row.PrepareMS != got.PrepareMS || row.CommitMS != got.CommitMS || row.CommitMS <= 0 {
		t.Errorf("summary timings prepare %d commit %d ms, the bridge recorded %d and %d ms", row.PrepareMS, row.CommitMS, got.PrepareMS, got.CommitMS)
	}
	if ctl.calls != 2 {
		t.Errorf("%d checkpoint requests, want the lost one and one more", ctl.calls)
	}
}

// TestAnswerLost: only what leaves a checkpoint's fate unknown is asked
// again; a bridge's decided refusal is not.
func TestAnswerLost(t *testing.T) {
	for _, c := range []struct {
		err  error
		lost bool
	}{
		{errors.New("client: POST /v1/checkpoints: EOF"), true},
		{&client.Error{Status: 503, Code: "cancelled"}, true},
		{&client.Error{Status: 409, Code: "checkpoint_conflict"}, false},
		{bridgeapi.ErrBusy, false},
		{context.Canceled, false},
	} {
		if got := answerLost(c.err); got != c.lost {
			t.Errorf("answerLost(%v) = %v, want %v", c.err, got, c.lost)
		}
	}
}
