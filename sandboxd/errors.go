package sandboxd

import "errors"

// Sentinel errors. Every error the package returns wraps one of these (or a
// system error) with context; test with errors.Is.
var (
	// ErrInvalidConfig is returned (wrapped, one per field, joined) by
	// Config.Validate and New.
	ErrInvalidConfig = errors.New("sandboxd: invalid config")
	// ErrInvalidSpec is returned by Launch for a Spec that Spec.Validate
	// refuses, and by every method for a malformed launch id.
	ErrInvalidSpec = errors.New("sandboxd: invalid launch spec")
	// ErrLaunchExists is returned by Launch for an id that already has a
	// record in the state directory: a launch id is used once.
	ErrLaunchExists = errors.New("sandboxd: launch exists")
	// ErrUnknownLaunch is returned by Status, Receipt and Wait for an id
	// with no record.
	ErrUnknownLaunch = errors.New("sandboxd: unknown launch")
	// ErrNotEnded is returned by Receipt for a launch that has not ended.
	ErrNotEnded = errors.New("sandboxd: launch has not ended")
	// ErrUnconfirmed is returned by Pause when the pause could not be
	// confirmed in time. Whatever it stopped or froze has been continued
	// again, the launch is running, and the PauseResult's Fallback says
	// why; the caller falls back to stop and relaunch (PROTOCOL §6).
	ErrUnconfirmed = errors.New("sandboxd: pause not confirmed")
	// ErrContinueFailed is returned by Continue when a paused launch could
	// not be continued; the launch is then stopped (killed), so that
	// nothing stays half paused, and the caller relaunches.
	ErrContinueFailed = errors.New("sandboxd: continue failed")
	// ErrModeUnavailable is returned by Pause and Launch for a mode this
	// host or launch cannot use (freeze without a writable cgroup v2).
	ErrModeUnavailable = errors.New("sandboxd: pause mode unavailable")
	// ErrStopping is returned by Pause for a launch that is being stopped.
	ErrStopping = errors.New("sandboxd: launch is stopping")
	// ErrKillUnconfirmed is returned by Stop and Cancel when processes of
	// the launch were still found after the kill timeout.
	ErrKillUnconfirmed = errors.New("sandboxd: kill not confirmed")
	// ErrStateLocked is returned by Run when another live supervisor holds
	// the state directory.
	ErrStateLocked = errors.New("sandboxd: state directory in use")
	// ErrSupervisorRestarted is the error recorded in the receipt of a
	// launch whose supervisor died: the next supervisor on the same state
	// directory (a different Identity) ends it as failed and kills what it
	// can still find of it.
	ErrSupervisorRestarted = errors.New("sandboxd: supervisor restarted")
	// ErrAlreadyRunning is returned by a second call of Run.
	ErrAlreadyRunning = errors.New("sandboxd: already running")
	// ErrClosed is returned by every method once Run has returned (or
	// failed to start).
	ErrClosed = errors.New("sandboxd: supervisor closed")
	// ErrTransition is returned (wrapped, naming both states) by
	// CheckTransition, and by Machine.Step for an input the state cannot
	// take. The driver never feeds one; seeing it means a bug.
	ErrTransition = errors.New("sandboxd: illegal transition")
)
