package cli

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
)

type serverFlags struct {
	dir     string
	listen  string
	cluster bool
	token   string
	authDir string
	// nkeys runs --auth-dir as per-role nkeys instead of decentralized
	// auth (operator mode).
	nkeys  bool
	maxAge time.Duration
	// runs are the runs whose accounts --auth-dir makes at start.
	runs []string
	// runStorageMiB, runConsumers and runConnections bound each run
	// account's storage, consumers and connections (embedded.Limits).
	runStorageMiB, runConsumers, runConnections int64
}

func newServerCmd(g *globals) *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run an embedded NATS server with JetStream and provision Stillpoint's bus",
		Long: `Run an embedded NATS server with JetStream, its file store in --dir, and provision
the STILLPOINT stream, the sp_members, sp_daemons, sp_manifests and sp_snapshots KV buckets and
the sp_records and sp_checkpoints object stores (PROTOCOL §3). Provisioning is idempotent; an existing
stream or bucket whose configuration differs is an error that says what differs.

With --cluster it runs a 3-node cluster on loopback in this process (each node its
own store under --dir) and provisions everything at 3 replicas: a demo of the
replicated layout, not a production deployment.

With --auth-dir DIR the server runs NATS decentralized auth (docs/PERMISSIONS.md):
an operator whose keys are in DIR (reused, missing ones created, mode 0600), and
an account of each run, under DIR/runs/RUN, which holds that run's bus: the
server keeps runs apart. It makes the accounts of --runs at start, and picks up
within a second every run added to DIR since (stillpoint creds --run RUN makes
one) and provisions its bus. A run's bridge, controller (the CLI's reads, a
collector) and admin (anything in that run: the nats CLI) take
DIR/runs/RUN/<role>.creds with --creds; every agent and owner gets a user of its
own, limited to its member name (stillpoint creds --auth-dir DIR --run RUN
--member agent.a1); an owner given --sandbox-users has the server mint each of
its sandboxes a user of its own with a short expiry, and renews it while the
sandbox lives (the server checks the name; no signing key leaves DIR). Only the bridge
publishes phases and outcomes; a member speaks only as itself.
--run-storage-mib, --run-consumers and --run-connections bound what each run's
account may hold (kept in DIR/limits.json): a flood fills its own run's share.

With --auth-dir DIR --nkeys it admits one nkey per role instead, with the
permissions of its role: DIR/bridge.nk, agent.nk, owner.nk, sandbox.nk (give it
to the owner as --sandbox-creds), controller.nk and admin.nk, taken with --nkey.
Members of one kind are then not told apart.

It runs until interrupted: the first SIGINT or SIGTERM shuts the server down
cleanly, a second exits at once.`,
		Example: `  stillpoint server                       # 127.0.0.1:4222, store in ./.stillpoint/nats
  stillpoint server --listen 127.0.0.1:0  # a random port, printed at start
  stillpoint server --cluster --dir /tmp/sp-cluster
  stillpoint server --auth-dir .stillpoint/auth --runs train-7  # then: stillpoint bridge --creds .stillpoint/auth/runs/train-7/bridge.creds ...`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runServer(cmd.Context(), g, f) },
	}
	cmd.Flags().StringVar(&f.dir, "dir", ".stillpoint/nats", "JetStream store directory")
	cmd.Flags().StringVar(&f.listen, "listen", "127.0.0.1:4222", "client address host:port (port 0: random); with --cluster only the host is used")
	cmd.Flags().BoolVar(&f.cluster, "cluster", false, "run a 3-node cluster on loopback and provision at R3")
	cmd.Flags().StringVar(&f.token, "auth-token", env("STILLPOINT_SERVER_TOKEN"), "require this token from clients (env STILLPOINT_SERVER_TOKEN)")
	cmd.Flags().StringVar(&f.authDir, "auth-dir", "", "require credentials: decentralized auth, its keys and the roles' creds in this directory (created if missing)")
	cmd.Flags().Int64Var(&f.runStorageMiB, "run-storage-mib", 0, "with --auth-dir: the JetStream storage each run's account may use, in MiB (0: keep the dir's; -1: no bound)")
	cmd.Flags().Int64Var(&f.runConsumers, "run-consumers", 0, "with --auth-dir: the JetStream consumers each run's account may have at once (0: keep the dir's; -1: no bound)")
	cmd.Flags().Int64Var(&f.runConnections, "run-connections", 0, "with --auth-dir: the clients of each run that may be connected at once (0: keep the dir's; -1: no bound)")
	cmd.Flags().StringSliceVar(&f.runs, "runs", nil, "with --auth-dir: the runs to make accounts of at start (more are picked up as creds --run adds them)")
	cmd.Flags().BoolVar(&f.nkeys, "nkeys", false, "with --auth-dir: one nkey per role instead of decentralized auth")
	cmd.Flags().DurationVar(&f.maxAge, "max-age", 0, "how long the stream keeps messages (default 7 days)")
	return cmd
}

