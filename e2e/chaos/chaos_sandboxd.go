package chaos

import (
	"context"
	"errors"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
)

// daemonWait is how long a sandboxd fault waits for a sandbox daemon to
// run at its point: at a restore the old sandboxes are gone and the
// forks' daemons are starting.
const daemonWait = 15 * time.Second

// sandboxTargets returns the processes a sandboxd or harness fault may
// kill now: the run's sandbox daemons, or the processes they launched. A
// sandboxd fault waits up to daemonWait for one.
func sandboxTargets(ctx context.Context, run string, p plannedFault) ([]int, error) {
	within := time.Duration(0)
	if p.kind == FaultSandboxd {
		within = daemonWait
	}
	wctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	var pids []int
	err := poll.Until(wctx, poll.Every(100*time.Millisecond), func() (bool, error) {
		daemons, launched, err := sandboxProcesses(run)
		if err != nil {
			return false, err
		}
		pids = daemons
		if p.kind == FaultHarness {
			pids = launched
		}
		return len(pids) > 0, nil
	})
	if len(pids) > 0 {
		return pids, nil
	}
	if err != nil && wctx.Err() == nil {
		return nil, err
	}
	return nil, errors.New("no such process running")
}
