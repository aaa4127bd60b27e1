package sandboxd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/internal/cgroup"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// The cgroups of a supervisor, under the parent it shares with every
// other supervisor that uses the same one (Config.CgroupRoot, or
// <its own cgroup>/<Config.CgroupName>: on a host, the supervisors of all
// dir sandboxes, and tests):
//
//	<parent>/sup-<pid>-<start>-<tag>/launch-<id>   a launch's
//	<parent>/probe-<pid>-<start>-<n>               New's check of the parent
//
// pid and start are the supervisor's process identity and tag its state
// directory's (stateTag). A supervisor only ever removes its own cgroups,
// the parent once it is empty (when it is the default one), and the
// cgroups of processes that are gone and left nothing running in them
// (reapCgroups). Nobody removes a cgroup of a live supervisor, so a
// supervisor's own cgroup disappears under it only in the window between
// making the parent and making its own in it, when another supervisor
// leaving may remove the empty parent: creation then starts again.

// removeTimeout bounds the removal of a launch's cgroup: a cgroup whose
// last process has just exited refuses rmdir for a moment (EBUSY).
const removeTimeout = 2 * time.Second

// reapTimeout bounds the removal of one leftover: it has been empty for a
// while, unless it was emptied a moment ago.
const reapTimeout = 200 * time.Millisecond

// createAttempts bounds how often a chain of cgroups is made again after
// a concurrent removal of one of them.
const createAttempts = 50

// cgroupParent returns the shared parent: root, or <own cgroup>/name
// (default CgroupSubtree) when root is "".
func cgroupParent(root, name string) (cgroup.Dir, error) {
	if root != "" {
		return cgroup.Dir(root), nil
	}
	own, err := cgroup.Self()
	if err != nil {
		return "", err
	}
	if name == "" {
		name = CgroupSubtree
	}
	return own.Child(name), nil
}

// prepareCgroupParent creates the parent if it is missing and checks that
// a cgroup can be made in it with cgroup.freeze and cgroup.kill writable,
// with a probe named for self. Any failure means freeze is unavailable.
//
// The parent is looked at only once the probe is in it: a supervisor
// leaving removes the shared parent when it is empty, which may fall
// between this one's mkdir and its look.
func prepareCgroupParent(parent cgroup.Dir, self sandboxapi.Identity) error {
	probe := parent.Child(fmt.Sprintf("probe-%d-%d-%08x", self.PID, self.Start, rand.Uint32()))
	if err := createChain(parent, probe); err != nil {
		return err
	}
	defer os.Remove(string(probe))
	if _, err := os.Stat(string(parent.Child("cgroup.procs"))); err != nil {
		return fmt.Errorf("%s is not a cgroup v2 directory: %w", parent, err)
	}
	return probe.Check()
}

// createChain makes each cgroup of chain that is missing, in order, each
// the parent of the next. A concurrent removal of one of them (an empty
// parent that a supervisor leaving removed) fails the next mkdir with
// ENOENT, and the chain is made again from its start.
func createChain(chain ...cgroup.Dir) error {
	var err error
	for range createAttempts {
		for _, d := range chain {
			if _, err = cgroup.Create(string(d)); errors.Is(err, fs.ErrExist) {
				err = nil
			}
			if err != nil {
				break
			}
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return err
}

// createLaunchCgroup makes <own>/launch-<id>, and the parent and own
// where missing. A leftover one that is empty is removed first (it may
// still be frozen); a populated one is an error.
func createLaunchCgroup(parent, own cgroup.Dir, id string) (cgroup.Dir, error) {
	c := own.Child("launch-" + id)
	if _, err := os.Stat(string(c)); err == nil {
		if ev, err := c.Events(); err != nil || ev.Populated {
			return "", fmt.Errorf("cgroup %s exists and is populated", c)
		}
		if err := removeCgroup(c); err != nil {
			return "", err
		}
	}
	var err error
	for range createAttempts {
		if err = createChain(parent, own); err != nil {
			return "", err
		}
		if _, err = cgroup.Create(string(c)); !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return "", err
	}
	return c, nil
}

// removeCgroup removes a launch's cgroup and every cgroup below it.
func removeCgroup(c cgroup.Dir) error {
	return c.Remove(context.Background(), time.Now().Add(removeTimeout))
}

// ownCgroupName is the name of a supervisor's own cgroup in the parent.
func ownCgroupName(self sandboxapi.Identity, tag string) string {
	return fmt.Sprintf("sup-%d-%d-%s", self.PID, self.Start, tag)
}

// cgroupOwner parses the name of a supervisor's own cgroup or of a probe:
// the identity of the process that made it, and the tag or number after
// it.
func cgroupOwner(name string) (kind string, owner sandboxapi.Identity, rest string, ok bool) {
	parts := strings.SplitN(name, "-", 4)
	if len(parts) != 4 || parts[0] != "sup" && parts[0] != "probe" || parts[3] == "" {
		return "", owner, "", false
	}
	pid, err1 := strconv.Atoi(parts[1])
	start, err2 := strconv.ParseUint(parts[2], 10, 64)
	if err1 != nil || err2 != nil || pid <= 0 {
		return "", owner, "", false
	}
	for _, c := range parts[3] {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", owner, "", false
		}
	}
	return parts[0], sandboxapi.Identity{PID: pid, Start: start}, parts[3], true
}

// isOwnLaunchCgroup reports whether path is a launch cgroup of a
// supervisor of the state directory with tag: <parent>/sup-…-<tag>/
// launch-<id>. Recovery kills only such a cgroup: a record copied with its
// state directory names the original's.
func isOwnLaunchCgroup(path, tag string) bool {
	if tag == "" || !strings.HasPrefix(filepath.Base(path), "launch-") {
		return false
	}
	kind, _, t, ok := cgroupOwner(filepath.Base(filepath.Dir(path)))
	return ok && kind == "sup" && t == tag
}

// reapCgroups removes from parent the supervisors' own cgroups and probes
// whose process is gone (no process has its pid with its start time) and
// in which no process is left: what a supervisor killed with -9 left,
// with the empty launch cgroups in it. A cgroup that still holds a
// process is left for its state directory's next supervisor to recover;
// anything else in the parent is not a supervisor's and is left alone.
func reapCgroups(parent cgroup.Dir, log zerolog.Logger) {
	ents, err := os.ReadDir(string(parent))
	if err != nil {
		return
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		_, owner, _, ok := cgroupOwner(e.Name())
		if !ok || Alive(owner) {
			continue
		}
		c := parent.Child(e.Name())
		if ev, err := c.Events(); err != nil || ev.Populated {
			continue
		}
		if err := c.Remove(context.Background(), time.Now().Add(reapTimeout)); err != nil {
			log.Debug().Err(err).Str("cgroup", string(c)).Msg("leftover cgroup not removed")
			continue
		}
		log.Debug().Str("cgroup", string(c)).Stringer("owner", owner).Msg("leftover cgroup of a supervisor that is gone removed")
	}
}
