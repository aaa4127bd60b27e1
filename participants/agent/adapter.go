package agent

import (
	"context"
	"encoding/json"
	"time"

	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
)

// Adapter is everything harness-specific: where the harness keeps its
// session, how to launch it in the lent sandbox, whether a saved session
// can be continued, what it answered. The driver owns the rest.
type Adapter interface {
	// Name names the adapter in logs and results.
	Name() string
	// PausesAtCheckpoints tells whether a launch may be paused in place at
	// a checkpoint (and continued after it). An adapter that does not
	// pause gets its launch stopped at prepare and relaunched after the
	// resume.
	PausesAtCheckpoints() bool
	// NewState returns the state of a new rollout (where its session
	// lives in the sandbox). It is stored in the bookmark.
	NewState(r agentapi.Request) (json.RawMessage, error)
	// Command returns the launch of the harness; lc.Resume asks it to
	// continue the saved session without a new user turn.
	Command(lc LaunchContext) (Command, error)
	// ResumeDecision decides, before a relaunch, whether the saved session
	// can be continued. It may run short commands in the sandbox
	// (lc.Exec). A decision to start over returns the state of a fresh
	// session folder; a decision to continue may return the state with
	// what it learned of the saved session (its id).
	ResumeDecision(ctx context.Context, lc LaunchContext) (Decision, error)
	// Answer reads the harness's answer from a finished launch's output.
	Answer(lc LaunchContext, out ExecResult) (json.RawMessage, error)
}

// TaskValidator is implemented by an adapter that can check a task before
// the rollout is registered: a request with a task it cannot run is
// refused (400) instead of failing after its sandbox was lent.
type TaskValidator interface {
	ValidateTask(task json.RawMessage) error
}

// LaunchContext is what an adapter knows of a launch.
type LaunchContext struct {
	Rollout string
	Attempt int
	Task    json.RawMessage
	// Session is the owner's session with its current sandbox.
	Session SessionInfo
	// State is the adapter's state from the bookmark.
	State json.RawMessage
	// Resume asks for a continuation of the saved session.
	Resume bool
	// ModelURL, when set, is the model base URL the harness must use
	// instead of the adapter's own: the sandbox's model relay, on a
	// provider whose snapshots keep processes (PROTOCOL §6). The adapter
	// appends "/v1" to it as to its own.
	ModelURL string
	// Relay tells that the harness's model calls go through the sandbox's
	// model relay, which applies a launch's Command.RelayEdits. Without
	// one (the owner's --direct-model) nothing would take a continuation's
	// addition out, so an adapter whose continuation needs an edit starts
	// over instead.
	Relay bool
	// Exec runs a short command in the sandbox and returns its exit code
	// and the tail of its output.
	Exec func(ctx context.Context, argv []string) (ExecResult, error)
}

// ExecResult is how a command in the sandbox ended.
type ExecResult struct {
	ExitCode int
	// Output is the tail of its stdout and stderr.
	Output string
}

// Command is a harness launch.
type Command struct {
	Argv    []string
	Env     []string
	Dir     string
	Timeout time.Duration
	// Mode is the pause mode ("" for the daemon's default).
	Mode string
	// RelayEdits names the model relay's edits (sandboxd/relay, edits.go)
	// applied to every request of the launch: what a harness adds to a
	// request when it continues a saved session, taken out before the
	// model sees it and recorded in the trajectory. Unknown names refuse
	// the launch.
	RelayEdits []string
}

// Decision is an adapter's resume decision.
type Decision struct {
	// Continue continues the saved session; otherwise the launch starts
	// over with the task.
	Continue bool
	// Reason says why, for the launch log.
	Reason string
	// State replaces the adapter's state when not nil: a fresh session
	// folder, or the saved session as the decision found it.
	State json.RawMessage
}
