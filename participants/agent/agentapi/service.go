package agentapi

import "github.com/stillpoint/stillpoint/jetstream"

// EndpointRun is the agent's one endpoint, a token below its
// events.ServiceSubject: a Request in, its Result out.
const EndpointRun = "run"

// The codes of the run endpoint's errors (jetstream.ServiceError.Code).
const (
	// CodeBadRequest (400): malformed ids, or a task the adapter cannot
	// run.
	CodeBadRequest = "bad_request"
	// CodeStaleAttempt (409): the attempt was retired, or is below the one
	// a restore continues.
	CodeStaleAttempt = "stale_attempt"
	// CodeRolloutBusy (409): another attempt of the rollout runs on this
	// agent.
	CodeRolloutBusy = "rollout_busy"
	// CodeParked (409): a checkpoint with stop holds the rollout; a
	// restore continues it.
	CodeParked = "parked"
	// CodeSessionExists (409): the owner still holds this attempt's
	// session for another agent process (one that died); retire the
	// attempt.
	CodeSessionExists = "session_exists"
	// CodeSandboxLost (409): the attempt's sandbox is lost (its daemon
	// died, or the owner restarted without its session); the controller
	// retires the attempt and starts the rollout over one attempt later.
	CodeSandboxLost = "sandbox_lost"
	// CodeAttemptLost (409): the attempt was sent to another process of
	// the agent, one that is gone, and no restore installed it here; the
	// controller recovers it (from a checkpoint, or one attempt later).
	CodeAttemptLost = "attempt_lost"
	// CodeBadBookmark (422): the bookmark a restore installed cannot be
	// continued.
	CodeBadBookmark = "bad_bookmark"
	// CodeStopping (503): the agent is stopping; ask again elsewhere or
	// later.
	CodeStopping = "stopping"
	// CodeRolloutFailed (500): the rollout failed.
	CodeRolloutFailed = "rollout_failed"
	// CodeInfra (502): the attempt ended for a fault of the
	// infrastructure, not of the rollout: its owner or a sandbox daemon
	// failed a step (a sandbox that would not start, a fork, an exec or a
	// grade that failed on their side) every time the agent tried it. The
	// controller retires the attempt and sends the rollout again, as its
	// next attempt; it is never the rollout's result.
	CodeInfra = "infra"
)

// ServiceError is the error the run endpoint answers with.
type ServiceError = jetstream.ServiceError
