//go:build linux

package overlay

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/internal/inroot"
)

// emptyWorkdir makes a new sandbox's working directory start empty, whatever
// the base has at that path (a host directory of the same name would show
// through the overlay, and a task's `go test ./...` there would see the
// host's files): an opaque directory in the upper layer, its parents made
// there with the base's modes (sticky and set-id bits too) and owners. The
// path is first resolved in the base as the sandbox will see it
// (inroot.Resolve): through a symbolic link (/var/run -> /run) the mark
// goes on the directory the link lands in, and the link stays the base's.
// A path that lands on a file, loops, or climbs out of the base through a
// link's ".." is refused, naming it. The opaque mark is an xattr, which a
// snapshot's copy keeps. No working directory, or the root, needs none. A
// sandbox on an image needs none: what the image has there is the task's.
func (o *Provider) emptyWorkdir(upper, workdir string) error {
	if workdir == "" {
		return nil
	}
	wd, err := provider.CleanAbs("spec.Workdir", workdir)
	if err != nil || wd == "/" {
		return err
	}
	dir, err := inroot.Resolve(o.cfg.BaseDir, wd)
	if err != nil {
		return fmt.Errorf("%w: spec.Workdir %q in the base %s: %w", provider.ErrInvalid, wd, o.cfg.BaseDir, err)
	}
	if dir == "/" {
		return nil
	}
	parts := strings.Split(dir[1:], "/")
	for i := range parts {
		rel := filepath.Join(parts[:i+1]...)
		d := filepath.Join(upper, rel)
		mode, uid, gid := uint32(0o755), 0, 0
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(o.cfg.BaseDir, rel), &st); err == nil {
			if st.Mode&unix.S_IFMT != unix.S_IFDIR {
				// Resolve saw a directory: the base changed under it.
				return fmt.Errorf("spec.Workdir %q: /%s in the base %s is no longer a directory", wd, rel, o.cfg.BaseDir)
			}
			mode, uid, gid = st.Mode&0o7777, int(st.Uid), int(st.Gid)
		}
		if err := os.Mkdir(d, 0o700); err != nil {
			return fmt.Errorf("spec.Workdir: %w", err)
		}
		// Owner first, then the mode (a chown clears setgid), whole: the
		// upper directory's attributes are the merged directory's.
		if err := os.Lchown(d, uid, gid); err != nil {
			return fmt.Errorf("spec.Workdir: %w", err)
		}
		if err := unix.Chmod(d, mode); err != nil {
			return fmt.Errorf("spec.Workdir: %w", &os.PathError{Op: "chmod", Path: d, Err: err})
		}
	}
	if err := unix.Setxattr(filepath.Join(upper, dir), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		return fmt.Errorf("spec.Workdir: mark %s opaque: %w", dir, err)
	}
	return nil
}
