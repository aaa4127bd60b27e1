// Package ownerapi is the sandbox owner's wire contract (PROTOCOL §6,
// "Sandbox owner"): the requests an agent sends to an owner's service, the
// answers it gets, the records an owner exports at a commit, and Client,
// the caller's side of the service. It imports only events, jetstream and
// the standard library, so that an agent, a controller or a test can talk
// to an owner without building one.
//
// # The service
//
// An owner named o1 of run r serves on events.ServiceSubject(r,
// "owner.o1"), that is spsvc.r.owner.o1, with one endpoint per call
// (subjects outside sp.>, so requests are not kept in the audit stream):
//
//	seed_session    SeedRequest  -> SessionInfo   the session's sandbox; a restored fork when there is one
//	sandbox_access  SessionRef   -> SessionInfo   the session's current sandbox
//	verify          VerifyRequest -> VerifyResult  the grade; with End, the session ends once graded
//	close_session   SessionRef   -> {}            ends the session; idempotent
//	sandbox_clock   ClockRequest -> ClockResult   sets the sandbox's wall clock (never the host's), where the provider can
//
// Errors come back as *jetstream.ServiceError: 400 bad_request, 409
// no_sandbox (a verify or access of a session without a sandbox), 409
// admission_closed (a checkpoint is open: try again after its resume), 409
// session_exists, 409 stale_attempt (a retired attempt), 409
// sandbox_exited (the session's sandbox's init, its daemon, exited: a
// verify or access finds nothing running there), 409
// clock_unavailable (a provider that cannot set a sandbox's clock), 422
// setup_failed, 500 internal.
//
//	c, err := ownerapi.NewClient(nc, "r", "o1")
//	info, err := c.SeedSession(ctx, ownerapi.SeedRequest{SessionID: "s1", Episode: "s1", Task: task})
//	res, err := c.VerifyEnd(ctx, ownerapi.VerifyRequest{SessionID: "s1", End: true})
//
// # Records
//
// At a commit an owner exports one record per live session, keyed by the
// session's episode, whose data is a RecordData; the snapshots it names
// are indexed in the sp_snapshots bucket under their id with an
// IndexEntry.
package ownerapi
