package ownerapi

import (
	"encoding/json"
	"path"
	"strconv"
	"time"
)

// The endpoints of an owner's service, below its subject prefix.
const (
	// EndpointSeed answers a SeedRequest with a SessionInfo.
	EndpointSeed = "seed_session"
	// EndpointAccess answers a SessionRef with a SessionInfo.
	EndpointAccess = "sandbox_access"
	// EndpointVerify answers a VerifyRequest with a VerifyResult.
	EndpointVerify = "verify"
	// EndpointClose answers a SessionRef with an empty object.
	EndpointClose = "close_session"
	// EndpointClock sets the wall clock of a session's sandbox, on a
	// provider that can (SessionInfo.SetsClock): a ClockRequest in, a
	// ClockResult out. The host's clock is never touched.
	EndpointClock = "sandbox_clock"
)

// SeedRequest asks for a session's sandbox.
type SeedRequest struct {
	// SessionID is the session id (PROTOCOL §2 rollout id rules).
	SessionID string `json:"session_id"`
	// Episode is the attempt the session serves, <rollout>-a<attempt>.
	Episode string `json:"episode"`
	// Task is the task payload; the owner's task kind builds the sandbox
	// from it and may refuse it (400 bad_request).
	Task json.RawMessage `json:"task,omitempty"`
}

// SessionInfo is what the agent learns of a session.
type SessionInfo struct {
	SessionID string `json:"session_id"`
	Episode   string `json:"episode"`
	// SandboxID is the sandbox's id: its daemon is member sandbox.<id>.
	SandboxID string `json:"sandbox_id"`
	Workdir   string `json:"workdir"`
	// Root is the sandbox's root as its processes see it ("/", or the host
	// path of a dir sandbox): paths inside it, Workdir included, are
	// path.Join(Root, p) to a command launched in the sandbox.
	Root string `json:"root,omitempty"`
	// Restored tells a fork a restore installed (its setup did not run
	// again).
	Restored bool `json:"restored,omitempty"`
	// RestartOnly tells the agent that this owner cannot capture the
	// session: its rollout restarts from its input after a crash.
	RestartOnly bool `json:"restart_only,omitempty"`
	// KeepsProcesses tells that the provider's snapshots keep the
	// sandbox's processes (PROTOCOL §6, keeps_processes): a restored fork
	// still runs the launch its snapshot caught. Clock says how a fork's
	// clocks run ("continuous": on from the snapshot's instant; "" when
	// the provider does not say), and SetsClock whether EndpointClock can
	// set them.
	KeepsProcesses bool   `json:"keeps_processes,omitempty"`
	Clock          string `json:"clock,omitempty"`
	SetsClock      bool   `json:"sets_clock,omitempty"`
}

// ClockRequest asks the owner to set the wall clock of a session's
// sandbox: to Wall, or to the host's time when Wall is zero.
type ClockRequest struct {
	SessionID string    `json:"session_id"`
	Wall      time.Time `json:"wall,omitzero"`
}

// ClockResult says what the sandbox's clock was set to.
type ClockResult struct {
	SandboxID string    `json:"sandbox_id"`
	Wall      time.Time `json:"wall"`
}

// InSandbox returns the path a command launched in the sandbox uses for p,
// a path inside it.
func (i SessionInfo) InSandbox(p string) string {
	if i.Root == "" || i.Root == "/" {
		return p
	}
	return path.Join(i.Root, p)
}

// SessionRef names a session.
type SessionRef struct {
	SessionID string `json:"session_id"`
}

// VerifyRequest asks for a session's grade.
type VerifyRequest struct {
	SessionID string `json:"session_id"`
	// End ends the session once it is graded: the agent that asks leaves
	// the sandbox to the owner (the cleanup rule of package agent).
	End bool `json:"end,omitempty"`
}

// VerifyResult is the grade of a session.
type VerifyResult struct {
	SessionID string `json:"session_id"`
	// Result is the verdict the owner's task kind returned, a JSON object.
	Result json.RawMessage `json:"result"`
}

// BranchSession is the session id of branch k of a session: the agent and
// the owner derive it alike from the parent's session (a branch phase
// names no session).
func BranchSession(session string, k int) string {
	return session + ".b" + strconv.Itoa(k)
}
