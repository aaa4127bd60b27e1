// Package jstest is the one helper for tests that need a real JetStream: never a mock of NATS.
//
//	func TestSomething(t *testing.T) {
//		env := jstest.Start(t)                  // server, connection, provisioned bus
//		ack, err := jetstream.PublishOnce(t.Context(), env.JS, msg)
//		...
//	}
//
// Start runs an embedded server on a random port with its store in t.TempDir(), connects to it,
// and provisions the bus layout of package jetstream (default Topology, or WithTopology; nothing
// with WithoutProvision). StartCluster does the same on a 3-node cluster, with 3 replicas unless
// the topology says otherwise. Env.Connect opens more connections, for tests with several members.
//
// WithRoles starts the server requiring the per-role nkeys of embedded.RoleUsers (seeds in
// Env.AuthDir): Env.Conn is the admin's, env.As(embedded.RoleAgent).Connect(t) an agent's, and
// a permissions violation on a connection Connect made fails the test.
//
// Everything is torn down by t.Cleanup, in order: connections are closed and waited for (nats.go's
// closed handler has run), then the server is shut down and waited for, so a test leaves no
// goroutine behind (leak.VerifyTestMain(m, jstest.LeakOptions()...) passes; LeakOptions says why
// it ignores one goroutine of nats.go, and only while it is blocked forever). Any failure to set
// up fails the test at once.
//
// Buffer collects what those servers and members write (logs, output) while the test reads it.
// To wait for a condition they bring about, use internal/poll's Wait; to start a process,
// internal/child.
package jstest
