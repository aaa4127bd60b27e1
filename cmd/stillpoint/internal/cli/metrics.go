package cli

import (
	"context"
	"fmt"
	"net"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/member"
)

// metricsAddrFlag adds --metrics-addr to fl.
func metricsAddrFlag(fl *pflag.FlagSet, p *string) {
	fl.StringVar(p, "metrics-addr", "", "serve /metrics, /healthz and /readyz on this address (e.g. 127.0.0.1:9464; default off; docs/OPERATIONS.md)")
}

// startMetrics serves set and ready on addr (nothing when addr is empty)
// until the returned stop is called, which waits for the server to end.
// what names the process in the line it prints.
func startMetrics(ctx context.Context, g *globals, addr, what string, set *metrics.Set, ready metrics.Probe) (stop func() error, err error) {
	if addr == "" {
		return func() error { return nil }, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, &exitError{code: ExitUsage, err: fmt.Errorf("--metrics-addr %s: %w", addr, err)}
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- metrics.Serve(sctx, ln, metrics.Handler(set, ready)) }()
	fmt.Fprintf(g.stdout, "stillpoint: %s metrics on http://%s%s\n", what, ln.Addr(), metrics.PathMetrics)
	return func() error {
		cancel()
		return <-done
	}, nil
}

// memberReady is a member process's readiness: connected, its member
// registered (m may be nil: a process without one), and its durable
// consumer on the stream.
func memberReady(nc *nats.Conn, bus *jetstream.Bus, run string, m *member.Member) metrics.Probe {
	if m == nil {
		return metrics.All(metrics.Connected(nc), metrics.StreamAnswers(bus.Stream))
	}
	return metrics.All(metrics.Connected(nc), metrics.Closed("member "+string(m.Name())+" not registered yet", m.Joined()),
		metrics.ConsumerLive(bus.Stream, member.ConsumerName(run, m.Name())))
}
