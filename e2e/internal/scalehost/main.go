package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime/pprof"
	"strings"

	"github.com/stillpoint/stillpoint/internal/signals"
)

func main() {
	var cfg hostConfig
	flag.StringVar(&cfg.url, "url", "", "the NATS URL (several separated by commas)")
	flag.StringVar(&cfg.run, "run", "", "the run id")
	flag.StringVar(&cfg.name, "name", "", "this process's name; its members are sandbox.<name>-<i>")
	flag.IntVar(&cfg.members, "members", 0, "how many members to host")
	flag.StringVar(&cfg.stateDir, "state-dir", "", "where each member keeps its state file")
	flag.StringVar(&cfg.conns, "conns", connsMember, "one connection per member (member) or one for the process (host)")
	flag.StringVar(&cfg.floorSubject, "floor-subject", "", "the core-NATS subject of the bus floor's rounds (empty: no floor)")
	flag.StringVar(&cfg.floorRun, "floor-run", "", "the run id of the floor's ack subjects")
	flag.BoolVar(&cfg.floorOnly, "floor-only", false, "start no member: answer the floor alone")
	flag.IntVar(&cfg.starting, "starting", 32, "how many members start at once")
	cpuProfile := flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "scalehost %s: -cpuprofile: %v\n", cfg.name, err)
			os.Exit(2)
		}
		defer func() { pprof.StopCPUProfile(); _ = f.Close() }()
		// And what it allocated, beside it: the garbage collector is a
		// tenth of a member host's CPU.
		defer writeAllocs(strings.TrimSuffix(*cpuProfile, ".pprof") + ".allocs.pprof")
	}

	// A second signal exits at once.
	ctx, sigs := signals.Notify(context.Background(), signals.Die)
	defer sigs.Stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "scalehost %s: %v\n", cfg.name, err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// writeAllocs writes the process's allocation profile to path.
func writeAllocs(path string) {
	f, err := os.Create(path)
	if err == nil {
		err = errors.Join(pprof.Lookup("allocs").WriteTo(f, 0), f.Close())
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "scalehost: allocation profile: %v\n", err)
	}
}
