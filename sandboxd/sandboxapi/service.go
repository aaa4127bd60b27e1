package sandboxapi

import "github.com/stillpoint/stillpoint/events"

// ServiceSubject returns spsvc.<run>.sandbox.<sandboxID>, the subject
// prefix of the service of sandbox sandboxID's daemon in run (the member
// service subject of events.ServiceSubject); endpoint e is ServiceSubject +
// "." + e. It refuses a run or sandbox id that is not one subject token.
func ServiceSubject(run, sandboxID string) (string, error) {
	if err := events.ValidateRun(run); err != nil {
		return "", err
	}
	if err := events.ValidateToken("sandbox", sandboxID); err != nil {
		return "", err
	}
	m, err := events.NewMember(events.KindSandbox, sandboxID)
	if err != nil {
		return "", err
	}
	return events.ServiceSubject(run, m), nil
}

// The service's endpoints, one subject token below ServiceSubject.
const (
	// EndpointLaunch starts a launch: LaunchRequest in, Record out.
	EndpointLaunch = "launch"
	// EndpointStatus returns a launch's Record.
	EndpointStatus = "status"
	// EndpointPause pauses a launch (LaunchRef.Mode, default its own): a
	// PauseResult.
	EndpointPause = "pause"
	// EndpointContinue continues a launch the caller paused: a
	// PauseResult. A launch a checkpoint paused is the checkpoint's to
	// continue (CodeAdmissionClosed).
	EndpointContinue = "continue"
	// EndpointStop stops a launch (LaunchRef.Cancel: at once): its Receipt.
	EndpointStop = "stop"
	// EndpointReceipt returns a launch's Receipt; with LaunchRef.Wait, once
	// it has ended.
	EndpointReceipt = "receipt"
	// EndpointHeld asks whether a launch is still held in pause N by the
	// same supervisor: HeldRequest in, HeldAnswer out (PROTOCOL §6,
	// Restore of a process-keeping snapshot).
	EndpointHeld = "held"
	// EndpointResume continues pause N of a launch a checkpoint from
	// before a restore holds (the take-over): ResumeRequest in,
	// PauseResult out.
	EndpointResume = "resume"
	// EndpointCollect collects a launch that ended while held:
	// CollectRequest in, Receipt out.
	EndpointCollect = "collect"
	// EndpointRelayStatus answers the model relay's RelayStatus (an empty
	// object in).
	EndpointRelayStatus = "relay_status"
	// EndpointRelayRepoint re-points the relay: RepointRequest in,
	// RelayStatus out.
	EndpointRelayRepoint = "relay_repoint"
	// EndpointTrajectory reads the relay's capture file, a chunk at a
	// time: TrajectoryRequest in, TrajectoryChunk out.
	EndpointTrajectory = "trajectory"
)

// The codes of the service's errors (jetstream.ServiceError.Code, which
// package sandboxclient names ServiceError).
const (
	// CodeBadRequest (400): a body that does not decode, a malformed
	// launch id or an invalid launch.
	CodeBadRequest = "bad_request"
	// CodeUnknownLaunch (404): no launch has that id.
	CodeUnknownLaunch = "unknown_launch"
	// CodeAdmissionClosed (409): a checkpoint is open; launch again after
	// its resume.
	CodeAdmissionClosed = "admission_closed"
	// CodeStaleAttempt (409): the launch's episode was retired.
	CodeStaleAttempt = "stale_attempt"
	// CodeLaunchExists (409): the launch id was used already (a launch
	// asked again after its answer was lost).
	CodeLaunchExists = "launch_exists"
	// CodeNotEnded (409): the launch has not ended (a receipt without a
	// wait, or a bounded wait that ran out).
	CodeNotEnded = "not_ended"
	// CodeUnconfirmed (409): a pause could not be confirmed and was undone.
	CodeUnconfirmed = "unconfirmed"
	// CodeModeUnavailable (409): a pause mode this host or launch cannot
	// use, or that does not exist.
	CodeModeUnavailable = "mode_unavailable"
	// CodeStaleGeneration (409): a re-point whose generation is not higher
	// than the relay's.
	CodeStaleGeneration = "stale_generation"
	// CodeNoRelay (409): the daemon runs no relay (a relay request).
	CodeNoRelay = "no_relay"
	// CodeIdentityChanged (409): a resume or collect named a supervisor
	// that no longer owns the launch.
	CodeIdentityChanged = "identity_changed"
	// CodeNotHolding (409): a resume of a launch not in that pause, or a
	// collect of a launch that has not ended.
	CodeNotHolding = "not_holding"
	// CodeInternal (500): anything else.
	CodeInternal = "internal"
)

