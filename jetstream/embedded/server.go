package embedded

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/internal/poll"
)

// PingInterval and MaxPingsOut are how a server finds a client gone that
// did not close its connection (cut off by a partition, its machine
// lost): a ping every PingInterval, the connection closed after
// MaxPingsOut go unanswered, within about 40 s rather than nats-server's
// 4 minutes. Its subscriptions go with it, so that a request to a sandbox
// daemon cut off answers "no responders" and the daemon is left out of
// the phase instead of holding it until its deadline.
const (
	PingInterval = 10 * time.Second
	MaxPingsOut  = 3
)

// Defaults of Config and ClusterConfig.
const (
	// DefaultHost is the interface servers listen on: loopback only.
	DefaultHost = "127.0.0.1"
	// DefaultReadyTimeout bounds how long Start waits for the server to be ready.
	DefaultReadyTimeout = 10 * time.Second
	// DefaultClusterReadyTimeout bounds how long StartCluster waits for its nodes and a JetStream
	// meta leader. A new cluster's first election comes after a random 4 to 9 s, and a split vote
	// waits as long again: the bound covers two rounds and the nodes' start.
	DefaultClusterReadyTimeout = 30 * time.Second
)

var (
	// ErrInvalidConfig is returned (wrapped, one error per field, joined) by Config.Validate and
	// ClusterConfig.Validate.
	ErrInvalidConfig = errors.New("embedded: invalid config")

	// ErrNotReady is returned (wrapped) by Start and StartCluster when the server did not accept
	// connections, did not enable JetStream, or (for a cluster) did not elect a JetStream meta
	// leader within ReadyTimeout or before ctx ended. The server has been shut down.
	ErrNotReady = errors.New("embedded: server not ready")

	// ErrFatal is wrapped by the error Start returns when nats-server reported a fatal error
	// (such as "Can't start JetStream"), which would have exited a stand-alone server.
	ErrFatal = errors.New("embedded: nats-server fatal error")
)

// Config configures one embedded JetStream server.
type Config struct {
	// Dir is the JetStream file store directory. Required; never share it between servers.
	Dir string
	// Host is the interface to listen on (default 127.0.0.1).
	Host string
	// Port is the client port; 0 picks a random free port (ClientURL reports it).
	Port int
	// ServerName is the server's name in monitoring and logs (default: its generated id).
	ServerName string
	// Token, if set, is required from every client (nats.Token or ConnConfig.Token).
	Token string
	// Users, if set, are the only clients admitted, each by its nkey and with its permissions
	// (RoleUsers makes one per Role). At most one of Token, Users and Trust.
	Users []User
	// Trust, if set, runs the server in operator mode: it admits the users whose JWTs the
	// accounts in Trust sign (an Authority's, Authority.Trust), each with its JWT's permissions.
	Trust *Trust
	// Logger receives the server's logs (the zero value discards them).
	Logger zerolog.Logger
	// ReadyTimeout bounds the wait for the server to be ready (default 10 s).
	ReadyTimeout time.Duration
	// PingInterval is how often the server pings each client (default
	// PingInterval); it closes a connection after MaxPingsOut go
	// unanswered.
	PingInterval time.Duration
}

func (c *Config) setDefaults() {
	if c.Host == "" {
		c.Host = DefaultHost
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = DefaultReadyTimeout
	}
	if c.PingInterval <= 0 {
		c.PingInterval = PingInterval
	}
}

// Validate reports every problem of c, joined, each wrapping ErrInvalidConfig and naming the
// field. Call it after defaults; Start does both.
func (c Config) Validate() error {
	var errs []error
	if c.Dir == "" {
		errs = append(errs, fmt.Errorf("%w: Config.Dir: required", ErrInvalidConfig))
	}
	if c.Port < 0 || c.Port > 65535 {
		errs = append(errs, fmt.Errorf("%w: Config.Port %d: must be 0 (random) or a port number", ErrInvalidConfig, c.Port))
	}
	if c.ReadyTimeout < 0 {
		errs = append(errs, fmt.Errorf("%w: Config.ReadyTimeout %s: must not be negative", ErrInvalidConfig, c.ReadyTimeout))
	}
	errs = append(errs, validateUsers("Config.Users", c.Users, c.Token)...)
	errs = append(errs, validateTrust("Config", c.Trust, c.Users, c.Token)...)
	return errors.Join(errs...)
}

// Server is a running embedded nats-server with JetStream.
type Server struct {
	ns     *server.Server
	log    *Logger
	routed bool // listens for cluster routes
}

// Start starts a JetStream server with its file store in cfg.Dir and returns once it accepts
// connections and JetStream is enabled. The server installs no signal handlers. The caller must
// call Shutdown.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	port := cfg.Port
	if port == 0 {
		port = server.RANDOM_PORT // nats-server reads 0 as its default port, 4222
	}
	opts := &server.Options{
		ServerName:    cfg.ServerName,
		Host:          cfg.Host,
		Port:          port,
		JetStream:     true,
		StoreDir:      cfg.Dir,
		NoSigs:        true,
		Authorization: cfg.Token,
		Nkeys:         nkeyUsers(cfg.Users),
		PingInterval:  cfg.PingInterval,
		MaxPingsOut:   MaxPingsOut,
	}
	if err := cfg.Trust.apply(opts); err != nil {
		return nil, err
	}
	s, err := startNode(opts, cfg.Logger)
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, cfg.ReadyTimeout, []*Server{s}, func() error { return accountsReady([]*Server{s}, cfg.Trust) }); err != nil {
		s.Shutdown()
		return nil, err
	}
	return s, nil
}

