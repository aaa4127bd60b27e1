package sandboxd

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// slowFreezeHost is the Linux host, but each launch's freeze does not take
// hold until its context ends, and then answers as a freeze whose wait was
// cut: a freeze that takes long (a loaded machine), which a stop cuts
// short.
type slowFreezeHost struct {
	host
	waiting chan struct{}
}

func (h slowFreezeHost) start(s startSpec) (hostLaunch, error) {
	hl, err := h.host.start(s)
	if err != nil {
		return nil, err
	}
	return slowFreezeLaunch{hl, h.waiting}, nil
}

type slowFreezeLaunch struct {
	hostLaunch
	waiting chan struct{}
}

func (l slowFreezeLaunch) pause(ctx context.Context, mode sandboxapi.Mode, o pauseOpts) (pauseOutcome, error) {
	if mode != sandboxapi.ModeFreeze {
		return l.hostLaunch.pause(ctx, mode, o)
	}
	close(l.waiting)
	<-ctx.Done()
	// What a freeze whose wait for "frozen 1" the context cut returns,
	// once it thawed the cgroup again (linuxLaunch.freeze): a real freeze
	// of a sleeping process may take hold at once, before the cut.
	return pauseOutcome{fallback: "freeze: " + ctx.Err().Error()}, nil
}

// A stop that comes while a pause is still taking hold cuts the pause short:
// the pause answers ErrStopping (the launch ends; a checkpoint waits for
// that), never ErrUnconfirmed, which would read as a pause the kernel did
// not confirm and have its daemon stop the launch as a fallback.
func TestPauseCutShortByAStopIsStopping(t *testing.T) {
	cfg := Config{Mode: sandboxapi.ModeFreeze, StateDir: t.TempDir(), CgroupRoot: testCgroupRoot(t), Grace: 2 * time.Second}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	waiting := make(chan struct{})
	s.host = slowFreezeHost{s.host, waiting}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("Run: %v", err)
		}
		checkNothingLeft(t)
	})
	id := launchID(t, "a")
	mustLaunch(t, s, Spec{ID: id, Command: "sleep 60"})
	paused := make(chan error, 1)
	go func() {
		_, err := s.Pause(ctxT(t), id, sandboxapi.ModeDefault)
		paused <- err
	}()
	<-waiting
	stopped := make(chan error, 1)
	go func() {
		_, err := s.Stop(ctxT(t), id)
		stopped <- err
	}()
	if err := <-paused; !errors.Is(err, ErrStopping) || errors.Is(err, ErrUnconfirmed) {
		t.Fatalf("Pause cut short by a stop: %v; want ErrStopping, not ErrUnconfirmed", err)
	}
	if err := <-stopped; err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if rec, err := s.Status(id); err != nil || rec.State != sandboxapi.StateEnded {
		t.Fatalf("after the stop: %+v, %v; want ended", rec, err)
	}
}
