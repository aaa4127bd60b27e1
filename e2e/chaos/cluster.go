package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/stillpoint/stillpoint/cmd/stillpoint/demo"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
)

// clusterNodes is the size of chaos's cluster: the smallest that keeps a
// quorum without one node.
const clusterNodes = 3

// nodeFlags are those of `chaos node`.
type nodeFlags struct {
	name, dir, listen, clusterListen, routes, advertise string
}

// nodeCommand is `chaos node`: one JetStream server of a
// cluster, as its own process, so that chaos can kill one node alone (a
// real crash) and start it again on its store. It prints
// "node <name> ready at <url>" once it serves, and stops on SIGTERM.
func nodeCommand() *cobra.Command {
	var f nodeFlags
	cmd := &cobra.Command{
		Use:    "node",
		Short:  "Run one node of chaos's NATS cluster (chaos starts them)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runNode(cmd.Context(), cmd.OutOrStdout(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.name, "name", "", "the node's server name")
	fl.StringVar(&f.dir, "dir", "", "its JetStream store")
	fl.StringVar(&f.listen, "listen", "", "client address host:port")
	fl.StringVar(&f.clusterListen, "cluster-listen", "", "route address host:port")
	fl.StringVar(&f.routes, "routes", "", "every node's route URL, comma-separated")
	fl.StringVar(&f.advertise, "advertise", "", "the client address host:port the node tells clients of (default: its --listen)")
	return cmd
}

func runNode(ctx context.Context, out interface{ Write([]byte) (int, error) }, f nodeFlags) error {
	host, port, err := splitHostPort(f.listen)
	if err != nil {
		return fmt.Errorf("%w: --listen: %v", ErrUsage, err)
	}
	chost, cport, err := splitHostPort(f.clusterListen)
	if err != nil {
		return fmt.Errorf("%w: --cluster-listen: %v", ErrUsage, err)
	}
	if f.name == "" || f.dir == "" || f.routes == "" {
		return fmt.Errorf("%w: --name, --dir and --routes are required", ErrUsage)
	}
	ns, err := server.NewServer(&server.Options{
		ServerName: f.name, Host: host, Port: port, JetStream: true, StoreDir: f.dir, NoSigs: true, Logtime: true, ClientAdvertise: f.advertise,
		PingInterval: embedded.PingInterval, MaxPingsOut: embedded.MaxPingsOut,
		Cluster: server.ClusterOpts{Name: "stillpoint-chaos", Host: chost, Port: cport},
		Routes:  server.RoutesFromStr(f.routes),
	})
	if err != nil {
		return fmt.Errorf("chaos node %s: %w", f.name, err)
	}
	ns.ConfigureLogger()
	ns.Start()
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if !ns.ReadyForConnections(30 * time.Second) {
		return fmt.Errorf("chaos node %s: not ready for connections after 30 s", f.name)
	}
	fmt.Fprintf(out, "node %s ready at %s\n", f.name, ns.ClientURL())
	<-ctx.Done() // the command's: SIGTERM or SIGINT ends it
	return nil
}

func splitHostPort(s string) (string, int, error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.Atoi(p)
	return h, n, err
}

// nodeReadyRE is the line a node prints once it serves.
var nodeReadyRE = regexp.MustCompile(`node \S+ ready at (\S+)`)

// clusterNode is one node process of chaos's cluster and its addresses.
type clusterNode struct {
	name, client, route string
	// advertise is the client address the node tells clients of: with
	// --netns, its proxy's.
	advertise string
	proc      *child.Process
}

// startCluster starts clusterNodes node processes that route to each
// other, waits until each serves, and provisions the bus at R3 (which
// succeeds once a JetStream meta leader is elected).
func (w *chaosWorld) startCluster(ctx context.Context) error {
	var routes []string
	if w.net != nil {
		// Each node in its namespace; clients dial its proxy.
		for i := range clusterNodes {
			w.nodes = append(w.nodes, &clusterNode{name: "n" + strconv.Itoa(i), client: w.net.clientAddr(i), route: w.net.routeAddr(i),
				advertise: w.net.advertise(i)})
			routes = append(routes, "nats-route://"+w.net.routeAddr(i))
		}
	} else {
		addrs, err := demo.FreeAddrs(2 * clusterNodes)
		if err != nil {
			return err
		}
		for i := range clusterNodes {
			w.nodes = append(w.nodes, &clusterNode{name: "n" + strconv.Itoa(i), client: addrs[2*i], route: addrs[2*i+1]})
			routes = append(routes, "nats-route://"+addrs[2*i+1])
		}
	}
	w.routes = strings.Join(routes, ",")
	var urls []string
	for i, n := range w.nodes {
		if err := w.startNode(ctx, i); err != nil {
			return err
		}
		urls = append(urls, "nats://"+cmp.Or(n.advertise, n.client))
	}
	w.natsURL = strings.Join(urls, ",")
	nc, js, err := demo.ConnectJS(ctx, jetstream.ConnConfig{URL: w.natsURL, Name: "stillpoint-chaos-provision"})
	if err != nil {
		return err
	}
	defer nc.Close()
	pctx, cancel := context.WithTimeoutCause(ctx, 60*time.Second, errors.New("chaos: the cluster did not elect a JetStream leader in 60 s"))
	defer cancel()
	var last error
	err = poll.Until(pctx, poll.Every(250*time.Millisecond), func() (bool, error) {
		// Each try its own deadline: a request the cluster drops while it
		// elects its leader would otherwise wait out the whole minute.
		once, cancel := context.WithTimeout(pctx, 5*time.Second)
		defer cancel()
		_, last = jetstream.Provision(once, js, jetstream.Topology{Replicas: clusterNodes})
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("chaos: provision the cluster at R%d: %w (last: %v)", clusterNodes, err, last)
	}
	return nil
}

// startNode starts node i (again, on its store and addresses) and waits
// until it serves.
func (w *chaosWorld) startNode(ctx context.Context, i int) error {
	n := w.nodes[i]
	log := filepath.Join(w.dir, "nats-"+n.name+".log")
	path, args := w.self, []string{"node", "--name", n.name, "--dir", filepath.Join(w.dir, "nats", n.name),
		"--listen", n.client, "--cluster-listen", n.route, "--routes", w.routes}
	if n.advertise != "" {
		args = append(args, "--advertise", n.advertise)
	}
	if w.net != nil {
		pre := w.net.enter(i)
		path, args = pre[0], slices.Concat(pre[1:], []string{w.self}, args)
	}
	p, err := child.Start(child.Spec{Name: "nats-" + n.name, Path: path, LogFile: log, Args: args})
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if _, err := p.WaitOutput(wctx, nodeReadyRE); err != nil {
		p.Stop()
		return fmt.Errorf("chaos: node %s did not come up (see %s): %w", n.name, log, err)
	}
	w.mu.Lock()
	n.proc = p
	w.mu.Unlock()
	return nil
}

// killNode kills node i with SIGKILL and waits for it to exit.
func (w *chaosWorld) killNode(ctx context.Context, i int) error {
	w.mu.Lock()
	p := w.nodes[i].proc
	w.mu.Unlock()
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.Kill(kctx); err != nil {
		return err
	}
	p.Stop()
	return nil
}

// stopCluster stops every node.
func (w *chaosWorld) stopCluster() {
	w.mu.Lock()
	nodes := w.nodes
	w.mu.Unlock()
	for _, n := range nodes {
		if n.proc != nil {
			n.proc.Stop()
		}
	}
}

// clusterSettle bounds waitCurrent: a node started again catches up on
// every stream, and elections take seconds on a loaded machine.
const clusterSettle = 2 * time.Minute

// waitCurrent waits until every stream of the cluster has a leader and
// every replica is current, before a round starts its processes: a node
// killed in the round before may still be catching up, and a process that
// opens the bus meanwhile can time out and exit (the owner did, opening
// its bucket).
func waitCurrent(ctx context.Context, js natsjs.JetStream) error {
	pctx, cancel := context.WithTimeoutCause(ctx, clusterSettle, fmt.Errorf("chaos: the cluster's streams were not all current within %s", clusterSettle))
	defer cancel()
	var last error
	err := poll.Until(pctx, poll.Every(250*time.Millisecond), func() (bool, error) {
		// Each try its own deadline, as in startCluster.
		once, cancel := context.WithTimeout(pctx, 5*time.Second)
		defer cancel()
		last = streamsCurrent(once, js)
		return last == nil, nil
	})
	if err != nil {
		return fmt.Errorf("%w (last: %v)", context.Cause(pctx), last)
	}
	return nil
}

// streamsCurrent returns why not every stream has a leader and current
// replicas, nil if they do.
func streamsCurrent(ctx context.Context, js natsjs.JetStream) error {
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		s, err := js.Stream(ctx, name)
		if err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			return fmt.Errorf("stream %s: %w", name, err)
		}
		if info.Cluster == nil || info.Cluster.Leader == "" {
			return fmt.Errorf("stream %s has no leader", name)
		}
		for _, r := range info.Cluster.Replicas {
			if !r.Current || r.Offline {
				return fmt.Errorf("stream %s: replica %s not current", name, r.Name)
			}
		}
	}
	return names.Err()
}
