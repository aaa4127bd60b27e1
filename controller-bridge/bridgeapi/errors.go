package bridgeapi

import "errors"

// Errors a bridge's operations return. The HTTP API maps each to a status
// and an error code (docs/API.md).
var (
	// ErrBusy is returned when another operation of the run is open, or a
	// checkpoint is held prepared.
	ErrBusy = errors.New("bridgeapi: another operation is open")
	// ErrNotFound is returned for a checkpoint that does not exist, or a
	// held checkpoint that is not held.
	ErrNotFound = errors.New("bridgeapi: not found")
	// ErrFenced is returned when another bridge published a phase of the
	// run in between: this bridge is not the run's bridge any more.
	ErrFenced = errors.New("bridgeapi: fenced by another bridge")
	// ErrBadRequest is returned for a request that names something invalid.
	ErrBadRequest = errors.New("bridgeapi: bad request")
	// ErrTooLarge is returned for a request body over MaxRequestBody.
	ErrTooLarge = errors.New("bridgeapi: request body too large")
	// ErrReleased is returned by a restore of a checkpoint that a failed
	// release did not keep: its members may have deleted what it names.
	ErrReleased = errors.New("bridgeapi: checkpoint partly released")
	// ErrNoFreshMember is returned by a restore when a member of the
	// checkpoint has no fresh member to restore into.
	ErrNoFreshMember = errors.New("bridgeapi: no fresh member to restore into")
)

// APIError is the body of every non-2xx answer: {"error":{"code","detail"}}.
type APIError struct {
	Code   string `json:"code"`
	Detail string `json:"detail"`
}

// Error implements error.
func (e *APIError) Error() string { return e.Code + ": " + e.Detail }
