package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/jetstream"
)

type bridgeFlags struct {
	run       string
	name      string
	listen    string
	tokenFile string
	timeout   time.Duration
	replicas  int
}

func newBridgeCmd(g *globals) *cobra.Command {
	var f bridgeFlags
	cmd := &cobra.Command{
		Use:   "bridge",
		Short: "Run the controller bridge of a run: phases out, acks in, manifests written",
		Long: `Run the controller bridge of one run. It publishes checkpoint phases to the run's
members over JetStream, gathers their acks, writes checkpoint manifests and moves
LATEST, and serves the controller's HTTP JSON API (docs/API.md) on --listen and
the same API as the NATS micro service stillpoint-bridge, on the subjects
spsvc.<run>.bridge.<name>.<operation> (callers need the controller role).

At start it recovers whatever a previous bridge of the run left open: a prepare
is aborted, a commit finished or aborted from the acks, a restore completed or
failed. It keeps no state of its own beyond the bus.

The API requires a bearer token: give it in --token-file or STILLPOINT_BRIDGE_TOKEN.
/metrics (Prometheus), /healthz and /readyz on the same address need none
(docs/OPERATIONS.md).`,
		Example: `  STILLPOINT_BRIDGE_TOKEN=s3cret stillpoint bridge --run train-7 --nats-url nats://127.0.0.1:4222`,
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, _ []string) error { return runBridge(cmd.Context(), g, f) },
	}
	cmd.Flags().StringVar(&f.run, "run", env("STILLPOINT_RUN"), "run id (env STILLPOINT_RUN)")
	cmd.Flags().StringVar(&f.name, "name", "main", "bridge name: it publishes as bridge.<name>")
	cmd.Flags().StringVar(&f.listen, "listen", "127.0.0.1:7070", "HTTP API address")
	cmd.Flags().StringVar(&f.tokenFile, "token-file", "", "file holding the API bearer token (else env STILLPOINT_BRIDGE_TOKEN)")
	cmd.Flags().DurationVar(&f.timeout, "phase-timeout", bridge.DefaultPhaseTimeout, "default deadline of a phase")
	cmd.Flags().IntVar(&f.replicas, "replicas", 1, "replicas to provision the bus with if it is not provisioned yet")
	return cmd
}

// bridgeToken reads the API token from a file or the environment.
func bridgeToken(file string) (string, error) {
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("--token-file: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return os.Getenv("STILLPOINT_BRIDGE_TOKEN"), nil
}

// openBus connects to NATS and opens the bus, provisioning it if it is not
// there yet.
func openBus(ctx context.Context, g *globals, name string, replicas int) (*jetstream.Bus, natsjs.JetStream, func(), error) {
	conn := g.conn
	if conn.URL == "" {
		conn.URL = "nats://127.0.0.1:4222"
	}
	conn.Name = name
	nc, js, err := connectJS(ctx, conn)
	if err != nil {
		return nil, nil, nil, err
	}
	bus, err := jetstream.Open(ctx, js)
	if errors.Is(err, jetstream.ErrNotProvisioned) {
		bus, err = jetstream.Provision(ctx, js, jetstream.Topology{Replicas: replicas})
	}
	if err != nil {
		nc.Close()
		return nil, nil, nil, err
	}
	// Flush and close, not drain: what the command published is out, and
	// nothing it subscribed to is unsubscribed one by one, which for a KV
	// watch would delete its consumer, a delete a member's own credentials
	// may not do (the server removes the consumer once the connection is
	// gone).
	return bus, js, func() {
		_ = nc.FlushTimeout(5 * time.Second)
		nc.Close()
	}, nil
}

func runBridge(ctx context.Context, g *globals, f bridgeFlags) error {
	log, err := g.logger()
	if err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	token, err := bridgeToken(f.tokenFile)
	if err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	if token == "" {
		return &exitError{code: ExitUsage, err: errors.New("the API needs a bearer token: --token-file or STILLPOINT_BRIDGE_TOKEN")}
	}
	bus, js, closeBus, err := openBus(ctx, g, "stillpoint-bridge-"+f.run, f.replicas)
	if err != nil {
		return err
	}
	defer closeBus()
	// The phases' live copies for the sandbox daemons go out on a
	// connection of their own (bridge.Config.LiveConn): the server delivers
	// each to every daemon before it reads on, and nothing else waits.
	live := g.conn
	if live.URL == "" {
		live.URL = "nats://127.0.0.1:4222"
	}
	live.Name = "stillpoint-bridge-" + f.run + "-live"
	lnc, err := jetstream.Connect(ctx, live)
	if err != nil {
		return err
	}
	defer func() {
		_ = lnc.FlushTimeout(5 * time.Second)
		lnc.Close()
	}()
	b, err := bridge.New(bridge.Config{Run: f.run, Name: f.name, JS: js, Bus: bus, Conn: connOf(js), LiveConn: lnc, Logger: log,
		PhaseTimeout: f.timeout, Metrics: metrics.New()})
	if err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", f.listen, err)
	}
	srv := &http.Server{Handler: b.Handler(token), ReadHeaderTimeout: 10 * time.Second}
	grp, gctx := errgroup.WithContext(ctx)
	grp.Go(func() error { return b.Run(gctx) })
	grp.Go(func() error { return b.Serve(gctx) })
	grp.Go(func() error {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	grp.Go(func() error {
		<-gctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	})
	log.Info().Str("run", f.run).Str("api", "http://"+ln.Addr().String()).Msg("bridge serving")
	fmt.Fprintf(g.stdout, "stillpoint: bridge of run %s serving on http://%s and NATS %s.>\n", f.run, ln.Addr(), bridgeapi.ServiceSubject(f.run, f.name))
	return grp.Wait()
}

// connectJS connects and returns the connection with its JetStream handle.
func connectJS(ctx context.Context, conn jetstream.ConnConfig) (*nats.Conn, natsjs.JetStream, error) {
	nc, err := jetstream.Connect(ctx, conn)
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// connOf returns the NATS connection under a JetStream handle.
func connOf(js natsjs.JetStream) *nats.Conn { return js.Conn() }