// LaunchRequest asks for a launch.
type LaunchRequest struct {
	// LaunchID names the launch: 1 to 128 characters of [A-Za-z0-9._-],
	// starting with a letter or digit (sandboxd.ValidateID). The agent
	// keeps it in its bookmark.
	LaunchID string `json:"launch_id"`
	// Episode is the attempt the launch works for (a capture key): a
	// retire of it stops the launch, and a retired attempt cannot launch.
	Episode string `json:"episode,omitempty"`
	// Command (run by /bin/sh -c) or Argv, exactly one of them.
	Command string   `json:"command,omitempty"`
	Argv    []string `json:"argv,omitempty"`
	Dir     string   `json:"dir,omitempty"`
	Env     []string `json:"env,omitempty"`
	// TimeoutMS is the launch's deadline, paused time not counted.
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Mode is the launch's pause mode, a Mode's name (default: the
	// daemon's).
	Mode string `json:"mode,omitempty"`
	// NoPause keeps checkpoints from pausing the launch: its agent stops
	// it instead (an adapter that does not pause), or lets it run through
	// (a restart-only rollout).
	NoPause bool `json:"no_pause,omitempty"`
	// Freeze makes a hold pause of the launch also freeze it (cgroup v2,
	// where the daemon has one), waiting at most FreezeWaitMS (default
	// DefaultFreezeWait) for every process to stop, and otherwise stay a
	// plain hold: restore_sandbox_clock. PauseResult.Frozen says which.
	Freeze       bool  `json:"freeze,omitempty"`
	FreezeWaitMS int64 `json:"freeze_wait_ms,omitempty"`
	// RelayEdits names the relay edits (sandboxd/relay, edits.go) the
	// model relay applies to every request of the launch: a harness that
	// adds something to a request when it continues a saved session has
	// the relay take exactly that out before the model sees it. A name the
	// daemon does not know refuses the launch (bad_request). They need a
	// relay and an Episode (the relay's label).
	RelayEdits []string `json:"relay_edits,omitempty"`
	// Branch, for a launch of a branch (PROTOCOL §5, Branch), labels its
	// model calls: the relay sends the branch's label and seed upstream
	// with each of them. It needs a relay and an Episode.
	Branch *BranchLabel `json:"branch,omitempty"`
}

// BranchLabel is what the model relay tells the upstream of a branch's
// calls: BranchHeader carries Label ("b<k>") and SeedHeader Seed, and a
// chat-completions or Responses request that sets no seed gets Seed as
// its "seed" (an edit the trajectory records), so that a sampler
// diverges.
type BranchLabel struct {
	Label string `json:"label"`
	Seed  uint64 `json:"seed"`
	// Episode is the branch's episode (a capture key), for a re-point: a
	// fork that continues in place runs the snapshot's harness, whose
	// launch the parent's episode labels; the relay records the calls it
	// takes from then on, and those it sends again, under the branch's
	// episode instead (their IDs its own). A launch's label is its
	// Episode already.
	Episode string `json:"episode,omitempty"`
}

// The headers the relay adds to a branch's model calls (BranchLabel).
const (
	BranchHeader = "X-Stillpoint-Branch"
	SeedHeader   = "X-Stillpoint-Seed"
)

// LaunchRef names a launch in the other requests.
type LaunchRef struct {
	LaunchID string `json:"launch_id"`
	// Mode is the pause mode of a pause request (default: the launch's).
	Mode string `json:"mode,omitempty"`
	// Cancel makes a stop kill at once, without the SIGINT grace.
	Cancel bool `json:"cancel,omitempty"`
	// Wait makes a receipt request wait until the launch has ended; with
	// WaitMS, at most that long (then it answers CodeNotEnded), so that a
	// long wait never holds the endpoint past its caller.
	Wait   bool  `json:"wait,omitempty"`
	WaitMS int64 `json:"wait_ms,omitempty"`
}
