package sandboxd

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ownCgroupDir returns the cgroup v2 directory the calling process lives
// in: the "0::" line of /proc/self/cgroup joined to a cgroup2 mount from
// /proc/self/mountinfo (the hierarchy may be mounted at /sys/fs/cgroup or,
// on hybrid hosts, /sys/fs/cgroup/unified).
func ownCgroupDir() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	var path string
	for line := range strings.SplitSeq(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			path = p
			break
		}
	}
	if path == "" {
		return "", errors.New("no cgroup v2 membership in /proc/self/cgroup")
	}
	mi, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return "", err
	}
	defer mi.Close()
	sc := bufio.NewScanner(mi)
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		if !ok || !strings.HasPrefix(post, "cgroup2 ") {
			continue
		}
		f := strings.Fields(pre)
		if len(f) < 5 {
			continue
		}
		root, mnt := unescapeMount(f[3]), unescapeMount(f[4])
		rel, ok := strings.CutPrefix(path, root)
		if !ok || rel != "" && root != "/" && rel[0] != '/' {
			continue
		}
		dir := filepath.Join(mnt, rel)
		if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
			return dir, nil
		}
	}
	return "", errors.New("no cgroup2 mount holds this process's cgroup")
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
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

// prepareCgroupRoot creates root (default <own cgroup>/stillpoint-sandboxd)
// and checks that a child cgroup can be made there with cgroup.freeze and
// cgroup.kill writable. Any failure means freeze is unavailable.
func prepareCgroupRoot(root, name string) (string, error) {
	if root == "" {
		own, err := ownCgroupDir()
		if err != nil {
			return "", err
		}
		if name == "" {
			name = CgroupSubtree
		}
		root = filepath.Join(own, name)
	}
	if err := os.Mkdir(root, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	if _, err := os.Stat(filepath.Join(root, "cgroup.procs")); err != nil {
		return "", fmt.Errorf("%s is not a cgroup v2 directory: %w", root, err)
	}
	probe := filepath.Join(root, "probe-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(probe, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	defer os.Remove(probe)
	for _, f := range []string{"cgroup.freeze", "cgroup.kill"} {
		fd, err := unix.Open(filepath.Join(probe, f), unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", fmt.Errorf("%s: %w", f, err)
		}
		unix.Close(fd)
	}
	return root, nil
}

// cgroup is a launch's cgroup v2 directory.
type cgroup struct{ dir string }

// createLaunchCgroup makes <root>/launch-<id>. A leftover one that is
// empty is removed first (it may still be frozen); a populated one is an
// error.
func createLaunchCgroup(root, id string) (*cgroup, error) {
	c := &cgroup{dir: filepath.Join(root, "launch-"+id)}
	if _, err := os.Stat(c.dir); err == nil {
		if pop, _, err := c.events(); err != nil || pop {
			return nil, fmt.Errorf("cgroup %s exists and is populated", c.dir)
		}
		if err := c.remove(); err != nil {
			return nil, err
		}
	}
	if err := os.Mkdir(c.dir, 0o755); err != nil {
		return nil, err
	}
	return c, nil
}

func (c *cgroup) write(file, v string) error {
	fd, err := unix.Open(filepath.Join(c.dir, file), unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: filepath.Join(c.dir, file), Err: err}
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(v)); err != nil {
		return &os.PathError{Op: "write", Path: filepath.Join(c.dir, file), Err: err}
	}
	return nil
}

// setFreeze writes cgroup.freeze.
func (c *cgroup) setFreeze(on bool) error {
	if on {
		return c.write("cgroup.freeze", "1")
	}
	return c.write("cgroup.freeze", "0")
}

// kill writes cgroup.kill: SIGKILL to every process of the cgroup and its
// descendants, frozen or not.
func (c *cgroup) kill() error { return c.write("cgroup.kill", "1") }

func parseEvents(b []byte) (populated, frozen bool) {
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		k, v, ok := bytes.Cut(line, []byte(" "))
		if !ok {
			continue
		}
		switch string(k) {
		case "populated":
			populated = string(v) == "1"
		case "frozen":
			frozen = string(v) == "1"
		}
	}
	return populated, frozen
}

// events reads cgroup.events.
func (c *cgroup) events() (populated, frozen bool, err error) {
	b, err := os.ReadFile(filepath.Join(c.dir, "cgroup.events"))
	if err != nil {
		return false, false, err
	}
	populated, frozen = parseEvents(b)
	return populated, frozen, nil
}

// waitEvents waits until cond holds for cgroup.events, until the deadline,
// or until ctx ends, and returns whether cond held. It sleeps in
// ppoll(POLLPRI), which the kernel wakes when cgroup.events changes, but
// also re-reads the file after a short interval (50 µs, doubling to 1 ms):
// the kernel sends at most one notification per 10 ms per file
// (cgroup_file_notify, CGROUP_FILE_NOTIFY_MIN_INTV), so a freeze that
// follows a thaw within 10 ms would otherwise be seen up to 10 ms late.
func (c *cgroup) waitEvents(ctx context.Context, deadline time.Time, cond func(populated, frozen bool) bool) (bool, error) {
	path := filepath.Join(c.dir, "cgroup.events")
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

// procs lists the processes of the cgroup and of every cgroup below it.
func (c *cgroup) procs() ([]int, error) {
	var out []int
	err := filepath.WalkDir(c.dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		if !d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, unix.ENODEV) {
				return nil
			}
			return err
		}
		out = parsePIDs(b, out)
		return nil
	})
	return out, err
}

// contains reports whether process pid is in the cgroup or below it.
func (c *cgroup) contains(pid int, buf []byte) (bool, []byte) {
	b, err := readInto(procPath(pid, "/cgroup"), buf)
	if err != nil {
		return false, b
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		p, ok := bytes.CutPrefix(line, []byte("0::"))
		if !ok {
			continue
		}
		// The path is relative to the cgroup2 mount; compare suffixes.
		return strings.HasSuffix(c.dir, string(p)) || bytes.Contains(p, []byte("/"+filepath.Base(c.dir)+"/")), b
	}
	return false, b
}

// remove removes the cgroup and every cgroup below it, deepest first. A
// cgroup whose last process has just exited may refuse for a moment
// (EBUSY), so each removal is retried briefly.
func (c *cgroup) remove() error {
	var dirs []string
	_ = filepath.WalkDir(c.dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, path)
		}
		return nil
	})
	var errs []error
	for i := len(dirs) - 1; i >= 0; i-- {
		deadline := time.Now().Add(2 * time.Second)
		for {
			err := unix.Rmdir(dirs[i])
			if err == nil || err == unix.ENOENT {
				break
			}
			if err != unix.EBUSY || time.Now().After(deadline) {
				errs = append(errs, &os.PathError{Op: "rmdir", Path: dirs[i], Err: err})
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	return errors.Join(errs...)
}
