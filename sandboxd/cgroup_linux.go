package sandboxd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"time"

	"github.com/stillpoint/stillpoint/internal/cgroup"
)

// removeTimeout bounds the removal of a launch's cgroup: a cgroup whose
// last process has just exited refuses rmdir for a moment (EBUSY).
const removeTimeout = 2 * time.Second

// prepareCgroupRoot creates root (default <own cgroup>/stillpoint-sandboxd)
// and checks that a child cgroup can be made there with cgroup.freeze and
// cgroup.kill writable. Any failure means freeze is unavailable.
func prepareCgroupRoot(root, name string) (cgroup.Dir, error) {
	dir := cgroup.Dir(root)
	if root == "" {
		own, err := cgroup.Self()
		if err != nil {
			return "", err
		}
		if name == "" {
			name = CgroupSubtree
		}
		dir = own.Child(name)
	}
	if _, err := cgroup.Create(string(dir)); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	if _, err := os.Stat(string(dir.Child("cgroup.procs"))); err != nil {
		return "", fmt.Errorf("%s is not a cgroup v2 directory: %w", dir, err)
	}
	probe := dir.Child("probe-" + strconv.Itoa(os.Getpid()))
	if _, err := cgroup.Create(string(probe)); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	defer os.Remove(string(probe))
	if err := probe.Check(); err != nil {
		return "", err
	}
	return dir, nil
}

// createLaunchCgroup makes <root>/launch-<id>. A leftover one that is
// empty is removed first (it may still be frozen); a populated one is an
// error.
func createLaunchCgroup(root cgroup.Dir, id string) (cgroup.Dir, error) {
	c := root.Child("launch-" + id)
	if _, err := os.Stat(string(c)); err == nil {
		if ev, err := c.Events(); err != nil || ev.Populated {
			return "", fmt.Errorf("cgroup %s exists and is populated", c)
		}
		if err := removeCgroup(c); err != nil {
			return "", err
		}
	}
	return cgroup.Create(string(c))
}

// removeCgroup removes a launch's cgroup and every cgroup below it.
func removeCgroup(c cgroup.Dir) error {
	return c.Remove(context.Background(), time.Now().Add(removeTimeout))
}
