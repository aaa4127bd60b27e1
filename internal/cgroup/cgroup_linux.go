package cgroup

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/procfs"
)

// Mount returns where the cgroup v2 hierarchy is mounted, the first
// cgroup2 file system of /proc/self/mountinfo. None is ErrNoCgroup2.
func Mount() (string, error) {
	ms, err := procfs.Mounts()
	if err != nil {
		return "", fmt.Errorf("cgroup: %w", err)
	}
	for _, m := range ms {
		if m.FSType == "cgroup2" {
			return m.Point, nil
		}
	}
	return "", fmt.Errorf("%w: no cgroup2 file system in /proc/self/mountinfo (mount one: mount -t cgroup2 none /sys/fs/cgroup/unified)", ErrNoCgroup2)
}

// Self returns the cgroup v2 directory the calling process lives in: the
// "0::" line of /proc/self/cgroup joined to the cgroup2 mount whose root
// holds it. No membership, or no mount that shows it, is ErrNoCgroup2.
func Self() (Dir, error) {
	path, err := procfs.SelfCgroup()
	if err != nil {
		return "", fmt.Errorf("cgroup: %w", err)
	}
	if path == "" {
		return "", fmt.Errorf("%w: no cgroup v2 membership in /proc/self/cgroup", ErrNoCgroup2)
	}
	ms, err := procfs.Mounts()
	if err != nil {
		return "", fmt.Errorf("cgroup: %w", err)
	}
	for _, m := range ms {
		if m.FSType != "cgroup2" {
			continue
		}
		rel, ok := strings.CutPrefix(path, m.Root)
		if !ok || rel != "" && m.Root != "/" && rel[0] != '/' {
			continue
		}
		dir := filepath.Join(m.Point, rel)
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			return Dir(dir), nil
		}
	}
	return "", fmt.Errorf("%w: no cgroup2 mount holds this process's cgroup %s", ErrNoCgroup2, path)
}

// Create makes the cgroup at path; its parent must be a cgroup. One that
// exists already is an error matching fs.ErrExist.
func Create(path string) (Dir, error) {
	if err := os.Mkdir(path, 0o755); err != nil {
		return "", err
	}
	return Dir(path), nil
}

// OpenFD opens the directory for clone3's CLONE_INTO_CGROUP
// (syscall.SysProcAttr's UseCgroupFD and CgroupFD); the caller closes it.
func (d Dir) OpenFD() (int, error) {
	fd, err := unix.Open(string(d), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, &os.PathError{Op: "open", Path: string(d), Err: err}
	}
	return fd, nil
}

// Check reports whether the cgroup offers what this package drives:
// cgroup.events to read, cgroup.freeze and cgroup.kill to write.
func (d Dir) Check() error {
	if _, err := d.Events(); err != nil {
		return err
	}
	for _, f := range []string{"cgroup.freeze", "cgroup.kill"} {
		path := filepath.Join(string(d), f)
		fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return &os.PathError{Op: "open", Path: path, Err: err}
		}
		unix.Close(fd)
	}
	return nil
}

// write writes v to one of the cgroup's files, which must exist.
func (d Dir) write(file, v string) error {
	path := filepath.Join(string(d), file)
	fd, err := unix.Open(path, unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(v)); err != nil {
		return &os.PathError{Op: "write", Path: path, Err: err}
	}
	return nil
}

// Add moves process pid (all its threads) into the cgroup.
func (d Dir) Add(pid int) error { return d.write("cgroup.procs", strconv.Itoa(pid)) }

// SetFreeze writes cgroup.freeze and returns without waiting.
func (d Dir) SetFreeze(on bool) error {
	if on {
		return d.write("cgroup.freeze", "1")
	}
	return d.write("cgroup.freeze", "0")
}

// Freeze freezes the cgroup and waits until the kernel reports it frozen.
// A freeze that is not confirmed by the deadline (ErrTimeout) or that ctx
// cuts short is undone (cgroup.freeze 0, not waited for).
func (d Dir) Freeze(ctx context.Context, deadline time.Time) error {
	if err := d.SetFreeze(true); err != nil {
		return err
	}
	ok, err := d.WaitEvents(ctx, deadline, func(e Events) bool { return e.Frozen })
	if err == nil && !ok {
		err = fmt.Errorf("%w: %s not frozen", ErrTimeout, d)
	}
	if err != nil {
		return errors.Join(err, d.SetFreeze(false))
	}
	return nil
}

// Thaw thaws the cgroup and waits until the kernel reports it thawed; not
// by the deadline is ErrTimeout.
func (d Dir) Thaw(ctx context.Context, deadline time.Time) error {
	if err := d.SetFreeze(false); err != nil {
		return err
	}
	ok, err := d.WaitEvents(ctx, deadline, func(e Events) bool { return !e.Frozen })
	if err == nil && !ok {
		err = fmt.Errorf("%w: %s still frozen", ErrTimeout, d)
	}
	return err
}

