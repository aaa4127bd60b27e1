package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"

	"github.com/stillpoint/stillpoint/internal/signals"
)

func main() {
	var cfg nodeConfig
	flag.StringVar(&cfg.name, "name", "", "the server's name")
	flag.StringVar(&cfg.dir, "dir", "", "its JetStream store")
	flag.StringVar(&cfg.listen, "listen", "127.0.0.1:0", "client address host:port (port 0: random)")
	flag.StringVar(&cfg.clusterListen, "cluster-listen", "", "route address host:port (empty: no cluster)")
	flag.StringVar(&cfg.routes, "routes", "", "every node's route URL, comma-separated")
	flag.StringVar(&cfg.monitor, "monitor", "127.0.0.1:0", "HTTP monitoring address host:port (port 0: random; empty: none)")
	flag.IntVar(&cfg.maxConsumers, "max-consumers", 0, "the default limit of consumers per stream (0: nats-server's, -1: none)")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "scalenode %s: -cpuprofile: %v\n", cfg.name, err)
			os.Exit(2)
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
	}

	// A second signal exits at once.
	ctx, sigs := signals.Notify(context.Background(), signals.Die)
	defer sigs.Stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "scalenode %s: %v\n", cfg.name, err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}
