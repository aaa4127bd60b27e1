package collect

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
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

// failingOnceReleaser is the real bridge, behind which a member fails the
// first release (stopped past the phase's deadline, or failing) and
// releases once asked again.
type failingOnceReleaser struct {
	Controller
	member *membertest.Participant
	asked  atomic.Int32
}

func (f *failingOnceReleaser) Release(ctx context.Context, req bridgeapi.ReleaseRequest) (*bridgeapi.OpResult, error) {
	res, err := f.Controller.Release(ctx, req)
	if f.asked.Add(1) == 1 {
		f.member.FailRelease(nil)
	}
	return res, err
}

// The final release asks again when a member did not release: a failed
// release keeps the bridge's side (the checkpoints' manifests and
// records), so one given up on leaves the run's records behind. Asked
// again, it deletes them.
func TestFinalReleaseAsksAgainWhenAMemberDidNotRelease(t *testing.T) {
	const run = "relfail"
	env := jstest.Start(t)
	hs := membertest.StartMembers(t, env, run, 2, membertest.Options{Episodes: 1})
	b, _ := startBridge(t, env, run)
	res, err := b.Checkpoint(t.Context(), bridgeapi.CheckpointRequest{ID: "c1"})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("checkpoint: %+v %v", res, err)
	}
	if n := recordObjects(t, env, run); n != 2 {
		t.Fatalf("%d record objects after the checkpoint, want one a member", n)
	}
	hs[1].Participant.FailRelease(errors.New("snapshot store unreachable"))
	ctl := &failingOnceReleaser{Controller: b, member: hs[1].Participant}
	c := &Collector{cfg: Config{Run: run, Controller: ctl}, log: zerolog.New(zerolog.NewTestWriter(t))}
	c.finalRelease(t.Context())
	if n := ctl.asked.Load(); n != 2 {
		t.Fatalf("asked %d times, want 2: the failed release, then one that completed", n)
	}
	if n := recordObjects(t, env, run); n != 0 {
		t.Fatalf("%d record objects after the final release, want none", n)
	}
}

// recordObjects counts the objects of run in the shared records store.
func recordObjects(t *testing.T, env *jstest.Env, run string) int {
	t.Helper()
	infos, err := env.Bus.Records.List(t.Context())
	if errors.Is(err, natsjs.ErrNoObjectsFound) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, i := range infos {
		if strings.HasPrefix(i.Name, run+"/") && !i.Deleted {
			n++
		}
	}
	return n
}
