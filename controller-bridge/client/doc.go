// Package client is the Go client of the controller bridge's API
// (docs/API.md): what a Go controller, and the stillpoint CLI, calls to
// checkpoint, restore, branch, retire, forget and release a run.
//
// One Client, two transports. New returns a client of one bridge's HTTP
// API, sending a bearer token; NewNATS returns one of its NATS micro
// service (bridgeapi.ServiceName) on a connection the caller keeps, whose
// user needs the controller role. Each method is one operation of package
// bridgeapi (a route over HTTP, an endpoint over NATS) and returns its
// result types on either: a result with Status failed is a decision of
// the fleet, not an error. An error answer is an *Error carrying the
// status (over NATS the service error code, the same number) and the
// bridge's error code and detail (bad_request, not_found,
// checkpoint_conflict, fenced, no_fresh_member, cancelled, internal).
// Operations wait as long as their phases do; bound them with each call's
// context. Ready waits until the bridge answers its health route (over
// NATS, its status endpoint).
//
// The client imports bridgeapi, events and nats.go, never the bridge
// itself.
package client
