package ownerapi

import (
	"encoding/json"
	"path"
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
