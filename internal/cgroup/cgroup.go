package cgroup

import (
	"bytes"
	"errors"
	"path/filepath"
)

var (
	// ErrNoCgroup2 is returned by Mount and Self when no cgroup v2
	// hierarchy is mounted, or none holds this process's cgroup.
	ErrNoCgroup2 = errors.New("cgroup: no cgroup v2 hierarchy")
	// ErrTimeout is returned (wrapped) by Freeze and Thaw when the kernel
	// did not confirm the change before the deadline.
	ErrTimeout = errors.New("cgroup: not confirmed in time")
)

// Dir is the host path of a cgroup v2 directory.
type Dir string

// String returns the path.
func (d Dir) String() string { return string(d) }

// Child returns the path of the child cgroup name (made or not).
func (d Dir) Child(name string) Dir { return Dir(filepath.Join(string(d), name)) }

// Events is what cgroup.events says.
type Events struct {
	// Populated: a process lives in the cgroup or below it.
	Populated bool
	// Frozen: the cgroup is frozen, every task in it stopped by the
	// freezer.
	Frozen bool
}

// parseEvents parses the content of cgroup.events.
func parseEvents(b []byte) Events {
	var e Events
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		k, v, ok := bytes.Cut(line, []byte(" "))
		if !ok {
			continue
		}
		switch string(k) {
		case "populated":
			e.Populated = string(v) == "1"
		case "frozen":
			e.Frozen = string(v) == "1"
		}
	}
	return e
}
