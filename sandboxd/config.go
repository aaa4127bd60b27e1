package sandboxd

import (
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// Defaults of Config (PROTOCOL §6, Stop and Pause modes).
const (
	// DefaultGrace is how long Stop waits after SIGINT before SIGKILL.
	DefaultGrace = 10 * time.Second
	// DefaultConfirmTimeout is how long a pause waits for every process to
	// be stopped or frozen.
	DefaultConfirmTimeout = 5 * time.Second
	// DefaultPendingTimeout is how long a pause keeps waiting past the
	// confirm timeout while the only holdouts are in state D.
	DefaultPendingTimeout = 30 * time.Second
	// DefaultKillTimeout bounds the wait for a kill to leave nothing
	// behind.
	DefaultKillTimeout = 10 * time.Second
	// DefaultHoldPoll is how often a held launch (pause file) looks at its
	// pause and stop files.
	DefaultHoldPoll = 250 * time.Millisecond
	// CgroupSubtree is the cgroup the supervisor creates under its own to
	// hold its cgroup and its launches', when Config.CgroupRoot is not
	// set; every supervisor in that cgroup shares it.
	CgroupSubtree = "stillpoint-sandboxd"
	// EnvTag is the environment variable every launch gets, set to its id;
	// every process it starts inherits it unless it clears its
	// environment.
	EnvTag = "STILLPOINT_LAUNCH"
	// EnvMark is the environment variable every launch gets beside EnvTag,
	// set to <supervisor tag>/<id>: the tag names the supervisor's state
	// directory, so that the mark is the launch's alone on the host, where
	// ids repeat across sandboxes and runs. It is what a stop and a
	// restarted supervisor look for; a process with another supervisor's
	// mark, or with the id alone, is never theirs.
	EnvMark = "STILLPOINT_LAUNCH_MARK"
)

// Config configures a Supervisor. The zero value of every field but
// StateDir is a working default.
type Config struct {
	// StateDir holds one directory per launch (record.json, output.log,
	// and the stop and pause files) plus the supervisor's lock. Required.
	StateDir string
	// Logger receives structured logs (the zero value discards them).
	Logger zerolog.Logger
	// Mode is the default pause mode of launches whose Spec names none
	// (default: freeze where the host allows it, else stop).
	Mode sandboxapi.Mode
	// CgroupRoot is the cgroup v2 directory under which the supervisor
	// gets a cgroup of its own, sup-<pid>-<start>-<tag> (its identity and
	// its state directory's tag), and each launch its cgroup launch-<id> in
	// that (default: <the supervisor's cgroup>/stillpoint-sandboxd,
	// created if missing and removed by the last supervisor to leave it).
	// Any number of supervisors may share it: each removes only its own
	// cgroups, and the empty ones of supervisors that are gone. A root that
	// cannot be created or written leaves freeze unavailable.
	CgroupRoot string
	// CgroupName is the name of that directory under the supervisor's own
	// cgroup when CgroupRoot is not set (default CgroupSubtree).
	CgroupName string
	// NoCgroup never uses cgroups: launches run in the supervisor's cgroup
	// and freeze is unavailable, as on a host without cgroup v2.
	NoCgroup bool
	// Grace is the wait between SIGINT and SIGKILL when stopping a running
	// launch (default 10 s).
	Grace time.Duration
	// ConfirmTimeout bounds a pause's wait for every process to stop or
	// freeze (default 5 s).
	ConfirmTimeout time.Duration
	// PendingTimeout extends that wait while the only holdouts are in
	// state D or, in stop mode, wait only for a core to stop (default
	// 30 s; never less than ConfirmTimeout).
	PendingTimeout time.Duration
	// KillTimeout bounds a kill's wait for nothing to be left (default
	// 10 s).
	KillTimeout time.Duration
	// HoldPoll is how often a held launch looks at its pause and stop
	// files (default 250 ms).
	HoldPoll time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
	// LaunchUser, when set, is who every launch runs as (a container
	// image's user, ResolveUser); the supervisor itself stays as it is.
	// nil: launches run as the supervisor does.
	LaunchUser *User
}

func (c *Config) setDefaults() {
	if c.Grace == 0 {
		c.Grace = DefaultGrace
	}
	if c.ConfirmTimeout == 0 {
		c.ConfirmTimeout = DefaultConfirmTimeout
	}
	if c.PendingTimeout == 0 {
		c.PendingTimeout = DefaultPendingTimeout
	}
	if c.PendingTimeout < c.ConfirmTimeout {
		c.PendingTimeout = c.ConfirmTimeout
	}
	if c.KillTimeout == 0 {
		c.KillTimeout = DefaultKillTimeout
	}
	if c.HoldPoll == 0 {
		c.HoldPoll = DefaultHoldPoll
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.StateDir != "" {
		if abs, err := filepath.Abs(c.StateDir); err == nil {
			c.StateDir = abs
		}
	}
}

// Validate reports every problem of c, each naming the field.
func (c Config) Validate() error {
	var errs []error
	if c.StateDir == "" {
		errs = append(errs, fmt.Errorf("%w: Config.StateDir is required", ErrInvalidConfig))
	}
	if c.Mode > sandboxapi.ModeHold {
		errs = append(errs, fmt.Errorf("%w: Config.Mode: %v", ErrInvalidConfig, c.Mode))
	}
	if c.CgroupRoot != "" && !filepath.IsAbs(c.CgroupRoot) {
		errs = append(errs, fmt.Errorf("%w: Config.CgroupRoot %q must be absolute", ErrInvalidConfig, c.CgroupRoot))
	}
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"Grace", c.Grace}, {"ConfirmTimeout", c.ConfirmTimeout}, {"PendingTimeout", c.PendingTimeout},
		{"KillTimeout", c.KillTimeout}, {"HoldPoll", c.HoldPoll},
	} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("%w: Config.%s must not be negative", ErrInvalidConfig, f.name))
		}
	}
	return errors.Join(errs...)
}
