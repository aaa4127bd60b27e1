// Package e2e holds the end-to-end tests: the real binaries and components
// started as they run in production (sandboxd inside real sandboxes, the
// owner, the bridge) against an embedded NATS server, with every process
// they start killed and reaped, and everything they made checked gone.
package e2e
