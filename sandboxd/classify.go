package sandboxd

// threadClass is what one thread's state says about a pause in stop mode.
type threadClass uint8

const (
	// threadRunning: not stopped yet (R, S, or any state that will still
	// reach user code before it stops).
	threadRunning threadClass = iota
	// threadStopped: T (stopped) or t (traced).
	threadStopped
	// threadGone: Z or X, or the thread no longer exists.
	threadGone
	// threadPausedD: in D, but it cannot return to user code without
	// stopping first: its thread-group leader is stopped (a group stop is
	// under way), SIGSTOP is pending for it, or it is a vfork parent
	// waiting for a child that the walk stops next.
	threadPausedD
	// threadHoldoutD: in D with none of the above: it may still run user
	// code when the system call returns.
	threadHoldoutD
)

// classifyThread classifies a thread from its state letter; the three
// facts matter only for state D, and the caller reads them (status, wchan)
// only then.
func classifyThread(state byte, leaderStopped, stopPending, vforkWait bool) threadClass {
	switch state {
	case 'T', 't':
		return threadStopped
	case 'Z', 'X', 'x':
		return threadGone
	case 'D':
		if leaderStopped || stopPending || vforkWait {
			return threadPausedD
		}
		return threadHoldoutD
	}
	return threadRunning
}

// procClass is what a process's threads together say about a pause.
type procClass uint8

const (
	// procPending: some thread has not stopped yet.
	procPending procClass = iota
	// procPaused: every thread is stopped or gone (at least one stopped).
	procPaused
	// procPausedD: paused, with at least one thread counted through a D
	// rule (reported as "<pid>:D").
	procPausedD
	// procHoldoutD: every thread is paused or gone except threads in D
	// that no rule accepts; a pause waits for those up to the pending
	// timeout.
	procHoldoutD
	// procGone: every thread is gone.
	procGone
)

// classifyProcess combines the classes of all of a process's threads.
// A single running thread keeps the process pending: the pause is
// confirmed only when every thread is.
func classifyProcess(threads []threadClass) procClass {
	var stopped, gone, pausedD, holdout, running int
	for _, t := range threads {
		switch t {
		case threadStopped:
			stopped++
		case threadGone:
			gone++
		case threadPausedD:
			pausedD++
		case threadHoldoutD:
			holdout++
		default:
			running++
		}
	}
	switch {
	case running > 0:
		return procPending
	case holdout > 0:
		return procHoldoutD
	case pausedD > 0:
		return procPausedD
	case stopped > 0:
		return procPaused
	}
	return procGone
}
