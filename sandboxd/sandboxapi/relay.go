package sandboxapi

import (
	"fmt"
	"slices"
	"time"
)

// DefaultRelayPort is the sandbox port the model relay listens on when the
// daemon's configuration names none. The harness's model URL is then
// http://127.0.0.1:DefaultRelayPort inside the sandbox (RelayStatus.URL says
// the real one); the relay keeps the path, so <URL>/v1/chat/completions
// goes to <upstream>/v1/chat/completions.
const DefaultRelayPort = 18480

// DefaultFreezeWait is how long a hold pause that also freezes waits for
// every process of the launch to stop before it stays a plain hold
// (checkpoint_freeze_wait_seconds, 2.0).
const DefaultFreezeWait = 2 * time.Second

// CallState is where one model call through the relay stands.
type CallState uint8

// The call states. A call moves forward only: held → forwarding →
// replied → delivered, or to failed from any of them; a re-send after a
// restore takes a forwarding call of an older generation (its reply had
// not ended upstream) to forwarding again at the new one
// (CallStatus.Resends counts it). A replied call is never sent again: its
// whole reply is kept, and delivered.
const (
	// CallHeld is a call the relay read whole while a checkpoint holds it:
	// it is forwarded at the continue (or the re-point that precedes it).
	CallHeld CallState = iota
	// CallForwarding is a call sent upstream whose reply has not ended.
	CallForwarding
	// CallReplied is a call whose reply ended upstream and is not yet all
	// delivered to the harness (a checkpoint holds the rest).
	CallReplied
	// CallDelivered is a call whose whole reply reached the harness.
	CallDelivered
	// CallFailed is a call that ended in an error the harness was given
	// (too large, malformed, upstream refused or unreachable, harness gone).
	CallFailed
)

var callStateNames = [...]string{"held", "forwarding", "replied", "delivered", "failed"}

// String returns the state's protocol name.
func (s CallState) String() string {
	if int(s) < len(callStateNames) {
		return callStateNames[s]
	}
	return fmt.Sprintf("CallState(%d)", uint8(s))
}

// MarshalText implements encoding.TextMarshaler.
func (s CallState) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (s *CallState) UnmarshalText(b []byte) error {
	i := slices.Index(callStateNames[:], string(b))
	if i < 0 {
		return fmt.Errorf("sandboxapi: unknown call state %q", b)
	}
	*s = CallState(i)
	return nil
}

// CallStatus is the relay's record of one model call.
type CallStatus struct {
	// Seq numbers the calls the relay took, from 1.
	Seq uint64 `json:"seq"`
	// Digest is the hex SHA-256 of the method, path and body the harness
	// sent: a re-send sends exactly these bytes.
	Digest string `json:"digest"`
	// Generation is the upstream generation the call was (last) sent to.
	Generation uint64 `json:"generation"`
	// State is where the call stands.
	State CallState `json:"state"`
	// Stream is true for a streaming (SSE) call.
	Stream bool `json:"stream,omitempty"`
	// Resends counts the times the call was sent again: after a re-point
	// or a hold cut it, or dialed again while its upstream could not be
	// reached.
	Resends int `json:"resends,omitempty"`
	// Status is the upstream's HTTP status, once it answered.
	Status int `json:"status,omitempty"`
	// Error says why a failed call failed.
	Error string `json:"error,omitempty"`
	// AttemptError says why the call's current attempt upstream failed,
	// while the call is still open: one cut by a re-point, or broken while
	// the relay holds, is sent again at the release.
	AttemptError string `json:"attempt_error,omitempty"`
}

// RelayCounts counts the relay's calls by what happened to them.
type RelayCounts struct {
	// Total is every call taken; Delivered, Failed, Held, InFlight (sent
	// upstream, reply not all delivered) split the ones not yet forgotten.
	Total     uint64 `json:"total"`
	Delivered uint64 `json:"delivered"`
	Failed    uint64 `json:"failed"`
	Held      int    `json:"held"`
	InFlight  int    `json:"in_flight"`
	// Resent counts the re-sends: of calls a re-point or a hold cut, and
	// the dials again of an upstream that could not be reached.
	Resent uint64 `json:"resent"`
}

// RelayStatus is the relay_status answer (and the relay_repoint one).
type RelayStatus struct {
	// Up is true when the daemon runs a relay that accepts calls.
	Up bool `json:"up"`
	// URL is the model URL a harness in the sandbox is given
	// ("http://127.0.0.1:<port>", no path: the relay forwards the path as
	// it comes).
	URL string `json:"url,omitempty"`
	// Upstream is the URL calls are forwarded to (the request's path is
	// appended), and Generation its generation (0 before any re-point: the
	// daemon's configured upstream, or none).
	Upstream   string `json:"upstream,omitempty"`
	Generation uint64 `json:"generation"`
	// Holding is true while a checkpoint holds the relay.
	Holding bool `json:"holding,omitempty"`
	// Branch is the branch label in force: the one calls are sent
	// upstream with (LaunchRequest.Branch, RepointRequest.Branch), nil for
	// none.
	Branch *BranchLabel `json:"branch,omitempty"`
	// Calls counts the calls.
	Calls RelayCounts `json:"calls"`
	// KeptBytes is what the open calls keep in sandboxd's memory: their
	// request bodies and the reply bytes not yet delivered.
	KeptBytes int64 `json:"kept_bytes,omitempty"`
	// Open lists the calls not yet delivered or failed, oldest first.
	Open []CallStatus `json:"open,omitempty"`
	// Capture is the state of the relay's capture; nil when it records
	// nothing.
	Capture *CaptureStatus `json:"capture,omitempty"`
}

