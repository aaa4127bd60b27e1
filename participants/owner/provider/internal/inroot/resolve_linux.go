//go:build linux

package inroot

import (
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// maxLinks is how many symbolic links one resolution follows before it
// calls the path a loop, as Linux does (MAXSYMLINKS).
const maxLinks = 40

// ErrClimbsOut is returned (wrapped, naming the link) by Resolve for a
// symbolic link whose target's ".." would climb above the root: such a
// link was made for another root (the host's), and the directory a
// process rooted there would land in (the root, where ".." stops) is not
// the one it names.
var ErrClimbsOut = errors.New("symbolic link climbs out of the root")

// step is one component still to resolve, with the symbolic link whose
// target it came from ("" for the path itself).
type step struct{ name, from string }

// Resolve returns the path p (absolute, inside) names in the tree at root
// as a process rooted there sees it, every symbolic link followed inside
// root: an absolute target starts again at root, a relative one at the
// link's directory. Each component of the result that exists in root is
// a directory, not a link. A component missing from root is kept as it is
// with the rest (they are what a mkdir -p would make), and a ".." after
// one drops it. Errors name the path inside root: a link whose ".."
// climbs above root (ErrClimbsOut), more than 40 links (unix.ELOOP, a
// loop), a component, the last one too, that is neither a directory nor
// a link to one (unix.ENOTDIR), an empty link (unix.ENOENT).
func Resolve(root, p string) (string, error) {
	var done []string // resolved: directories of root, then missing names
	todo := split(path.Clean("/"+p), "")
	links := 0
	for len(todo) > 0 {
		s := todo[0]
		todo = todo[1:]
		if s.name == ".." {
			if len(done) == 0 {
				return "", fmt.Errorf("%s: %w", s.from, ErrClimbsOut)
			}
			done = done[:len(done)-1]
			continue
		}
		inside := path.Join("/"+path.Join(done...), s.name)
		host := filepath.Join(root, inside)
		var st unix.Stat_t
		err := unix.Lstat(host, &st)
		switch {
		case errors.Is(err, unix.ENOENT):
			done = append(done, s.name)
			continue
		case err != nil:
			return "", &os.PathError{Op: "lstat", Path: host, Err: err}
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			done = append(done, s.name)
		case unix.S_IFLNK:
			if links++; links > maxLinks {
				return "", fmt.Errorf("%s: more than %d symbolic links (a loop): %w", inside, maxLinks, unix.ELOOP)
			}
			target, err := os.Readlink(host)
			if err != nil {
				return "", err
			}
			if target == "" {
				return "", fmt.Errorf("%s: an empty symbolic link: %w", inside, unix.ENOENT)
			}
			if path.IsAbs(target) {
				done = done[:0]
			}
			todo = append(split(target, inside+" -> "+target), todo...)
		default:
			return "", fmt.Errorf("%s: %w", inside, unix.ENOTDIR)
		}
	}
	return "/" + path.Join(done...), nil
}

// split returns p's components, "" and "." left out, each from from.
func split(p, from string) []step {
	var out []step
	for _, el := range strings.Split(p, "/") {
		if el != "" && el != "." {
			out = append(out, step{el, from})
		}
	}
	return out
}
