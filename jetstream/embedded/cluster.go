package embedded

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/internal/freeport"
)

// Defaults of ClusterConfig.
const (
	// DefaultNodes is the size of a cluster: the smallest that survives losing a node.
	DefaultNodes = 3
	// DefaultClusterName is the cluster's name.
	DefaultClusterName = "stillpoint"
)

// ClusterConfig configures a cluster of embedded JetStream servers on one host, for tests of
// replicated (R3) streams.
type ClusterConfig struct {
	// Dir holds one store directory per node, Dir/n0, Dir/n1, ... Required.
	Dir string
	// Nodes is the number of servers (default 3).
	Nodes int
	// Host is the interface every node listens on, for clients and routes (default 127.0.0.1).
	Host string
	// Name is the cluster's name (default "stillpoint").
	Name string
	// Token, if set, is required from every client of every node.
	Token string
	// Users, if set, are the only clients every node admits, each by its nkey and with its
	// permissions (RoleUsers makes one per Role). At most one of Token, Users and Trust. Routes
	// between the nodes need none of them.
	Users []User
	// Trust, if set, runs every node in operator mode (Config.Trust).
	Trust *Trust
	// Logger receives every node's logs, with a server field naming the node (the zero value
	// discards them).
	Logger zerolog.Logger
	// ReadyTimeout bounds the wait for every node to be ready and a meta leader to be elected
	// (default DefaultClusterReadyTimeout).
	ReadyTimeout time.Duration
}

func (c *ClusterConfig) setDefaults() {
	if c.Nodes == 0 {
		c.Nodes = DefaultNodes
	}
	if c.Host == "" {
		c.Host = DefaultHost
	}
	if c.Name == "" {
		c.Name = DefaultClusterName
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = DefaultClusterReadyTimeout
	}
}

// Validate reports every problem of c, joined, each wrapping ErrInvalidConfig and naming the
// field. Call it after defaults; StartCluster does both.
func (c ClusterConfig) Validate() error {
	var errs []error
	if c.Dir == "" {
		errs = append(errs, fmt.Errorf("%w: ClusterConfig.Dir: required", ErrInvalidConfig))
	}
	if c.Nodes < 1 {
		errs = append(errs, fmt.Errorf("%w: ClusterConfig.Nodes %d: must be at least 1", ErrInvalidConfig, c.Nodes))
	}
	if strings.ContainsAny(c.Name, " \t\n.*>") {
		errs = append(errs, fmt.Errorf("%w: ClusterConfig.Name %q: must not contain spaces, dots or wildcards", ErrInvalidConfig, c.Name))
	}
	if c.ReadyTimeout < 0 {
		errs = append(errs, fmt.Errorf("%w: ClusterConfig.ReadyTimeout %s: must not be negative", ErrInvalidConfig, c.ReadyTimeout))
	}
	errs = append(errs, validateUsers("ClusterConfig.Users", c.Users, c.Token)...)
	errs = append(errs, validateTrust("ClusterConfig", c.Trust, c.Users, c.Token)...)
	return errors.Join(errs...)
}

// Cluster is a running cluster of embedded JetStream servers, named n0, n1, ...
type Cluster struct {
	nodes []*Server
	ports *freeport.Ports // the route ports, held until Shutdown
}