// CaptureStatus is the state of the relay's capture of model calls
// (docs/TRAJECTORIES.md).
type CaptureStatus struct {
	// Path is the capture file inside the sandbox; Tokens tells whether
	// the relay asks the upstream for token ids and logprobs.
	Path   string `json:"path"`
	Tokens bool   `json:"tokens,omitempty"`
	// Episode and Launch label the calls taken now ("" before a label).
	Episode string `json:"episode,omitempty"`
	Launch  string `json:"launch,omitempty"`
	// Calls counts the calls the file holds; Recorded those this relay
	// recorded; Unlabeled the answered calls it did not record for want of
	// a label; Errors the records that failed (the file ends before the
	// first of them, and records no more), LastError the last one's error.
	Calls     int    `json:"calls"`
	Recorded  uint64 `json:"recorded"`
	Unlabeled uint64 `json:"unlabeled,omitempty"`
	Errors    uint64 `json:"errors,omitempty"`
	LastError string `json:"last_error,omitempty"`
}

// MaxTrajectoryChunk is the most a TrajectoryChunk carries.
const MaxTrajectoryChunk = 512 << 10

// TrajectoryRequest reads the capture file from Offset, at most Limit
// bytes (0 or over MaxTrajectoryChunk: MaxTrajectoryChunk).
type TrajectoryRequest struct {
	Offset int64 `json:"offset"`
	Limit  int   `json:"limit,omitempty"`
}

// TrajectoryChunk is a piece of the capture file: Data from Offset, and
// the file's Size when it was read. A reader reads on until Offset plus
// the length of Data reaches the Size of its first chunk.
type TrajectoryChunk struct {
	Offset int64  `json:"offset"`
	Data   []byte `json:"data"`
	Size   int64  `json:"size"`
	// Capture is the relay's capture status at the same time.
	Capture CaptureStatus `json:"capture"`
}

// RepointRequest re-points the relay: calls go to URL from now on, and the
// calls of older generations whose reply has not ended upstream are sent
// there again, byte for byte. Generation must be higher than the relay's
// (else CodeStaleGeneration); the agent records it in its bookmark
// (relay_gen).
type RepointRequest struct {
	URL        string `json:"url"`
	Generation uint64 `json:"generation"`
	// Branch, when set, labels the calls from now on as a branch's
	// (LaunchRequest.Branch), those sent again included: a fork that
	// continues in place as a branch.
	Branch *BranchLabel `json:"branch,omitempty"`
}

// HeldRequest asks whether a launch is still the one a checkpoint left
// held: the same supervisor (Identity) holding the same pause (PauseSeq).
// It is the agent's first question after the restore of a snapshot that
// keeps processes.
type HeldRequest struct {
	LaunchID string   `json:"launch_id"`
	PauseSeq int      `json:"pause_seq"`
	Identity Identity `json:"identity"`
}

// Verdict answers a HeldRequest.
type Verdict uint8

// The verdicts.
const (
	// VerdictHeld: the supervisor is the same and the launch is still
	// paused in pause PauseSeq; a resume request can take it over.
	VerdictHeld Verdict = iota
	// VerdictEnded: the launch ended (before or during the pause); a
	// collect request returns its receipt.
	VerdictEnded
	// VerdictIdentityChanged: another supervisor owns the launch now (a
	// restarted sandboxd, or not the snapshot's).
	VerdictIdentityChanged
	// VerdictNotHolding: the launch runs, or is paused in another pause.
	VerdictNotHolding
	// VerdictUnknownLaunch: the daemon has no launch of that id.
	VerdictUnknownLaunch
)

var verdictNames = [...]string{"held", "ended", "identity_changed", "not_holding", "unknown_launch"}

// String returns the verdict's protocol name.
func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return fmt.Sprintf("Verdict(%d)", uint8(v))
}

// MarshalText implements encoding.TextMarshaler.
func (v Verdict) MarshalText() ([]byte, error) { return []byte(v.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (v *Verdict) UnmarshalText(b []byte) error {
	i := slices.Index(verdictNames[:], string(b))
	if i < 0 {
		return fmt.Errorf("sandboxapi: unknown verdict %q", b)
	}
	*v = Verdict(i)
	return nil
}

// HeldAnswer answers a HeldRequest.
type HeldAnswer struct {
	// Verdict is what the daemon found; Reason says it in words (which
	// identity, which pause, which state).
	Verdict Verdict `json:"verdict"`
	Reason  string  `json:"reason,omitempty"`
	// Identity is the daemon's supervisor now.
	Identity Identity `json:"identity"`
	// Record is the launch's record (absent for an unknown launch).
	Record *Record `json:"record,omitempty"`
	// Relay is the relay's status at the same time.
	Relay RelayStatus `json:"relay"`
	// Wall and Uptime are the sandbox's clocks when the answer was made.
	Wall   time.Time `json:"wall"`
	Uptime float64   `json:"uptime"`
}

// ResumeRequest continues pause PauseSeq of a launch held by a checkpoint
// from before a restore, if Identity still owns it and it is still in that
// pause (else CodeIdentityChanged or CodeNotHolding): the take-over. It
// answers a PauseResult like a continue, and the launch is the caller's
// from then on.
type ResumeRequest = HeldRequest

// CollectRequest collects a launch that ended while a checkpoint held it
// (VerdictEnded): it answers the receipt and clears the checkpoint's mark.
type CollectRequest struct {
	LaunchID string   `json:"launch_id"`
	Identity Identity `json:"identity"`
}
