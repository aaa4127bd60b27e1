package jstest

import (
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/freeport"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
)

// setupTimeout bounds starting, connecting and provisioning in Start and StartCluster.
const setupTimeout = 30 * time.Second

// Env is a running JetStream for one test: a server (or cluster), a connection to it and, unless
// WithoutProvision was given, the provisioned bus. Everything is torn down by t.Cleanup.
type Env struct {
	// Server is the embedded server; nil for StartCluster.
	Server *embedded.Server
	// Cluster is the embedded cluster; nil for Start.
	Cluster *embedded.Cluster
	// URL is the client URL; comma-separated URLs of every node for a cluster.
	URL string
	// Conn is the test's connection.
	Conn *nats.Conn
	// JS is a JetStream context on Conn.
	JS natsjs.JetStream
	// Topology is the topology that was (or, with WithoutProvision, would have been) provisioned,
	// with defaults applied.
	Topology jetstream.Topology
	// Bus is the provisioned bus; nil with WithoutProvision.
	Bus *jetstream.Bus
	// AuthDir, with WithRoles, holds the roles' nkey seed files (embedded.SeedFile); "" without.
	AuthDir string
	// Authority, with WithAuthority, is the authority the server trusts; nil without.
	Authority *embedded.Authority

	role      embedded.Role   // the role Connect connects as, with WithRoles
	creds     string          // the .creds file Connect connects with, from WithCreds
	serverCfg embedded.Config // how Start started Server, for StartServer
	stopped   bool            // StopServer stopped Server
}

// Option changes what Start and StartCluster set up.
type Option func(*options)

type options struct {
	provision bool
	topology  jetstream.Topology
	logger    zerolog.Logger
	roles     bool
	authority string // the run of WithAuthority
}

// WithoutProvision leaves the server empty: no stream, no buckets, Env.Bus nil.
func WithoutProvision() Option {
	return func(o *options) { o.provision = false }
}

// WithTopology provisions t instead of the default topology. On a cluster, a zero t.Replicas
// becomes 3.
func WithTopology(t jetstream.Topology) Option {
	return func(o *options) { o.topology = t }
}

// WithLogger sends the server's logs to log (by default they are discarded). Use a logger that
// outlives the test: the server may log while shutting down during cleanup.
func WithLogger(log zerolog.Logger) Option {
	return func(o *options) { o.logger = log }
}

// WithRoles makes the server (or every node) admit only the nkey users of embedded.RoleUsers,
// with the permissions of their roles on every run, their seeds in Env.AuthDir. Env.Conn, and
// so provisioning, is the admin role's; Env.As(role).Connect connects as another role.
func WithRoles() Option {
	return func(o *options) { o.roles = true }
}

// WithAuthority runs the server of Start in operator mode, trusting a new embedded.Authority
// (Env.Authority, its files in a temporary dir) with an account of run: Env.Conn, and so
// provisioning, is that run's admin, and Env.MemberCreds mints a member of run a user of its own,
// as `stillpoint server --auth-dir` does. Not for StartCluster.
func WithAuthority(run string) Option {
	return func(o *options) { o.authority = run }
}