// StartCluster starts cfg.Nodes JetStream servers that route to each other, each with a random
// client port and its own store under cfg.Dir, and returns once every node is ready, a JetStream
// meta leader has been elected, it sees every node as a peer, and every node follows it. JetStream
// API calls fail or time out before that. The caller must call Shutdown.
func StartCluster(ctx context.Context, cfg ClusterConfig) (*Cluster, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	// Each node's routes name every node's route port before that node
	// has bound it: ports below the ephemeral range, which a starting
	// node's outgoing route connections cannot take (internal/freeport).
	ps, err := freeport.Reserve(cfg.Host, cfg.Nodes)
	if err != nil {
		return nil, fmt.Errorf("embedded: cluster ports: %w", err)
	}
	routes := make([]string, len(ps.List))
	for i := range ps.List {
		routes[i] = "nats-route://" + ps.Addr(cfg.Host, i)
	}

	c := &Cluster{ports: ps}
	for i, port := range ps.List {
		name := "n" + strconv.Itoa(i)
		opts := &server.Options{
			ServerName:    name,
			Host:          cfg.Host,
			Port:          server.RANDOM_PORT,
			JetStream:     true,
			StoreDir:      filepath.Join(cfg.Dir, name),
			NoSigs:        true,
			Authorization: cfg.Token,
			Nkeys:         nkeyUsers(cfg.Users),
			PingInterval:  PingInterval,
			MaxPingsOut:   MaxPingsOut,
			Cluster: server.ClusterOpts{
				Name: cfg.Name,
				Host: cfg.Host,
				Port: port,
			},
			Routes: server.RoutesFromStr(strings.Join(routes, ",")),
		}
		if err := cfg.Trust.apply(opts); err != nil {
			c.Shutdown()
			return nil, err
		}
		s, err := startNode(opts, cfg.Logger)
		if err != nil {
			c.Shutdown()
			return nil, fmt.Errorf("embedded: cluster node %s: %w", name, err)
		}
		c.nodes = append(c.nodes, s)
	}
	ready := func() error {
		if err := c.metaReady(); err != nil {
			return err
		}
		return accountsReady(c.nodes, cfg.Trust)
	}
	if err := waitReady(ctx, cfg.ReadyTimeout, c.nodes, ready); err != nil {
		c.Shutdown()
		return nil, fmt.Errorf("embedded: cluster %s: %w", cfg.Name, err)
	}
	return c, nil
}

// metaReady returns nil once exactly one node is the meta leader, it counts every node as a
// peer, and every node is current with it and names it as leader.
func (c *Cluster) metaReady() error {
	var leaders []*Server
	for _, n := range c.nodes {
		if n.ns.JetStreamIsLeader() {
			leaders = append(leaders, n)
		}
	}
	if len(leaders) != 1 {
		return fmt.Errorf("%d JetStream meta leaders, want 1", len(leaders))
	}
	leader := leaders[0]
	if peers := leader.ns.JetStreamClusterPeers(); len(peers) != len(c.nodes) {
		return fmt.Errorf("meta leader %s sees %d peers, want %d", leader.Name(), len(peers), len(c.nodes))
	}
	for _, n := range c.nodes {
		if !n.ns.JetStreamIsCurrent() {
			return fmt.Errorf("server %s: not current with the meta leader", n.Name())
		}
		info, err := n.ns.Jsz(nil)
		if err != nil {
			return fmt.Errorf("server %s: jsz: %w", n.Name(), err)
		}
		if info.Meta == nil || info.Meta.Leader != leader.Name() {
			var got string
			if info.Meta != nil {
				got = info.Meta.Leader
			}
			return fmt.Errorf("server %s: meta leader %q, want %q", n.Name(), got, leader.Name())
		}
	}
	return nil
}

// URL returns every node's client URL, joined by commas, as nats.Connect and ConnConfig.URL take it.
func (c *Cluster) URL() string {
	return strings.Join(c.ClientURLs(), ",")
}

// ClientURLs returns every node's client URL, in node order.
func (c *Cluster) ClientURLs() []string {
	urls := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		urls[i] = n.ClientURL()
	}
	return urls
}

// Len returns the number of nodes.
func (c *Cluster) Len() int {
	return len(c.nodes)
}

// Node returns node i (named "n<i>"). It panics if i is out of range.
func (c *Cluster) Node(i int) *Server {
	return c.nodes[i]
}

// Shutdown stops every node at once and waits until all have stopped. It is safe to call more
// than once.
func (c *Cluster) Shutdown() {
	var wg sync.WaitGroup
	for _, n := range c.nodes {
		wg.Go(n.Shutdown)
	}
	wg.Wait()
	if c.ports != nil {
		c.ports.Release()
	}
}
