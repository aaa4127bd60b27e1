package sandboxd

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// thawFailsHost is the Linux host, but each launch's freeze reports what a
// freeze that did not take hold in time and whose undo failed reports,
// while the cgroup is really left frozen: the one outcome the kernel does
// not give on demand.
type thawFailsHost struct{ host }

func (h thawFailsHost) start(s startSpec) (hostLaunch, error) {
	hl, err := h.host.start(s)
	if err != nil {
		return nil, err
	}
	return thawFailsLaunch{hl}, nil
}

type thawFailsLaunch struct{ hostLaunch }

func (l thawFailsLaunch) pause(ctx context.Context, mode sandboxapi.Mode, o pauseOpts) (pauseOutcome, error) {
	out, err := l.hostLaunch.pause(ctx, mode, o)
	if mode != sandboxapi.ModeFreeze || err != nil || !out.confirmed {
		return out, err
	}
	return pauseOutcome{fallback: "freeze: not frozen in time; thaw: injected", thawErr: errors.New("injected: the thaw did not confirm")}, nil
}

// A hold whose freeze did not take hold and whose undo (the thaw) failed
// is not taken for a plain hold: it is counted frozen, so that the
// continue thaws the launch again, and the launch runs after it (a plain
// hold would have left it frozen behind a continue that said it runs).
func TestHoldWhoseThawFailedIsThawedByTheContinue(t *testing.T) {
	cfg := Config{Mode: sandboxapi.ModeFreeze, StateDir: t.TempDir(), CgroupRoot: testCgroupRoot(t), Grace: 2 * time.Second}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.host = thawFailsHost{s.host}
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
	file := filepath.Join(t.TempDir(), "f")
	id := launchID(t, "a")
	mustLaunch(t, s, Spec{ID: id, Command: `while :; do echo x >> ` + file + `; sleep 0.01; done`,
		Mode: sandboxapi.ModeHold, Freeze: true, FreezeWait: time.Second})
	poll.Wait(t, 5*time.Second, "the writer", func() bool { return fileSize(file) > 0 })
	rep, err := s.Pause(ctxT(t), id, sandboxapi.ModeDefault)
	if err != nil || rep.State != sandboxapi.StatePaused || !rep.Frozen {
		t.Fatalf("Pause: %+v, %v; want paused and counted frozen", rep, err)
	}
	rec, _ := s.Status(id)
	if ev, err := cgroup.Dir(rec.Cgroup).Events(); err != nil || !ev.Frozen {
		t.Fatalf("the test's freeze did not hold: %+v, %v", ev, err)
	}
	if _, err := s.Continue(ctxT(t), id); err != nil {
		t.Fatalf("Continue: %v", err)
	}
	if ev, err := cgroup.Dir(rec.Cgroup).Events(); err != nil || ev.Frozen {
		t.Fatalf("the launch is still frozen after the continue: %+v, %v", ev, err)
	}
	n := fileSize(file)
	poll.Wait(t, 5*time.Second, "the launch to write again", func() bool { return fileSize(file) > n })
	if _, err := s.Cancel(ctxT(t), id); err != nil {
		t.Fatal(err)
	}
}

// A freeze wait over the supervisor's pending timeout is refused: it
// would hold a prepare that long.
func TestLaunchRefusesAFreezeWaitOverThePendingTimeout(t *testing.T) {
	s := startSupervisor(t, Config{Mode: sandboxapi.ModeStop, NoCgroup: true, PendingTimeout: 10 * time.Second})
	_, err := s.Launch(ctxT(t), Spec{ID: launchID(t, "a"), Command: "true", Mode: sandboxapi.ModeHold, Freeze: true, FreezeWait: 11 * time.Second})
	if !errors.Is(err, ErrInvalidSpec) {
		t.Fatalf("Launch with a freeze wait of 11 s over a pending timeout of 10 s: %v, want ErrInvalidSpec", err)
	}
}