func newOptions(opts []Option) options {
	o := options{provision: true, logger: zerolog.Nop()}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// Start starts an embedded JetStream server on a random port with its store in t.TempDir(),
// connects to it and provisions the bus. Cleanup closes every connection made through the Env
// and shuts the server down, waiting until it has stopped. Any failure fails the test at once.
func Start(t testing.TB, opts ...Option) *Env {
	t.Helper()
	o := newOptions(opts)
	ctx, cancel := context.WithTimeout(t.Context(), setupTimeout)
	defer cancel()

	authDir, users := roleUsers(t, o)
	// A port below the ephemeral range, held until the test ends: Restart
	// binds it again, and meanwhile no outgoing connection (the clients
	// reconnecting, say) can have taken it (internal/freeport).
	port, err := freeport.Reserve("127.0.0.1", 1)
	if err != nil {
		t.Fatalf("jstest: %v", err)
	}
	cfg := embedded.Config{
		Dir:        t.TempDir(),
		ServerName: "jstest",
		Port:       port.List[0],
		Users:      users,
		Logger:     o.logger,
	}
	authority, admin := trusted(t, o, &cfg)
	srv, err := embedded.Start(ctx, cfg)
	if err != nil {
		port.Release()
		t.Fatalf("jstest: start server: %v", err)
	}
	env := &Env{Server: srv, URL: srv.ClientURL(), AuthDir: authDir, Authority: authority, creds: admin, serverCfg: cfg}
	// Runs after the connections' cleanups below; shuts down the server
	// Restart started last.
	t.Cleanup(func() {
		if !env.stopped {
			env.Server.Shutdown()
		}
		port.Release()
	})
	env.setup(ctx, t, o)
	return env
}

// StartCluster starts a 3-node embedded cluster (stores under t.TempDir()), waits for its
// JetStream meta leader, connects to all nodes and provisions the bus with 3 replicas unless the
// topology given says otherwise. Cleanup is as for Start.
func StartCluster(t testing.TB, opts ...Option) *Env {
	t.Helper()
	o := newOptions(opts)
	if o.authority != "" {
		t.Fatalf("jstest: WithAuthority is for Start, not StartCluster")
	}
	if o.topology.Replicas == 0 {
		o.topology.Replicas = 3
	}
	ctx, cancel := context.WithTimeout(t.Context(), setupTimeout)
	defer cancel()

	authDir, users := roleUsers(t, o)
	c, err := embedded.StartCluster(ctx, embedded.ClusterConfig{
		Dir:    t.TempDir(),
		Nodes:  3,
		Users:  users,
		Logger: o.logger,
	})
	if err != nil {
		t.Fatalf("jstest: start cluster: %v", err)
	}
	t.Cleanup(c.Shutdown)
	env := &Env{Cluster: c, URL: c.URL(), AuthDir: authDir}
	env.setup(ctx, t, o)
	return env
}

// Restart shuts the server of Start down and starts a new one on the same
// store and port, as an operator restarting NATS: streams, KV and objects
// stay; what the server kept only in memory (memory-state consumers, their
// pending acks) is gone. It returns once the new server is ready; the
// Env's connections reconnect by themselves (jetstream.Connect reconnects
// forever). Call it, StopServer and StartServer on the Env Start returned
// (not a copy of As or WithCreds); not for StartCluster.
func (e *Env) Restart(t testing.TB) {
	t.Helper()
	e.StopServer(t)
	e.StartServer(t)
}

// StopServer shuts the server of Start down, waiting until it has stopped,
// and keeps its port for StartServer. The Env's connections try to
// reconnect meanwhile.
func (e *Env) StopServer(t testing.TB) {
	t.Helper()
	if e.Server == nil || e.stopped {
		t.Fatalf("jstest: StopServer needs a running server of Start")
	}
	u, err := url.Parse(e.Server.ClientURL())
	if err != nil {
		t.Fatalf("jstest: stop server: client URL: %v", err)
	}
	if e.serverCfg.Port, err = strconv.Atoi(u.Port()); err != nil {
		t.Fatalf("jstest: stop server: client URL %s: %v", u, err)
	}
	e.Server.Shutdown()
	e.stopped = true
}

// StartServer starts the server StopServer stopped again, on its store and
// port, and returns once it is ready.
func (e *Env) StartServer(t testing.TB) {
	t.Helper()
	if !e.stopped {
		t.Fatalf("jstest: StartServer needs a server StopServer stopped")
	}
	ctx, cancel := context.WithTimeout(t.Context(), setupTimeout)
	defer cancel()
	srv, err := embedded.Start(ctx, e.serverCfg)
	if err != nil {
		t.Fatalf("jstest: start server again: %v", err)
	}
	e.Server, e.stopped = srv, false
}

// trusted makes the authority of WithAuthority with its run's account, the server's trust of it
// in cfg and the run's roles' creds files, and returns it and the admin's creds file; nil and "" without.
func trusted(t testing.TB, o options, cfg *embedded.Config) (*embedded.Authority, string) {
	t.Helper()
	if o.authority == "" {
		return nil, ""
	}
	dir := filepath.Join(t.TempDir(), "auth")
	a, err := embedded.LoadAuthority(dir)
	if err != nil {
		t.Fatalf("jstest: authority: %v", err)
	}
	if err := a.AddRun(o.authority); err != nil {
		t.Fatalf("jstest: authority: %v", err)
	}
	if cfg.Trust, err = a.Trust(); err != nil {
		t.Fatalf("jstest: authority: %v", err)
	}
	return a, embedded.CredsFile(embedded.RunDir(dir, o.authority), embedded.RoleAdmin)
}

// MemberCreds mints member m of run a user of its own (embedded.Authority.MemberCreds, valid for
// an hour), writes its creds file in a temporary dir and returns its path, for WithCreds. It
// needs WithAuthority.
func (e *Env) MemberCreds(t testing.TB, run string, m events.Member) string {
	t.Helper()
	if e.Authority == nil {
		t.Fatalf("jstest: MemberCreds needs an Env started WithAuthority")
	}
	b, _, err := e.Authority.MemberCreds(run, m, time.Hour)
	if err != nil {
		t.Fatalf("jstest: member creds of %s: %v", m, err)
	}
	path := filepath.Join(t.TempDir(), string(m)+".creds")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatalf("jstest: member creds of %s: %v", m, err)
	}
	return path
}

