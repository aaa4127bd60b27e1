package bridgeapi

import (
	"github.com/stillpoint/stillpoint/events"
)

// The controller API as a NATS micro service (docs/API.md, "Over NATS"):
// the same operations as the HTTP routes, each an endpoint that takes and
// answers the same JSON bodies.
const (
	// ServiceName is the micro service's name, as `nats micro ls` shows it.
	ServiceName = "stillpoint-bridge"
	// ServiceVersion is the service's version (semver, as micro wants).
	ServiceVersion = "1.0.0"
)

// The service's endpoints, one subject token each below ServiceSubject.
const (
	// EndpointCheckpoint takes a CheckpointRequest, answers a
	// CheckpointResult (PathCheckpoints).
	EndpointCheckpoint = "checkpoint"
	// EndpointCommitHeld takes a HeldRequest, answers the held
	// checkpoint's CheckpointResult (PathCommit).
	EndpointCommitHeld = "commit-held"
	// EndpointAbortHeld takes a HeldRequest without stop, answers the
	// abandoned checkpoint's CheckpointResult (PathAbort).
	EndpointAbortHeld = "abort-held"
	// EndpointGet takes a HeldRequest naming a finished checkpoint,
	// answers its CheckpointResult (PathCheckpoint).
	EndpointGet = "get"
	// EndpointRestore takes a RestoreRequest, answers a RestoreResult
	// (PathRestore).
	EndpointRestore = "restore"
	// EndpointRetire takes a RetireRequest, answers an OpResult
	// (PathRetire).
	EndpointRetire = "retire"
	// EndpointForget takes a ForgetRequest, answers an OpResult
	// (PathForget).
	EndpointForget = "forget"
	// EndpointRelease takes a ReleaseRequest, answers an OpResult
	// (PathRelease).
	EndpointRelease = "release"
	// EndpointBranch takes a BranchRequest, answers a BranchResult
	// (PathBranch).
	EndpointBranch = "branch"
	// EndpointStatus takes an empty body (or {}), answers Status
	// (PathStatus).
	EndpointStatus = "status"
)

// Endpoints returns every endpoint of the service, in a fixed order.
func Endpoints() []string {
	return []string{EndpointCheckpoint, EndpointCommitHeld, EndpointAbortHeld, EndpointGet,
		EndpointRestore, EndpointRetire, EndpointForget, EndpointRelease, EndpointBranch, EndpointStatus}
}

// ServiceSubject returns spsvc.<run>.bridge.<name>, the subject prefix of
// the service of bridge name of run; endpoint e is ServiceSubject + "." + e.
// It is the member service subject of events.ServiceSubject, so that a
// role's permissions name it as they name the participants' services.
// An empty name is the default bridge, "main".
func ServiceSubject(run, name string) string {
	if name == "" {
		name = "main"
	}
	return events.ServiceSubject(run, events.Member(string(events.KindBridge)+"."+name))
}

// HeldRequest names a checkpoint in a service request: the held one to
// commit (with its stop flag) or abort, or a finished one to get. Over
// HTTP the id is in the route instead, and the commit's body is a
// CommitRequest.
type HeldRequest struct {
	// ID is the checkpoint id. Required.
	ID string `json:"checkpoint_id"`
	// Stop parks the fleet as in CheckpointRequest (commit-held only).
	Stop bool `json:"stop,omitempty"`
}

// Validate returns nil for a valid request, else an error wrapping
// ErrBadRequest naming what is wrong.
func (r HeldRequest) Validate() error {
	if err := events.ValidateCheckpointID(r.ID); err != nil {
		return badRequest(err)
	}
	return nil
}
