// Package embedded runs nats-server with JetStream inside the process: one server for tests and
// single-node deployments (the controller bridge can host its own bus), or a cluster of servers
// on one host for tests of replicated streams.
//
// Start takes a Config and returns once the server accepts connections and JetStream is on:
//
//	s, err := embedded.Start(ctx, embedded.Config{Dir: storeDir, Logger: log})
//	if err != nil { ... }
//	defer s.Shutdown()
//	nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: s.ClientURL()})
//
// The server listens on 127.0.0.1 by default. Port 0 means a random free port (nats-server itself
// would read 0 as 4222); ClientURL reports the real one. The server installs no signal handlers;
// the process owns its signals. Its logs go to the zerolog.Logger in the Config through Logger,
// an adapter that maps NATS levels to zerolog levels and, unlike nats-server's own logger, never
// exits the process on a fatal error: Start returns it, wrapping ErrFatal.
//
// StartCluster starts ClusterConfig.Nodes servers (3 by default) named n0, n1, ..., each with its
// own store directory under ClusterConfig.Dir and a cluster port picked in advance, all routing to
// each other. It returns only once a JetStream meta leader is elected and every node follows it,
// because JetStream API calls fail or time out before that.
//
// Clients authenticate with a token (Config.Token), as nkey users (Config.Users), each with
// its permissions, or with user JWTs in operator mode (Config.Trust). An Authority is the
// decentralized auth of one bus: an operator, a system account and an account of each run
// (AddRun), which holds that run's streams and buckets, so the server keeps runs apart. Each run's
// account has a signing key for its bridge, controller and admin roles (RoleCreds) and one scoped
// signing key per member kind whose template, MemberPermissions, limits each user to its own
// member name in that run (MemberCreds; Signer.Mint, for an owner minting its sandboxes'
// short-lived users). Server.UpdateAccount gives a running server a run added since, or applies a
// revocation (Authority.Revoke) at once; the run's dir keeps
// it (AccountJWTFile), so a server started again on that dir still refuses the user. RoleUsers makes one user per Role (bridge, agent, owner, sandbox,
// controller, admin) from seed files in a directory, creating the missing ones, with the
// permissions of RolePermissions: only the bridge publishes phases and outcomes, a member acks
// and heartbeats only as its own kind, only admin changes streams. docs/PERMISSIONS.md says what
// each way restricts and what it does not.
//
// Shutdown, on a Server or a Cluster, stops and waits until everything has stopped; it is safe to
// call twice. Shutdown time grows with the number of file-backed consumers.
//
// This package imports nats-server, a large dependency; code that only talks to a bus imports
// jetstream instead.
package embedded