// UpdateAccount gives the running server the JWT of an account its operator signed: a new one
// (a run added since it started: Authority.AddRun) or a new JWT of one it has (such as
// Authority.AccountJWT after a Revoke), which it applies at once, disconnecting the users it
// revokes. It returns once the account has JetStream.
func (s *Server) UpdateAccount(accountJWT string) error {
	ac, err := jwt.DecodeAccountClaims(accountJWT)
	if err != nil {
		return fmt.Errorf("embedded: account JWT: %w", err)
	}
	// Into the resolver first: an account the server has not loaded yet (a run added since it
	// started) is looked up there.
	if res, ok := s.ns.AccountResolver().(*server.MemAccResolver); ok {
		if err := res.Store(ac.Subject, accountJWT); err != nil {
			return fmt.Errorf("embedded: account %s: %w", ac.Name, err)
		}
	}
	acc, err := s.ns.LookupAccount(ac.Subject)
	if err != nil {
		return fmt.Errorf("embedded: account %s: %w", ac.Name, err)
	}
	s.ns.UpdateAccountClaims(acc, ac)
	// JetStream comes up for a new account a moment after it is loaded; a request sent before
	// is refused "JetStream not enabled for account".
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if poll.Until(ctx, poll.Every(readyPoll), func() (bool, error) { return acc.JetStreamEnabled(), nil }) != nil {
		return fmt.Errorf("embedded: account %s: JetStream not enabled 10 s after its JWT", ac.Name)
	}
	return nil
}

// ClientURL returns the URL clients connect to, with the real port when Port was 0.
func (s *Server) ClientURL() string {
	return s.ns.ClientURL()
}

// Name returns the server's name (its id when Config.ServerName was empty).
func (s *Server) Name() string {
	return s.ns.Name()
}

// NATS returns the underlying nats-server, for tests that need its internals (leadership,
// monitoring). Do not call its Shutdown; call Server.Shutdown.
func (s *Server) NATS() *server.Server {
	return s.ns
}

// Shutdown stops the server and waits until it has stopped. It is safe to call more than once and
// from several goroutines; every call returns once the server is down.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}

// startNode creates and starts one nats-server with a zerolog adapter. nats-server's Start
// returns once the client listener is up; readiness is waited for separately (waitReady).
func startNode(opts *server.Options, log zerolog.Logger) (*Server, error) {
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded: new server: %w", err)
	}
	name := opts.ServerName
	if name == "" {
		name = ns.ID()
	}
	logger := NewLogger(log.With().Str("server", name).Logger())
	debug, trace := levels(log)
	ns.SetLoggerV2(logger, debug, trace, false)
	ns.Start()
	s := &Server{ns: ns, log: logger, routed: opts.Cluster.Port != 0}
	if err := logger.err(); err != nil {
		s.Shutdown()
		return nil, err
	}
	return s, nil
}

const (
	// readyPoll is how often waitReady looks at the servers.
	readyPoll = 10 * time.Millisecond
	// readyCheck bounds one call of nats-server's ReadyForConnections, which polls on its own.
	readyCheck = 50 * time.Millisecond
)

// accountsReady returns nil once every node has loaded each account of
// trust but the system account with JetStream enabled. In operator mode a
// node loads an account from its resolver only when something asks for it,
// and a JetStream request its clients send meanwhile, answered by a node
// that has not, is refused "JetStream not enabled for account" (the server
// of a cluster failed its own provisioning so).
func accountsReady(nodes []*Server, trust *Trust) error {
	if trust == nil {
		return nil
	}
	for _, n := range nodes {
		for pub := range trust.Accounts {
			if pub == trust.SystemAccount {
				continue
			}
			acc, err := n.ns.LookupAccount(pub)
			if err != nil {
				return fmt.Errorf("server %s: account %s: %w", n.Name(), pub, err)
			}
			if !acc.JetStreamEnabled() {
				return fmt.Errorf("server %s: account %s: JetStream not enabled yet", n.Name(), pub)
			}
		}
	}
	return nil
}

// waitReady polls until every node listens for clients (and routes, when clustered) with
// JetStream enabled and, if more is not nil, more returns nil. It gives up when timeout passes,
// ctx ends, or a node reports a fatal error.
func waitReady(ctx context.Context, timeout time.Duration, nodes []*Server, more func() error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	err := poll.Until(ctx, poll.Every(readyPoll), func() (bool, error) {
		last = readyNow(nodes, more)
		if errors.Is(last, ErrFatal) {
			return false, last
		}
		return last == nil, nil
	})
	if err != nil && !errors.Is(err, ErrFatal) {
		return fmt.Errorf("%w (waited at most %s): %w: %w", ErrNotReady, timeout, last, err)
	}
	return err
}

func readyNow(nodes []*Server, more func() error) error {
	for _, n := range nodes {
		if err := n.log.err(); err != nil {
			return fmt.Errorf("server %s: %w", n.Name(), err)
		}
		switch {
		case n.ns.Addr() == nil:
			return fmt.Errorf("server %s: not listening for clients", n.Name())
		case n.routed && n.ns.ClusterAddr() == nil:
			return fmt.Errorf("server %s: not listening for routes", n.Name())
		case !n.ns.JetStreamEnabled():
			return fmt.Errorf("server %s: JetStream not enabled", n.Name())
		case !n.ns.ReadyForConnections(readyCheck):
			// The listeners above are up, so this returns at once unless another listener
			// nats-server waits for is not.
			return fmt.Errorf("server %s: not ready for connections", n.Name())
		}
	}
	if more != nil {
		return more()
	}
	return nil
}
