// Package sandboxclient is the caller's side of a sandbox daemon's service
// (package sandboxapi is the contract): Client sends each endpoint's
// request over NATS to the daemon of one sandbox of a run and decodes its
// answer. The agent calls its daemons through it.
//
// A Client is made once per sandbox with New, which validates the run and
// sandbox id and takes the subject from sandboxapi.ServiceSubject. Each
// method is one request: it waits as long as ctx allows and is not asked
// again here. A refusal is a *ServiceError whose Code is one of the
// sandboxapi Code constants; while the daemon is not up the error is the
// connection's (nats.ErrNoResponders), and retrying is the caller's choice.
//
// It imports sandboxapi, jetstream and nats.go, never the supervisor.
package sandboxclient