// roleUsers makes the role seeds in a temporary dir, with WithRoles.
func roleUsers(t testing.TB, o options) (string, []embedded.User) {
	t.Helper()
	if !o.roles {
		return "", nil
	}
	dir := t.TempDir()
	users, err := embedded.RoleUsers(dir, "")
	if err != nil {
		t.Fatalf("jstest: role users: %v", err)
	}
	return dir, users
}

func (e *Env) setup(ctx context.Context, t testing.TB, o options) {
	t.Helper()
	e.Topology = o.topology.WithDefaults()
	e.Conn, e.JS = e.connect(ctx, t)
	if !o.provision {
		return
	}
	bus, err := jetstream.Provision(ctx, e.JS, e.Topology)
	if err != nil {
		t.Fatalf("jstest: provision: %v", err)
	}
	e.Bus = bus
}

// As returns a copy of e whose Connect (and ConnConfig) connect as role; everything else, Conn
// and Bus included, is e's. It needs WithRoles.
func (e *Env) As(role embedded.Role) *Env {
	c := *e
	c.role = role
	return &c
}

// WithCreds returns a copy of e whose Connect (and ConnConfig) connect with the .creds file at
// path, such as a member's own (embedded.Authority.MemberCreds) on a server in operator mode;
// everything else is e's. A permissions violation on such a connection fails the test, as with
// WithRoles.
func (e *Env) WithCreds(path string) *Env {
	c := *e
	c.creds = path
	return &c
}

// ConnConfig returns how Connect connects, named name: for a process the test starts (pass
// NKeyFile as its --nkey, CredsFile as its --creds).
func (e *Env) ConnConfig(name string) jetstream.ConnConfig {
	cfg := jetstream.ConnConfig{URL: e.URL, Name: name}
	if e.creds != "" {
		cfg.CredsFile = e.creds
		return cfg
	}
	if e.AuthDir != "" {
		role := e.role
		if role == "" {
			role = embedded.RoleAdmin
		}
		cfg.NKeyFile = embedded.SeedFile(e.AuthDir, role)
	}
	return cfg
}

// Connect opens another connection to the server (or cluster) and a JetStream context on it, as
// the Env's role with WithRoles (admin unless As says otherwise). The connection is closed in
// cleanup.
func (e *Env) Connect(t testing.TB) (*nats.Conn, natsjs.JetStream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), setupTimeout)
	defer cancel()
	return e.connect(ctx, t)
}

