//go:build linux

package overlay

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/cgroup"
)

// Probe is a trial run of what the provider needs: it mounts an overlay
// of an empty directory and makes a cgroup under CgroupParent, checks that
// it can freeze and be killed, and removes both (and the parent, as Stop
// of the last sandbox does).
func (o *Provider) Probe() (err error) {
	dir, err := os.MkdirTemp(o.cfg.StateDir, ".probe-")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, os.RemoveAll(dir)) }()
	var paths [4]string
	for i, n := range []string{"lower", "upper", "work", "merged"} {
		paths[i] = filepath.Join(dir, n)
		if err := os.Mkdir(paths[i], 0o700); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s,%s", paths[0], paths[1], paths[2], overlayOptions)
	if err := unix.Mount("overlay", paths[3], "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay: %w", err)
	}
	if err := unix.Unmount(paths[3], 0); err != nil {
		return fmt.Errorf("unmount overlay: %w", err)
	}
	// The parent it made goes again (unless a sandbox left on disk is in
	// it): an owner that never starts a sandbox leaves no cgroup.
	defer o.dropParent()
	cg := cgroup.Dir(o.cfg.CgroupParent).Child(filepath.Base(dir))
	if err := o.createCgroup(cg); err != nil {
		return fmt.Errorf("make cgroup: %w", err)
	}
	defer func() { err = errors.Join(err, unix.Rmdir(string(cg))) }()
	if err := cg.Check(); err != nil {
		return fmt.Errorf("cgroup %s: %w", cg, err)
	}
	return nil
}