func runServer(ctx context.Context, g *globals, f serverFlags) error {
	log, err := g.logger()
	if err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	host, portStr, err := net.SplitHostPort(f.listen)
	if err != nil {
		return &exitError{code: ExitUsage, err: fmt.Errorf("--listen %q: %v", f.listen, err)}
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return &exitError{code: ExitUsage, err: fmt.Errorf("--listen %q: port must be 0..65535", f.listen)}
	}
	// The server provisions the bus itself: under --auth-dir as admin, since
	// no other role may create a stream.
	conn := jetstream.ConnConfig{Token: f.token, Name: "stillpoint-server"}
	var (
		users []embedded.User
		trust *embedded.Trust
		auth  *embedded.Authority
	)
	if f.nkeys && f.authDir == "" {
		return &exitError{code: ExitUsage, err: errors.New("--nkeys goes with --auth-dir (where the seeds are)")}
	}
	if f.authDir != "" {
		if f.token != "" {
			return &exitError{code: ExitUsage, err: errors.New("--auth-dir and --auth-token (or STILLPOINT_SERVER_TOKEN): use one")}
		}
		if !f.nkeys {
			if auth, err = embedded.LoadAuthority(f.authDir); err != nil {
				return err
			}
			if f.runStorageMiB != 0 || f.runConsumers != 0 || f.runConnections != 0 {
				lim := auth.Limits()
				if f.runStorageMiB != 0 {
					lim.Storage = f.runStorageMiB << 20
					if f.runStorageMiB < 0 {
						lim.Storage = -1
					}
				}
				lim.Consumers = cmp.Or(f.runConsumers, lim.Consumers)
				lim.Connections = cmp.Or(f.runConnections, lim.Connections)
				if err := auth.SetLimits(lim); err != nil {
					return &exitError{code: ExitUsage, err: fmt.Errorf("--run-storage-mib, --run-consumers, --run-connections: %w", err)}
				}
			}
			for _, run := range f.runs {
				if err := auth.AddRun(run); err != nil {
					return &exitError{code: ExitUsage, err: fmt.Errorf("--runs: %w", err)}
				}
			}
			if trust, err = auth.Trust(); err != nil {
				return err
			}
		} else {
			if users, err = embedded.RoleUsers(f.authDir, ""); err != nil {
				return err
			}
			conn.NKeyFile = embedded.SeedFile(f.authDir, embedded.RoleAdmin)
		}
	}
	topo := jetstream.Topology{MaxAge: f.maxAge}
	var (
		url      string
		shutdown func()
		update   func(accountJWT string) error // every node's, in operator mode
	)
	nlog := log.With().Str("component", "nats").Logger()
	if f.cluster {
		c, err := embedded.StartCluster(ctx, embedded.ClusterConfig{Dir: f.dir, Host: host, Token: f.token, Users: users, Trust: trust, Logger: nlog})
		if err != nil {
			return err
		}
		url, shutdown = c.URL(), c.Shutdown
		topo.Replicas = c.Len()
		update = func(accountJWT string) error {
			var errs []error
			for i := range c.Len() {
				errs = append(errs, c.Node(i).UpdateAccount(accountJWT))
			}
			return errors.Join(errs...)
		}
	} else {
		s, err := embedded.Start(ctx, embedded.Config{Dir: f.dir, Host: host, Port: port, ServerName: "stillpoint", Token: f.token, Users: users, Trust: trust, Logger: nlog})
		if err != nil {
			return err
		}
		url, shutdown = s.ClientURL(), s.Shutdown
		update = s.UpdateAccount
	}
	defer shutdown()
	conn.URL = url
	if auth != nil {
		// Each run is an account of its own, its bus provisioned in it by its admin: those
		// known now, then those added to the auth dir meanwhile (creds --run), and the
		// revocations written there (creds --revoke), within a second.
		rw := &runWatch{auth: auth, update: update, conn: conn, topo: topo, log: log, seen: map[string][]byte{}}
		defer rw.close()
		if err := rw.scan(ctx); err != nil {
			return err
		}
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			rw.watch(wctx)
		}()
		defer func() { cancel(); <-done }()
	} else {
		nc, err := jetstream.Connect(ctx, conn)
		if err != nil {
			return err
		}
		defer nc.Close()
		if err := provision(ctx, nc, topo); err != nil {
			return err
		}
	}
	log.Info().Str("url", url).Str("dir", f.dir).Bool("cluster", f.cluster).Int("replicas", topo.WithDefaults().Replicas).
		Msg("NATS with JetStream is ready and the bus is provisioned")
	fmt.Fprintf(g.stdout, "stillpoint: NATS ready at %s (store %s)\n", url, f.dir)
	try := ""
	switch {
	case f.authDir != "" && !f.nkeys:
		log.Info().Str("auth_dir", f.authDir).Msg("decentralized auth: clients need credentials")
		fmt.Fprintf(g.stdout, "stillpoint: each run is an account of its own (runs: %s); clients need credentials: --creds %s (role: bridge, controller, admin); "+
			"members: stillpoint creds --auth-dir %s --run RUN --member KIND.NAME (which adds the run); owners: --sandbox-users (minted here)\n",
			strings.Join(auth.Runs(), ", "), filepath.Join(embedded.RunDir(f.authDir, "RUN"), "<role>.creds"), f.authDir)
		try = " --creds " + embedded.CredsFile(embedded.RunDir(f.authDir, "RUN"), embedded.RoleAdmin)
	case f.authDir != "":
		roles := make([]string, 0, len(embedded.Roles()))
		for _, r := range embedded.Roles() {
			roles = append(roles, string(r))
		}
		log.Info().Str("auth_dir", f.authDir).Strs("roles", roles).Msg("clients need the nkey of their role")
		fmt.Fprintf(g.stdout, "stillpoint: clients need their role's nkey: --nkey %s (role: %s)\n",
			filepath.Join(f.authDir, "<role>.nk"), strings.Join(roles, ", "))
		try = " --nkey " + embedded.SeedFile(f.authDir, embedded.RoleAdmin)
	}
	fmt.Fprintf(g.stdout, "stillpoint: try: nats --server %s%s stream info %s\n", url, try, jetstream.StreamName)
	<-ctx.Done()
	log.Info().Msg("shutting down")
	return nil
}

