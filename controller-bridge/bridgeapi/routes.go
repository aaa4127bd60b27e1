package bridgeapi

import (
	"net/url"
	"strings"
)

// MaxRequestBody bounds an API request body.
const MaxRequestBody = 1 << 20

// The routes of the HTTP API (docs/API.md). Every route but PathHealth
// requires "Authorization: Bearer <token>".
const (
	// PathHealth answers GET with {"status":"ok","run":...}.
	PathHealth = "/healthz"
	// PathCheckpoints takes a POSTed CheckpointRequest.
	PathCheckpoints = "/v1/checkpoints"
	// PathCheckpoint answers GET with the CheckpointResult of checkpoint
	// {id}, once it committed or failed (a net/http pattern; CheckpointPath
	// fills it in).
	PathCheckpoint = PathCheckpoints + "/{id}"
	// PathCommit commits the held checkpoint {id}: POST, a CommitRequest.
	PathCommit = PathCheckpoint + "/commit"
	// PathAbort abandons the held checkpoint {id}: POST, no body.
	PathAbort = PathCheckpoint + "/abort"
	// PathRestore takes a POSTed RestoreRequest.
	PathRestore = "/v1/restore"
	// PathRetire takes a POSTed RetireRequest.
	PathRetire = "/v1/retire"
	// PathForget takes a POSTed ForgetRequest.
	PathForget = "/v1/forget"
	// PathRelease takes a POSTed ReleaseRequest.
	PathRelease = "/v1/release"
	// PathBranch takes a POSTed BranchRequest, answers a BranchResult.
	PathBranch = "/v1/branch"
	// PathStatus answers GET with Status.
	PathStatus = "/v1/status"
)

// CheckpointPath is the route of checkpoint id (PathCheckpoint).
func CheckpointPath(id string) string { return withID(PathCheckpoint, id) }

// CommitPath is the route that commits the held checkpoint id (PathCommit).
func CommitPath(id string) string { return withID(PathCommit, id) }

// AbortPath is the route that abandons the held checkpoint id (PathAbort).
func AbortPath(id string) string { return withID(PathAbort, id) }

func withID(pattern, id string) string {
	return strings.Replace(pattern, "{id}", url.PathEscape(id), 1)
}
