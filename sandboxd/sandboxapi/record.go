package sandboxapi

import "time"

// PauseStats counts a launch's pauses.
type PauseStats struct {
	// Count is how many pauses took hold (including a hold before the
	// start).
	Count int `json:"count"`
	// Seq is the number of the current or last pause (pause N).
	Seq int `json:"seq"`
	// Total is the time spent paused, which never counts against the
	// launch's deadline.
	Total time.Duration `json:"total_ns"`
	// Since is when the current pause took hold (zero when not paused).
	Since time.Time `json:"since,omitzero"`
	// Mode is the mode of the current or last pause.
	Mode Mode `json:"mode,omitzero"`
	// Frozen is true when the current or last pause was a hold that froze
	// the launch.
	Frozen bool `json:"frozen,omitzero"`
	// Fallbacks is how many pauses could not be confirmed.
	Fallbacks int `json:"fallbacks,omitzero"`
}

// Receipt is how a launch ended: its process's own exit code or signal,
// the outcome, and whether everything it left behind was confirmed gone.
type Receipt struct {
	// ID is the launch id.
	ID string `json:"id"`
	// Started is false for a launch that never started (stop file, stop
	// before start, start failure).
	Started bool `json:"started"`
	// ExitCode is the process's exit code, -1 when it was killed by a
	// signal or never started.
	ExitCode int `json:"exit_code"`
	// Signal names the signal that killed the process ("SIGKILL"), if one
	// did.
	Signal string `json:"signal,omitempty"`
	// Outcome is finished, interrupted or failed.
	Outcome Outcome `json:"outcome"`
	// StopReason is why the launch was stopped, if it was.
	StopReason StopReason `json:"stop_reason,omitzero"`
	// TimedOut is true when the deadline stopped the launch.
	TimedOut bool `json:"timed_out,omitempty"`
	// CleanupConfirmed is true when no process of the launch was found
	// after it ended.
	CleanupConfirmed bool `json:"cleanup_confirmed"`
	// Error says what went wrong, for a failed launch.
	Error string `json:"error,omitempty"`
	// Ended is when the process exited (or the launch was given up).
	Ended time.Time `json:"ended"`
	// OutputTail is the last few KiB of the launch's output
	// (sandboxd.OutputTailBytes), so that a caller outside the sandbox can
	// read a harness's answer.
	OutputTail string `json:"output_tail,omitempty"`
	// Pauses counts the launch's pauses.
	Pauses PauseStats `json:"pauses"`
}

// Record is a launch's record: what was launched, by which supervisor,
// where it stands, and its receipt once it has ended. The supervisor keeps
// it in <state>/<id>/record.json; the launch and status endpoints answer
// with it.
type Record struct {
	// V is the record format version (1).
	V int `json:"v"`
	// ID is the launch id.
	ID string `json:"id"`
	// Command is the shell command (run as /bin/sh -c Command), or empty
	// when Argv is given.
	Command string `json:"command,omitempty"`
	// Argv is the argument vector that was (or will be) executed.
	Argv []string `json:"argv"`
	// Dir is the working directory.
	Dir string `json:"dir,omitempty"`
	// Created is when the launch was accepted.
	Created time.Time `json:"created"`
	// Started is when the process started (zero before).
	Started time.Time `json:"started,omitzero"`
	// Supervisor is the identity of the supervisor that owns the launch.
	Supervisor Identity `json:"supervisor"`
	// State is the launch's state.
	State State `json:"state"`
	// Mode is the launch's default pause mode.
	Mode Mode `json:"mode"`
	// Cgroup is the launch's cgroup v2 directory, if it has one.
	Cgroup string `json:"cgroup,omitempty"`
	// PID is the launched process's id (the root of the launch's tree, the
	// leader of its session and process group) and PIDStart its start
	// time.
	PID      int    `json:"pid,omitempty"`
	PIDStart uint64 `json:"pid_start,omitempty"`
	// Output is the file that holds the process's stdout and stderr.
	Output string `json:"output"`
	// Timeout is the launch's time budget (0: none); paused time does not
	// count.
	Timeout time.Duration `json:"timeout_ns,omitzero"`
	// Deadline is when the launch will be stopped, given its pauses so far
	// (zero when none applies right now).
	Deadline time.Time `json:"deadline,omitzero"`
	// Pauses counts the launch's pauses.
	Pauses PauseStats `json:"pauses"`
	// Receipt is set once the launch has ended.
	Receipt *Receipt `json:"receipt,omitempty"`
	// Updated is when the record was written.
	Updated time.Time `json:"updated"`
}
