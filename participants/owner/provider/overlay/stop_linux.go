//go:build linux

package overlay

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/procfs"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// teardown removes everything of sandbox id. It runs to the end even if a
// step fails, so that a retry has less to do, and it is bounded by
// StopTimeout per wait rather than by a caller's context: a half-done
// teardown is worse than a late one.
func (o *Provider) teardown(id string, box *overlayBox) error {
	ctx := context.Background()
	timeout := o.cfg.StopTimeout
	dir, cg := o.dir(id), o.cgroup(id)
	var errs []error
	_, err := os.Lstat(string(cg))
	hasCgroup := err == nil
	if hasCgroup {
		if err := cg.SetFreeze(false); err != nil {
			errs = append(errs, err)
		}
	}
	// The init first: its death makes the kernel kill the PID namespace,
	// and nsenter, still alive, reaps the child it forked into it. Killed
	// in one sweep with the cgroup, that child would be reparented outside
	// the namespace and the init's exit would wait until the host's init
	// got round to reaping it.
	if box.proc != nil {
		_ = box.proc.Signal(syscall.SIGKILL) // through its pidfd: never a reused pid
	} else if hasCgroup {
		if pid := nsInit(cg); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if box.Done != nil {
		t := time.NewTimer(timeout)
		select {
		case <-box.Done:
		case <-t.C:
			errs = append(errs, fmt.Errorf("%w: init %d of %s did not exit", provider.ErrLeftover, box.Sandbox.InitPID, id))
		}
		t.Stop()
	}
	if hasCgroup {
		if err := killCgroup(ctx, cg, timeout); err != nil {
			errs = append(errs, err)
		}
	}
	if err := cg.Remove(ctx, time.Now().Add(timeout)); err != nil {
		errs = append(errs, err)
	}
	if err := unmountUnder(ctx, dir, timeout); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(dir); err != nil {
		errs = append(errs, err)
	}
	// Confirm.
	if _, err := os.Lstat(string(cg)); !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("%w: cgroup %s", provider.ErrLeftover, cg))
	}
	if ms, err := mountsUnder(dir); err != nil || len(ms) > 0 {
		errs = append(errs, fmt.Errorf("%w: mounts %v under %s (%v)", provider.ErrLeftover, ms, dir, err))
	}
	if _, err := os.Lstat(dir); !errors.Is(err, fs.ErrNotExist) {
		errs = append(errs, fmt.Errorf("%w: directory %s", provider.ErrLeftover, dir))
	}
	// Its image's hold last, once nothing stands on the layers (a retry
	// of a teardown that left something releases it): also that of a
	// sandbox an earlier process left, whose image is unknown.
	if len(errs) == 0 {
		if err := o.release(o.sandboxHolder(id)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killCgroup kills every process in cg and below it and waits until the
// kernel reports it empty.
func killCgroup(ctx context.Context, cg cgroup.Dir, timeout time.Duration) error {
	if err := cg.Kill(); err != nil {
		return err
	}
	ok, err := cg.WaitEvents(ctx, time.Now().Add(timeout), func(e cgroup.Events) bool { return !e.Populated })
	if err == nil && !ok {
		err = os.ErrDeadlineExceeded
	}
	if err != nil {
		return fmt.Errorf("cgroup %s still has processes: %w", cg, err)
	}
	return nil
}

// mountsUnder returns the mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	ms, err := procfs.Mounts()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range ms {
		if m.Point == dir || strings.HasPrefix(m.Point, dir+"/") {
			out = append(out, m.Point)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return out, nil
}

// unmountUnder unmounts every mount at or below dir, deepest first. A
// mount that stays busy past half the timeout is detached (MNT_DETACH):
// it leaves the mount table now and the kernel frees it when its last user
// lets go.
func unmountUnder(ctx context.Context, dir string, timeout time.Duration) error {
	ms, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	var errs []error
	for _, m := range ms {
		pctx, cancel := context.WithTimeoutCause(ctx, timeout/2, os.ErrDeadlineExceeded)
		err := poll.Until(pctx, poll.Backoff(100*time.Microsecond, 20*time.Millisecond), func() (bool, error) {
			err := unix.Unmount(m, 0)
			switch {
			case err == nil, errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
				return true, nil
			case errors.Is(err, unix.EBUSY):
				return false, nil
			}
			return false, err
		})
		cancel()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			err = unix.Unmount(m, unix.MNT_DETACH)
		}
		if err != nil {
			errs = append(errs, &os.PathError{Op: "umount", Path: m, Err: err})
		}
	}
	return errors.Join(errs...)
}
