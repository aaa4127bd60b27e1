// Package bridgeapi is the controller bridge's API as it travels: the
// requests a controller sends, the results and errors it gets back, and
// the HTTP routes they travel on (docs/API.md). It is a leaf: it imports
// only package events and the standard library, so that a controller (the
// Go client in controller-bridge/client, the stillpoint CLI, the collector)
// can speak to a bridge without linking the bridge itself.
//
// # Requests
//
// CheckpointRequest, RestoreRequest, ReleaseRequest, and the small bodies
// of the commit, retire and forget routes (CommitRequest, RetireRequest,
// ForgetRequest). Each has a Validate that names every field that is
// wrong, wrapped in ErrBadRequest; the bridge validates again whatever
// reaches it.
//
// # Results
//
// A decided operation is a result, whether it succeeded or not: read its
// Status (StatusCommitted, StatusCompleted, StatusPrepared or
// StatusFailed). A failed result carries a Failure that names every member
// that was not ready, failed, died or never answered (PROTOCOL §5, Bridge
// rules). Status describes the run as the bus shows it.
//
// # Errors
//
// The sentinels (ErrBusy, ErrNotFound, ErrFenced, ErrBadRequest, ErrTooLarge,
// ErrReleased, ErrNoFreshMember) are what kept the bridge from deciding. Over HTTP each
// maps to a status and an APIError code (docs/API.md, Conventions); over
// NATS to the same status as the service error code, and the same body.
//
// # Routes and endpoints
//
// The Path* constants and the *Path functions are the routes of docs/API.md;
// MaxRequestBody bounds a request body. Over NATS the same operations are
// the Endpoint* endpoints of the micro service ServiceName, below
// ServiceSubject(run, name); HeldRequest carries the checkpoint id that a
// route has in its path.
package bridgeapi
