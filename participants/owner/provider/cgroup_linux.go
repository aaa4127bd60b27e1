//go:build linux

package provider

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// mountInfo is one line of /proc/self/mountinfo.
type mountInfo struct {
	point  string // mount point, unescaped
	fstype string
}

// readMounts parses /proc/self/mountinfo.
func readMounts() ([]mountInfo, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []mountInfo
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		sep := slices.Index(fields, "-")
		if len(fields) < 5 || sep < 0 || sep+1 >= len(fields) {
			continue
		}
		out = append(out, mountInfo{point: unescapeMount(fields[4]), fstype: fields[sep+1]})
	}
	return out, sc.Err()
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space, ...).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountsUnder returns the mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	ms, err := readMounts()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, m := range ms {
		if m.point == dir || strings.HasPrefix(m.point, dir+"/") {
			out = append(out, m.point)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return strings.Count(b, "/") - strings.Count(a, "/") })
	return out, nil
}

// cgroup2Mount returns where the cgroup v2 hierarchy is mounted (on hybrid
// hosts /sys/fs/cgroup/unified, on unified ones /sys/fs/cgroup).
func cgroup2Mount() (string, error) {
	ms, err := readMounts()
	if err != nil {
		return "", err
	}
	for _, m := range ms {
		if m.fstype == "cgroup2" {
			return m.point, nil
		}
	}
	return "", fmt.Errorf("no cgroup2 file system in /proc/self/mountinfo (mount one: mount -t cgroup2 none /sys/fs/cgroup/unified)")
}

// cgroup is the host path of a cgroup v2 directory.
type cgroup string

func (cg cgroup) write(file, v string) error {
	return os.WriteFile(filepath.Join(string(cg), file), []byte(v), 0)
}

// events reads cgroup.events.
func (cg cgroup) events() (populated, frozen bool, err error) {
	b, err := os.ReadFile(filepath.Join(string(cg), "cgroup.events"))
	if err != nil {
		return false, false, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, " ")
		switch k {
		case "populated":
			populated = v == "1"
		case "frozen":
			frozen = v == "1"
		}
	}
	return populated, frozen, nil
}

// poll calls done until it reports true, an error, or timeout passes,
// backing off from 100 µs to 20 ms between calls.
func poll(ctx context.Context, timeout time.Duration, done func() (bool, error)) error {
	return pollUpTo(ctx, timeout, 20*time.Millisecond, done)
}

// pollUpTo is poll with the longest wait between calls given.
func pollUpTo(ctx context.Context, timeout, longest time.Duration, done func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	wait := 100 * time.Microsecond
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return os.ErrDeadlineExceeded
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, longest)
	}
}

// freeze freezes the cgroup and waits until the kernel reports every
// process in it frozen. A freeze that does not confirm is undone.
func (cg cgroup) freeze(ctx context.Context, timeout time.Duration) error {
	if err := cg.write("cgroup.freeze", "1"); err != nil {
		return fmt.Errorf("%w: %w", ErrFreeze, err)
	}
	// A freeze takes about a millisecond per thousand tasks: look often,
	// so that a snapshot does not wait out a long back-off step.
	err := pollUpTo(ctx, timeout, time.Millisecond, func() (bool, error) {
		_, frozen, err := cg.events()
		return frozen, err
	})
	if err != nil {
		return errors.Join(fmt.Errorf("%w: %s: %w", ErrFreeze, cg, err), cg.thaw())
	}
	return nil
}

func (cg cgroup) thaw() error { return cg.write("cgroup.freeze", "0") }

// kill kills every process in the cgroup and its children and waits until
// it is empty.
func (cg cgroup) kill(ctx context.Context, timeout time.Duration) error {
	err := cg.write("cgroup.kill", "1")
	if errors.Is(err, fs.ErrNotExist) { // kernels before 5.14: signal each process
		err = cg.killEach()
	}
	if err != nil {
		return err
	}
	err = poll(ctx, timeout, func() (bool, error) {
		populated, _, err := cg.events()
		return !populated, err
	})
	if err != nil {
		return fmt.Errorf("cgroup %s still has processes: %w", cg, err)
	}
	return nil
}

func (cg cgroup) killEach() error {
	return filepath.WalkDir(string(cg), func(p string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		b, err := os.ReadFile(filepath.Join(p, "cgroup.procs"))
		if err != nil {
			return err
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		return nil
	})
}

// nsInit returns the pid of the process in the cgroup (not its children)
// that is pid 1 of its PID namespace: a sandbox's init, found without the
// process that started it. 0 if there is none.
func (cg cgroup) nsInit() int {
	b, err := os.ReadFile(filepath.Join(string(cg), "cgroup.procs"))
	if err != nil {
		return 0
	}
	for _, f := range strings.Fields(string(b)) {
		status, err := os.ReadFile("/proc/" + f + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if ns, ok := strings.CutPrefix(line, "NSpid:"); ok {
				ids := strings.Fields(ns)
				if len(ids) > 1 && ids[len(ids)-1] == "1" {
					pid, _ := strconv.Atoi(f)
					return pid
				}
			}
		}
	}
	return 0
}

// remove removes the cgroup and the child cgroups made inside it, deepest
// first. A missing cgroup is not an error.
func (cg cgroup) remove(ctx context.Context, timeout time.Duration) error {
	var dirs []string
	err := filepath.WalkDir(string(cg), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	slices.Reverse(dirs) // WalkDir lists parents before children
	for _, d := range dirs {
		err := poll(ctx, timeout, func() (bool, error) {
			err := unix.Rmdir(d)
			switch {
			case err == nil, errors.Is(err, unix.ENOENT):
				return true, nil
			case errors.Is(err, unix.EBUSY): // a dying process still counted
				return false, nil
			}
			return false, &os.PathError{Op: "rmdir", Path: d, Err: err}
		})
		if err != nil {
			return fmt.Errorf("remove cgroup %s: %w", d, err)
		}
	}
	return nil
}
