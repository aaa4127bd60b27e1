package sandboxapi

import "fmt"

// Mode is how a launch is paused (PROTOCOL §6, Pause modes).
type Mode uint8

// The pause modes. ModeDefault is not a mode but "the launch's own": the
// mode its launch request named, else the daemon's default, else the best
// the host allows.
const (
	// ModeDefault selects the launch's (or the daemon's) default mode.
	ModeDefault Mode = iota
	// ModeFreeze writes 1 to the launch's cgroup v2 cgroup.freeze and
	// waits for "frozen 1" in cgroup.events. Invisible to the processes;
	// needs a writable cgroup v2 and a launch started in its own cgroup.
	ModeFreeze
	// ModeStop sends SIGSTOP to the launch's process tree level by level,
	// confirming every thread, and SIGCONT bottom-up on continue. Works
	// everywhere; job-control shells never see their commands stop.
	ModeStop
	// ModeHold acknowledges at once and signals nothing; something else
	// (a VM snapshot, the model relay) holds the launch still.
	ModeHold
)

var modeNames = [...]string{"default", "freeze", "stop", "hold"}

// String returns the mode's protocol name.
func (m Mode) String() string {
	if int(m) < len(modeNames) {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// ParseMode returns the Mode named s ("freeze", "stop", "hold", or
// "default" / "" for ModeDefault); another name is ErrUnknownMode.
func ParseMode(s string) (Mode, error) {
	if s == "" {
		return ModeDefault, nil
	}
	for i, n := range modeNames {
		if n == s {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("%w %q (want freeze, stop or hold)", ErrUnknownMode, s)
}

// MarshalText implements encoding.TextMarshaler.
func (m Mode) MarshalText() ([]byte, error) { return []byte(m.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (m *Mode) UnmarshalText(b []byte) error {
	v, err := ParseMode(string(b))
	if err != nil {
		return err
	}
	*m = v
	return nil
}