// Kill SIGKILLs every process of the cgroup and of the cgroups below it,
// frozen or not, through cgroup.kill; on kernels without it (before 5.14)
// it signals each process listed. It does not wait: the cgroup is empty
// once Events says not populated.
func (d Dir) Kill() error {
	err := d.write("cgroup.kill", "1")
	if errors.Is(err, fs.ErrNotExist) {
		return d.killEach()
	}
	return err
}

func (d Dir) killEach() error {
	pids, err := d.AllProcs()
	if err != nil {
		return err
	}
	if _, err := os.Stat(string(d)); err != nil {
		return err
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return nil
}

// Events reads cgroup.events.
func (d Dir) Events() (Events, error) {
	b, err := os.ReadFile(filepath.Join(string(d), "cgroup.events"))
	if err != nil {
		return Events{}, err
	}
	return parseEvents(b), nil
}

// WaitEvents waits until cond holds for cgroup.events, until the deadline
// passes (false, nil) or until ctx ends (false, its error), and reports
// whether cond held. It sleeps in ppoll(POLLPRI), which the kernel wakes
// when cgroup.events changes, and re-reads the file after a short interval
// (50 µs, doubling to 1 ms) as well: the kernel sends at most one
// notification per 10 ms per file (cgroup_file_notify,
// CGROUP_FILE_NOTIFY_MIN_INTV), so a freeze that follows a thaw within
// 10 ms would otherwise be seen up to 10 ms late.
func (d Dir) WaitEvents(ctx context.Context, deadline time.Time, cond func(Events) bool) (bool, error) {
	path := filepath.Join(string(d), "cgroup.events")
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	var buf [256]byte
	interval := 50 * time.Microsecond
	for {
		n, err := unix.Pread(fd, buf[:], 0)
		if err != nil {
			return false, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if cond(parseEvents(buf[:n])) {
			return true, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false, nil
		}
		if err := ctx.Err(); err != nil {
			return false, err
		}
		ts := unix.NsecToTimespec(int64(min(left, interval)))
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLPRI}}
		if _, err := unix.Ppoll(pfd, &ts, nil); err != nil && err != unix.EINTR {
			return false, os.NewSyscallError("ppoll", err)
		}
		interval = min(2*interval, time.Millisecond)
	}
}

// Procs lists the processes in the cgroup itself (its cgroup.procs), not
// in the cgroups below it.
func (d Dir) Procs() ([]int, error) {
	b, err := os.ReadFile(filepath.Join(string(d), "cgroup.procs"))
	if err != nil {
		return nil, err
	}
	return procfs.ParsePIDs(b, nil), nil
}

// AllProcs lists the processes of the cgroup and of every cgroup below it.
// A cgroup removed during the listing is left out; a missing d lists
// nothing.
func (d Dir) AllProcs() ([]int, error) {
	var out []int
	err := filepath.WalkDir(string(d), func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !e.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENODEV) {
				return nil
			}
			return err
		}
		out = procfs.ParsePIDs(b, out)
		return nil
	})
	return out, err
}

// Remove removes the cgroup and every cgroup below it, deepest first. A
// cgroup whose last process has just exited may refuse for a moment
// (EBUSY): each removal is retried until the deadline or until ctx ends.
// It goes on past a cgroup it cannot remove and returns every failure; a
// missing cgroup is not one.
func (d Dir) Remove(ctx context.Context, deadline time.Time) error {
	var dirs []string
	var errs []error
	err := filepath.WalkDir(string(d), func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
			return nil
		}
		if e.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	if err != nil {
		errs = append(errs, err)
	}
	for i := len(dirs) - 1; i >= 0; i-- { // WalkDir lists parents first
		if err := rmdir(ctx, dirs[i], deadline); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// rmdir removes one empty cgroup, retrying EBUSY with a back-off from
// 100 µs to 10 ms until deadline.
func rmdir(ctx context.Context, dir string, deadline time.Time) error {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	err := poll.Until(ctx, poll.Backoff(100*time.Microsecond, 10*time.Millisecond), func() (bool, error) {
		switch err := unix.Rmdir(dir); err {
		case nil, unix.ENOENT:
			return true, nil
		case unix.EBUSY:
			return false, nil
		default:
			return false, &os.PathError{Op: "rmdir", Path: dir, Err: err}
		}
	})
	if pe := (*os.PathError)(nil); err != nil && !errors.As(err, &pe) {
		return &os.PathError{Op: "rmdir", Path: dir, Err: unix.EBUSY} // still busy at the deadline
	}
	return err
}
