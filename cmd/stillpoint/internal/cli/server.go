package cli

import (
	"bytes"
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

	"github.com/stillpoint/stillpoint/events"
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
}

func newServerCmd(g *globals) *cobra.Command {
	var f serverFlags
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run an embedded NATS server with JetStream and provision Stillpoint's bus",
		Long: `Run an embedded NATS server with JetStream, its file store in --dir, and provision
the STILLPOINT stream, the sp_members, sp_manifests and sp_snapshots KV buckets and
the sp_records and sp_checkpoints object stores (PROTOCOL §3). Provisioning is idempotent; an existing
stream or bucket whose configuration differs is an error that says what differs.

With --cluster it runs a 3-node cluster on loopback in this process (each node its
own store under --dir) and provisions everything at 3 replicas: a demo of the
replicated layout, not a production deployment.

With --auth-dir DIR the server runs NATS decentralized auth (docs/PERMISSIONS.md):
an operator and account STILLPOINT whose keys are in DIR (reused, missing ones
created, mode 0600). The bridge, controller (the CLI's reads, a collector) and
admin (anything: the nats CLI) take DIR/<role>.creds with --creds; every agent
and owner gets a user of its own, limited to its member name and run
(stillpoint creds --auth-dir DIR --run RUN --member agent.a1); an owner given
--sandbox-signer DIR/sandbox-signer.json mints each of its sandboxes a user of
its own with a short expiry and renews it while the sandbox lives. Only the
bridge publishes phases and outcomes; a member speaks only as itself.

With --auth-dir DIR --nkeys it admits one nkey per role instead, with the
permissions of its role: DIR/bridge.nk, agent.nk, owner.nk, sandbox.nk (give it
to the owner as --sandbox-creds), controller.nk and admin.nk, taken with --nkey.
Members of one kind are then not told apart.

It runs until interrupted: the first SIGINT or SIGTERM shuts the server down
cleanly, a second exits at once.`,
		Example: `  stillpoint server                       # 127.0.0.1:4222, store in ./.stillpoint/nats
  stillpoint server --listen 127.0.0.1:0  # a random port, printed at start
  stillpoint server --cluster --dir /tmp/sp-cluster
  stillpoint server --auth-dir .stillpoint/auth  # then: stillpoint bridge --creds .stillpoint/auth/bridge.creds ...`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runServer(cmd.Context(), g, f) },
	}
	cmd.Flags().StringVar(&f.dir, "dir", ".stillpoint/nats", "JetStream store directory")
	cmd.Flags().StringVar(&f.listen, "listen", "127.0.0.1:4222", "client address host:port (port 0: random); with --cluster only the host is used")
	cmd.Flags().BoolVar(&f.cluster, "cluster", false, "run a 3-node cluster on loopback and provision at R3")
	cmd.Flags().StringVar(&f.token, "auth-token", env("STILLPOINT_SERVER_TOKEN"), "require this token from clients (env STILLPOINT_SERVER_TOKEN)")
	cmd.Flags().StringVar(&f.authDir, "auth-dir", "", "require credentials: decentralized auth, its keys and the roles' creds in this directory (created if missing)")
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
	)
	if f.nkeys && f.authDir == "" {
		return &exitError{code: ExitUsage, err: errors.New("--nkeys goes with --auth-dir (where the seeds are)")}
	}
	if f.authDir != "" {
		if f.token != "" {
			return &exitError{code: ExitUsage, err: errors.New("--auth-dir and --auth-token (or STILLPOINT_SERVER_TOKEN): use one")}
		}
		if !f.nkeys {
			if trust, err = operatorAuth(f.authDir); err != nil {
				return err
			}
			conn.CredsFile = embedded.CredsFile(f.authDir, embedded.RoleAdmin)
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
	if trust != nil {
		// Revocations written to the auth dir meanwhile (creds --revoke) apply at once.
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			watchRevocations(wctx, embedded.AccountJWTFile(f.authDir), update, log)
		}()
		defer func() { cancel(); <-done }()
	}

	conn.URL = url
	nc, err := jetstream.Connect(ctx, conn)
	if err != nil {
		return err
	}
	defer nc.Close()
	if err := provision(ctx, nc, topo); err != nil {
		return err
	}
	log.Info().Str("url", url).Str("dir", f.dir).Bool("cluster", f.cluster).Int("replicas", topo.WithDefaults().Replicas).
		Msg("NATS with JetStream is ready and the bus is provisioned")
	fmt.Fprintf(g.stdout, "stillpoint: NATS ready at %s (store %s)\n", url, f.dir)
	try := ""
	switch {
	case f.authDir != "" && !f.nkeys:
		log.Info().Str("auth_dir", f.authDir).Msg("decentralized auth: clients need credentials")
		fmt.Fprintf(g.stdout, "stillpoint: clients need credentials: --creds %s (role: bridge, controller, admin); "+
			"members: stillpoint creds --auth-dir %s --run RUN --member KIND.NAME; owners: --sandbox-signer %s\n",
			filepath.Join(f.authDir, "<role>.creds"), f.authDir, sandboxSignerFile(f.authDir))
		try = " --creds " + embedded.CredsFile(f.authDir, embedded.RoleAdmin)
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

// revocationPoll is how often a server in operator mode looks at its auth
// dir's account JWT for revocations.
const revocationPoll = time.Second

// watchRevocations gives the running server (update) the account JWT in
// path each time it changes (Authority.Revoke rewrites it), until ctx ends:
// the server disconnects the users it revokes. A JWT that fails to apply is
// logged and tried again at its next change.
func watchRevocations(ctx context.Context, path string, update func(string) error, log zerolog.Logger) {
	last, _ := os.ReadFile(path) // what the server started with (Trust read it)
	_ = poll.Until(ctx, poll.Every(revocationPoll), func() (bool, error) {
		b, err := os.ReadFile(path)
		if err != nil || bytes.Equal(b, last) {
			return false, nil
		}
		last = b
		if err := update(strings.TrimSpace(string(b))); err != nil {
			log.Error().Err(err).Str("file", path).Msg("account JWT not applied")
			return false, nil
		}
		log.Info().Str("file", path).Msg("account JWT applied: revoked users are cut off")
		return false, nil
	})
}

// operatorAuth loads (or makes) the authority in dir and writes what its
// clients take: the roles' creds and the sandbox kind's signer file.
func operatorAuth(dir string) (*embedded.Trust, error) {
	auth, err := embedded.LoadAuthority(dir)
	if err != nil {
		return nil, err
	}
	if _, err := auth.WriteRoleCreds(""); err != nil {
		return nil, err
	}
	if err := auth.WriteSigner(events.KindSandbox, sandboxSignerFile(dir)); err != nil {
		return nil, err
	}
	return auth.Trust()
}

// sandboxSignerFile is where `server --auth-dir` writes the
// signer file owners mint their sandboxes' users with.
func sandboxSignerFile(dir string) string {
	return filepath.Join(dir, "sandbox-signer.json")
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
