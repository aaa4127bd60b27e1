package sandboxapi

import "time"

// PauseResult is what one pause or continue of one launch did: the pause
// and continue endpoints answer with it. A daemon's prepare and resume acks
// carry the summary over all its launches instead, an events.PauseReport
// (PROTOCOL §6: mode, pause_seq, identity, wall, uptime), folded from
// these; a PauseResult adds what a restore needs to tell "fully stopped"
// from "quiescent with N tasks in D".
type PauseResult struct {
	// Launch is the launch id.
	Launch string `json:"launch"`
	// Op is "pause" or "continue".
	Op string `json:"op"`
	// Mode is the mode the pause used (or the continue undid).
	Mode Mode `json:"mode"`
	// PauseSeq is the number of the pause (pause N); a continue reports
	// the pause it ended.
	PauseSeq int `json:"pause_seq"`
	// Identity is the supervisor's identity.
	Identity Identity `json:"identity"`
	// Wall is the wall clock when the result was made.
	Wall time.Time `json:"wall"`
	// Uptime is the seconds since boot (CLOCK_BOOTTIME) at the same time.
	Uptime float64 `json:"uptime"`
	// State is the launch's state after the operation: paused, held (a
	// pause before the start), running (a continue, or a pause that fell
	// back), or ended (the launch ended before the pause, and keeps its
	// result).
	State State `json:"state"`
	// PIDCount is the number of processes paused (or continued).
	PIDCount int `json:"pid_count"`
	// PIDs lists the first of them (sandboxd.MaxReportPIDs), the launched
	// process first.
	PIDs []int `json:"pids,omitempty"`
	// Pending lists "<pid>:D" for processes counted as paused although a
	// thread was in uninterruptible sleep (D) with a stop pending or in a
	// vfork wait; on a fallback, the holdouts in D.
	Pending []string `json:"pending,omitempty"`
	// Fallback says why the pause was not confirmed (empty when it was).
	Fallback string `json:"fallback,omitempty"`
	// Frozen is true when a hold pause also froze the launch (and the
	// relay holds its calls): a restore may keep the clock continuous with
	// Wall. A continue reports whether the pause it ended had frozen.
	Frozen bool `json:"frozen,omitempty"`
	// TookMS is how long the operation took, in milliseconds.
	TookMS float64 `json:"took_ms"`
}