func (e *Env) connect(ctx context.Context, t testing.TB) (*nats.Conn, natsjs.JetStream) {
	t.Helper()
	if e.role != "" && e.AuthDir == "" && e.creds == "" {
		t.Fatalf("jstest: Env.As(%s) needs an Env started WithRoles", e.role)
	}
	// The closed handler is nats.go's last callback of a connection: once it ran, its
	// callback goroutine is done, every error handler call before it too.
	closed := make(chan struct{})
	var once sync.Once
	opts := []nats.Option{nats.ClosedHandler(func(*nats.Conn) { once.Do(func() { close(closed) }) })}
	if e.AuthDir != "" || e.creds != "" {
		// With roles, a permissions violation means the role lacks what the code under test
		// does: fail the test, naming it (nats.go only reports it here, and the call itself
		// times out or is ignored).
		v := &violations{role: e.role}
		if e.creds != "" {
			v.role = embedded.Role("of " + e.creds)
		}
		opts = append(opts, nats.ErrorHandler(v.handle))
		t.Cleanup(func() { v.check(t) }) // after the close below, so it sees every violation
	}
	nc, err := jetstream.Connect(ctx, e.ConnConfig(t.Name()), opts...)
	if err != nil {
		t.Fatalf("jstest: %v", err)
	}
	t.Cleanup(func() { closeAndWait(t, nc, closed) })
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jstest: jetstream context: %v", err)
	}
	return nc, js
}

// closeWait bounds how long a cleanup waits for nats.go to finish closing a connection. It
// takes a millisecond; the bound is for a machine so loaded that it takes seconds.
const closeWait = 30 * time.Second

// closeAndWait closes nc and waits until nats.go ran its closed handler (closed is closed): its
// callback goroutine ends with it, and its read and flush loops have been told to end (they have
// no signal of their own; leak.Find waits for them).
func closeAndWait(t testing.TB, nc *nats.Conn, closed <-chan struct{}) {
	nc.Close()
	select {
	case <-closed:
	case <-time.After(closeWait):
		t.Errorf("jstest: nats.go did not finish closing connection %s within %s", nc.Opts.Name, closeWait)
	}
}

// violations collects a connection's permissions violations.
type violations struct {
	role embedded.Role
	mu   sync.Mutex
	errs []error
	done bool
}

func (v *violations) handle(_ *nats.Conn, _ *nats.Subscription, err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.done {
		v.errs = append(v.errs, err)
	}
}

func (v *violations) check(t testing.TB) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.done = true
	role := v.role
	if role == "" {
		role = embedded.RoleAdmin
	}
	for _, err := range v.errs {
		t.Errorf("jstest: a connection of role %s: %v", role, err)
	}
}

// LeakOptions are the leak options of packages whose tests use JetStream:
//
//	func TestMain(m *testing.M) { leak.VerifyTestMain(m, jstest.LeakOptions()...) }
//
// It ignores two goroutines of nats.go v1.55.0, and only while they are
// blocked for good:
//   - resetPendingAcksOnReconnect, which the object store's Put starts with
//     its first PublishAsync, reads the status channel that Put's
//     cleanupReplySub sets to nil. When Put ends before the goroutine first
//     ran (a loaded machine's scheduler delays it), the goroutine blocks on
//     a nil channel, and nothing can end it.
//   - the object store's Get writes each chunk into a net.Pipe whose reader
//     it returns. It subscribes to the chunks before it asks for their
//     consumer; when that request fails (a bounded read's context ends on a
//     loaded server) after the server made the consumer and sent the first
//     chunk, Get returns the error and drops the reader, and the chunk
//     handler blocks writing to a pipe nobody holds (seen once in a
//     fresh-clone CI's e2e run).
//
// Every other goroutine of nats.go ends once jstest closed the connection,
// and is waited for.
func LeakOptions() []leak.Option {
	return []leak.Option{
		leak.IgnoreBlockedForever("github.com/nats-io/nats.go/jetstream.(*jetStream).resetPendingAcksOnReconnect"),
		leak.IgnoreOrphanedPipeWrite("github.com/nats-io/nats.go/jetstream.(*obs).Get.func2"),
	}
}