// runPoll is how often a server in operator mode looks at its auth dir for runs added and
// revocations written.
const runPoll = time.Second

// runWatch keeps a server in operator mode in step with its auth dir: it gives the server each
// run's account JWT when it appears or changes (Authority.AddRun, Authority.Revoke rewrite it),
// and provisions a new run's bus in its account, as the run's admin.
type runWatch struct {
	auth   *embedded.Authority
	update func(accountJWT string) error // every node's
	conn   jetstream.ConnConfig
	topo   jetstream.Topology
	log    zerolog.Logger
	seen   map[string][]byte // run → the account JWT the server has
	conns  []*nats.Conn      // each run's admin, serving its minting service
}

// watch scans every runPoll until ctx ends; a scan that fails is logged and tried again.
func (w *runWatch) watch(ctx context.Context) {
	_ = poll.Until(ctx, poll.Every(runPoll), func() (bool, error) {
		if err := w.scan(ctx); err != nil && ctx.Err() == nil {
			w.log.Error().Err(err).Msg("auth dir: a run's account not applied; trying again")
		}
		return false, nil
	})
}

// scan applies what changed in the auth dir since the last scan.
func (w *runWatch) scan(ctx context.Context) error {
	if _, err := w.auth.Reload(); err != nil {
		return err
	}
	var errs []error
	for _, run := range w.auth.Runs() {
		path := embedded.AccountJWTFile(embedded.RunDir(w.auth.Dir(), run))
		b, err := os.ReadFile(path)
		if err != nil {
			continue // AddRun writes it last
		}
		last, known := w.seen[run]
		if bytes.Equal(b, last) {
			continue
		}
		if err := w.update(strings.TrimSpace(string(b))); err != nil {
			errs = append(errs, fmt.Errorf("run %s: %w", run, err))
			continue
		}
		if !known {
			if err := w.provision(ctx, run); err != nil {
				errs = append(errs, fmt.Errorf("run %s: %w", run, err))
				continue
			}
			w.log.Info().Str("run", run).Msg("run's account added and its bus provisioned")
		} else {
			w.log.Info().Str("run", run).Str("file", path).Msg("run's account JWT applied: revoked users are cut off")
		}
		w.seen[run] = b
	}
	return errors.Join(errs...)
}

// provision provisions run's bus in its account, as its admin, and serves
// the run's minting service of sandbox users (embedded.ServeMint) on that
// connection until the watch ends (close).
func (w *runWatch) provision(ctx context.Context, run string) error {
	conn := w.conn
	conn.Name = "stillpoint-server-" + run
	conn.CredsFile = embedded.CredsFile(embedded.RunDir(w.auth.Dir(), run), embedded.RoleAdmin)
	nc, err := jetstream.Connect(ctx, conn)
	if err != nil {
		return err
	}
	if err := provision(ctx, nc, w.topo); err != nil {
		nc.Close()
		return err
	}
	if _, err := w.auth.ServeMint(nc, run); err != nil {
		nc.Close()
		return err
	}
	w.conns = append(w.conns, nc)
	return nil
}

// close closes the runs' connections, and with them their minting services.
func (w *runWatch) close() {
	for _, nc := range w.conns {
		nc.Close()
	}
}

func provision(ctx context.Context, nc *nats.Conn, topo jetstream.Topology) error {
	js, err := natsjs.New(nc)
	if err != nil {
		return fmt.Errorf("jetstream: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = jetstream.Provision(pctx, js, topo)
	return err
}
