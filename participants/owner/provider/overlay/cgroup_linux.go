//go:build linux

package overlay

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/internal/procfs"
)

// The default cgroup parent, <cgroup v2>/stillpoint-sandboxes/<h>, is one
// provider's (h names its StateDir): it holds that provider's sandbox
// cgroups, is made when a sandbox (or Default's probe) needs it, and is
// removed when no sandbox is left in it. An owner killed with -9 leaves it
// behind. To tell such a leftover from the parent of a live owner, a
// provider marks its default parent with its process identity (the
// extended attribute ownerXattr, "<pid>:<start>", where cgroupfs keeps
// them) and, when it drops its own, removes the parents beside it whose
// mark names a process that is gone and that hold no cgroup. A parent
// without the mark is never removed by another provider. Each removal is
// one rmdir, which fails while the parent holds a sandbox's cgroup, so a
// live owner that has just made its sandbox's cgroup there keeps it; one
// that is making it sees its mkdir fail with ENOENT and makes both again.

// ownerXattr is the extended attribute that names the process using a
// default cgroup parent.
const ownerXattr = "user.stillpoint.owner"

// createAttempts bounds how often the parent and a sandbox's cgroup are
// made again after a concurrent removal of the parent.
const createAttempts = 50

// selfMark is this process's identity, "<pid>:<start>" (start time in
// clock ticks since boot, as /proc/<pid>/stat has it).
func selfMark() (string, error) {
	st, _, err := procfs.ReadStat(os.Getpid(), nil)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%d:%d", os.Getpid(), st.Start), nil
}

// markAlive reports whether the process a mark names is still there. A
// mark that does not parse names nobody that can be checked: it counts as
// alive, and its parent is left alone.
func markAlive(mark string) bool {
	pidS, startS, ok := strings.Cut(mark, ":")
	pid, err1 := strconv.Atoi(pidS)
	start, err2 := strconv.ParseUint(startS, 10, 64)
	if !ok || err1 != nil || err2 != nil || pid <= 0 {
		return true
	}
	st, _, err := procfs.ReadStat(pid, nil)
	return err == nil && st.Start == start
}

// makeParent creates the cgroup parent where it is missing and marks a
// default one as this process's (best effort: without the mark it is
// simply never reaped by another).
func (o *Provider) makeParent() error {
	if err := os.MkdirAll(o.cfg.CgroupParent, 0o755); err != nil {
		return err
	}
	if o.defaultParent {
		if mark, err := selfMark(); err == nil {
			_ = unix.Setxattr(o.cfg.CgroupParent, ownerXattr, []byte(mark), 0)
		}
	}
	return nil
}

// createCgroup makes cg in the parent, and the parent where missing. A
// concurrent removal of the empty parent (the last Stop of this provider,
// or another provider reaping it) fails the mkdir with ENOENT, and both
// are made again.
func (o *Provider) createCgroup(cg cgroup.Dir) error {
	var err error
	for range createAttempts {
		if err = o.makeParent(); err != nil {
			return err
		}
		if _, err = cgroup.Create(string(cg)); !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return err
}

// dropParent removes a default parent once it is empty (it fails while a
// sandbox is left on disk, or another Start has just made its cgroup), and
// the leftovers of owners that are gone beside it.
func (o *Provider) dropParent() {
	if !o.defaultParent {
		return
	}
	_ = unix.Rmdir(o.cfg.CgroupParent)
	reapParents(filepath.Dir(o.cfg.CgroupParent))
}

// reapParents removes the cgroups in dir whose owner mark names a process
// that is gone and that hold no cgroup (one rmdir each: one that holds a
// cgroup or a process refuses).
func reapParents(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	buf := make([]byte, 64)
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		p := filepath.Join(dir, e.Name())
		n, err := unix.Getxattr(p, ownerXattr, buf)
		if err != nil || markAlive(string(buf[:n])) {
			continue
		}
		_ = unix.Rmdir(p)
	}
}
