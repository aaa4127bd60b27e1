//go:build linux

package provider

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/cgroup"
)

// Default chooses the provider to use with state under stateDir: the
// overlay provider when the process is root on Linux and a trial run
// works (mount an overlay, make a cgroup that can freeze), the dir
// provider otherwise. It returns exactly one of the two (unless it fails);
// its Reason method says which and why.
func Default(stateDir string) (*Overlay, *Dir, error) {
	why := ""
	if euid := os.Geteuid(); euid != 0 {
		why = fmt.Sprintf("dir: not root (euid %d); the overlay provider needs root", euid)
	} else if ov, err := NewOverlay(OverlayConfig{StateDir: stateDir}); err != nil {
		why = fmt.Sprintf("dir: overlay unavailable: %v", err)
	} else if err := ov.probe(); err != nil {
		why = fmt.Sprintf("dir: overlay probe failed: %v", err)
	} else {
		ov.reason = "overlay: root on Linux; trial overlay mount and freezable cgroup v2 worked"
		return ov, nil, nil
	}
	d, err := NewDir(stateDir)
	if err != nil {
		return nil, nil, err
	}
	d.reason = why
	return nil, d, nil
}

// probe mounts an overlay of an empty directory and makes a cgroup under
// CgroupParent, checks that it can freeze and be killed, and removes both
// (and the parent, as Stop of the last sandbox does).
func (o *Overlay) probe() (err error) {
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
