// Package sandboxapi is the wire contract of a sandbox daemon's service:
// its subject, the request and answer types of its endpoints, the enums
// they carry and their validation. It holds no client (package
// sandboxclient is the caller's side) and imports only events and the
// standard library, so a caller of a daemon does not build the
// supervisor, and a server of it not the client.
//
//  1. Subjects. A daemon serves member sandbox.<id> of a run on
//     ServiceSubject(run, id), spsvc.<run>.sandbox.<id>,
//     with one endpoint a token below it: launch, status, pause, continue,
//     stop and receipt; held, resume and collect (a launch a restored
//     snapshot kept); relay_status and relay_repoint (the model relay). The
//     Endpoint constants name them. The subjects are outside
//     sp.>, so requests are not kept in the audit stream.
//  2. Bodies. Requests are JSON objects decoded strictly (no unknown
//     field): LaunchRequest for launch, HeldRequest for held and resume,
//     CollectRequest for collect, RepointRequest for relay_repoint, an empty
//     object for relay_status, LaunchRef for the others. Answers are a
//     Record (launch, status), a PauseResult (pause, continue, resume), a
//     Receipt (stop, receipt, collect), a HeldAnswer (held) or a
//     RelayStatus (relay_status, relay_repoint).
//  3. Errors. A refusal is a jetstream.ServiceError (for a caller,
//     sandboxclient.ServiceError) whose Code is one of
//     the Code constants: a caller decides on the code, never on the
//     detail text. A receipt asked with a bounded wait answers CodeNotEnded
//     when the wait runs out, so that no request holds the endpoint past its
//     caller.
//  4. Enums. Mode, State, Outcome, StopReason, CallState and Verdict travel as their protocol
//     names (text marshalling); the zero value of each is "none" or "the
//     default", never a real state.
//
// The supervisor (package sandboxd) writes these same types to its launch
// records on disk; package sandboxd/daemon serves them.
package sandboxapi
