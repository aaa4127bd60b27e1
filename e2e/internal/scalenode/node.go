package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// nodeConfig is the process's flags.
type nodeConfig struct {
	name, dir, listen, clusterListen, routes, monitor string
	maxConsumers                                      int
}

// clusterName names the benchmark's cluster.
const clusterName = "stillpoint-scale"

// run serves until ctx ends.
func run(ctx context.Context, cfg nodeConfig, out io.Writer) error {
	if cfg.name == "" || cfg.dir == "" {
		return errors.New("-name and -dir are required")
	}
	host, port, err := hostPort(cfg.listen)
	if err != nil {
		return fmt.Errorf("-listen: %w", err)
	}
	opts := &server.Options{ServerName: cfg.name, Host: host, Port: port, JetStream: true, StoreDir: cfg.dir,
		NoSigs: true, Logtime: true}
	if port == 0 {
		opts.Port = server.RANDOM_PORT
	}
	opts.JetStreamLimits.DefaultMaxConsumers = cfg.maxConsumers
	if cfg.monitor != "" {
		mhost, mport, err := hostPort(cfg.monitor)
		if err != nil {
			return fmt.Errorf("-monitor: %w", err)
		}
		opts.HTTPHost, opts.HTTPPort = mhost, mport
		if mport == 0 {
			opts.HTTPPort = server.RANDOM_PORT
		}
	}
	if cfg.clusterListen != "" {
		chost, cport, err := hostPort(cfg.clusterListen)
		if err != nil {
			return fmt.Errorf("-cluster-listen: %w", err)
		}
		if cfg.routes == "" {
			return errors.New("-routes: required with -cluster-listen")
		}
		opts.Cluster = server.ClusterOpts{Name: clusterName, Host: chost, Port: cport}
		opts.Routes = server.RoutesFromStr(cfg.routes)
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return err
	}
	ns.ConfigureLogger()
	ns.Start()
	defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
	if !ns.ReadyForConnections(time.Minute) {
		return errors.New("not ready for connections after a minute")
	}
	monitor := "none"
	if addr := ns.MonitorAddr(); addr != nil {
		monitor = "http://" + addr.String()
	}
	fmt.Fprintf(out, "scalenode %s ready at %s monitor %s\n", cfg.name, ns.ClientURL(), monitor)
	<-ctx.Done()
	return nil
}

func hostPort(s string) (string, int, error) {
	h, p, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.Atoi(p)
	return h, n, err
}
