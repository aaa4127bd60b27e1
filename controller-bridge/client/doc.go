// Package client is the Go client of the controller bridge's HTTP API
// (docs/API.md): what a Go controller, and the stillpoint CLI, calls to
// checkpoint, restore, retire, forget and release a run.
//
// New returns a Client of one bridge, sending a bearer token. Each method
// is one route of package bridgeapi and returns its result types: a
// result with Status failed is a decision of the fleet, not an error. A
// non-2xx answer is an *Error carrying the HTTP status and the bridge's
// error code and detail (bad_request, not_found, checkpoint_conflict,
// fenced, no_fresh_member, cancelled, internal). Operations wait as long
// as their phases do; bound them with each call's context. Ready waits
// until the bridge answers its health route.
//
// The client imports only bridgeapi and events, never the bridge itself.
package client
