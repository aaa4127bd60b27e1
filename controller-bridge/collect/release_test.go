package collect

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// flakyReleaser is a bridge whose first releases are lost on the way (a
// bridge killed mid-release, then one finishing its predecessor's), then
// answered.
type flakyReleaser struct {
	noController
	lost  []error
	asked atomic.Int32
}

func (f *flakyReleaser) Release(context.Context, bridgeapi.ReleaseRequest) (*bridgeapi.OpResult, error) {
	n := int(f.asked.Add(1))
	if n <= len(f.lost) {
		return nil, f.lost[n-1]
	}
	return &bridgeapi.OpResult{Status: bridgeapi.StatusCompleted}, nil
}

// The final release asks again while the bridge's answer is lost or the
// bridge is busy finishing what its predecessor left (a bridge killed
// mid-release as the collection ends): left undone, the run's records and
// snapshots stay behind.
func TestFinalReleaseAsksAgainWhileTheBridgeRestarts(t *testing.T) {
	env := jstest.Start(t)
	nc, js := env.Connect(t)
	ctl := &flakyReleaser{lost: []error{errors.New("dial tcp 127.0.0.1:1: connect: connection refused"), bridgeapi.ErrBusy}}
	c, err := New(Config{Run: "rel", Tasks: []Task{{RolloutID: "r1"}}, Output: filepath.Join(t.TempDir(), "results.jsonl"),
		Agents: []string{"a1"}, Conn: nc, JS: js, Bus: env.Bus, Controller: ctl, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	c.finalRelease(t.Context())
	if n := ctl.asked.Load(); n != 3 {
		t.Fatalf("asked %d times, want 3: again after a lost answer and after busy, then answered", n)
	}
}
