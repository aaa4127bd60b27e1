package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/cmd/stillpoint/demo"
	"github.com/stillpoint/stillpoint/e2e/netns"
)

// The ports of a NATS node in its namespace: each node has an address of
// its own, so every node uses the same ones.
const (
	natsClientPort = 4222
	natsRoutePort  = 6222
)

// hostNode is the network's name for chaos's own namespace: the bridge,
// the collector, the checker, the model server and the proxies run there.
const hostNode = "host"

// netWorld is chaos's network with --netns: a namespace for each NATS
// node and for each fleet node (an agent and its owner, with the owner's
// sandboxes), joined by a bridge to each other and to chaos's own
// namespace, and a latency proxy in chaos's namespace in front of each NATS
// node's client port. Every client (the fleet, the bridge, chaos) dials
// the proxies, and each node advertises its proxy, so that a client's
// reconnect goes through one too.
type netWorld struct {
	net     *netns.Net
	proxies []*netns.Proxy // by NATS node
}

// natsNetNode is the network's name of NATS node i.
func natsNetNode(i int) string { return "nats" + strconv.Itoa(i) }

// fleetNetNode is the network's name of agent's node (the agent, its
// owner and the owner's sandboxes).
func fleetNetNode(agent string) string { return "node-" + agent }

// startNet makes the network for the NATS nodes and agents' nodes, and
// the proxies in front of the NATS nodes.
func startNet(ctx context.Context, agents []string) (*netWorld, error) {
	nodes := make([]string, 0, clusterNodes+len(agents))
	for i := range clusterNodes {
		nodes = append(nodes, natsNetNode(i))
	}
	for _, a := range agents {
		nodes = append(nodes, fleetNetNode(a))
	}
	n, err := netns.Config{Name: "chaos", Nodes: nodes, Host: hostNode}.New(ctx)
	if err != nil {
		return nil, fmt.Errorf("chaos: --netns: %w", err)
	}
	nw := &netWorld{net: n}
	for i := range clusterNodes {
		p, err := netns.NewProxy(net.JoinHostPort(n.HostAddr().String(), "0"), nw.clientAddr(i))
		if err != nil {
			nw.close()
			return nil, fmt.Errorf("chaos: --netns: the proxy of NATS node %d: %w", i, err)
		}
		nw.proxies = append(nw.proxies, p)
	}
	return nw, nil
}

// clientAddr is NATS node i's client address in its namespace.
func (nw *netWorld) clientAddr(i int) string {
	return netip.AddrPortFrom(nw.net.Addr(natsNetNode(i)), natsClientPort).String()
}

// routeAddr is NATS node i's route address in its namespace.
func (nw *netWorld) routeAddr(i int) string {
	return netip.AddrPortFrom(nw.net.Addr(natsNetNode(i)), natsRoutePort).String()
}

// advertise is the client address NATS node i tells clients of: its
// proxy's.
func (nw *netWorld) advertise(i int) string { return nw.proxies[i].Addr() }

// enter is the argv prefix that runs a program in NATS node i's
// namespace.
func (nw *netWorld) enter(i int) []string { return nw.net.Enter(natsNetNode(i)) }

// tag is the network's tag, which its namespaces are named after.
func (nw *netWorld) tag() string { return nw.net.Tag() }

// close removes the proxies and the network.
func (nw *netWorld) close() {
	for _, p := range nw.proxies {
		_ = p.Close()
	}
	_ = nw.net.Close()
}

// wrap is the fleet's FleetConfig.Wrap: an agent and its owner enter
// their node's network namespace; the bridge stays in chaos's.
func (nw *netWorld) wrap(agents []string) func(string) []string {
	return func(proc string) []string {
		for _, a := range agents {
			if proc == "agent-"+a || proc == demo.OwnerProc(demo.NodeOwner(a)) {
				return nw.net.Enter(fleetNetNode(a))
			}
		}
		return nil
	}
}

// heal undoes every network fault: the cuts, the losses, the links down
// and the bandwidth bounds, and the proxies' latency.
func (nw *netWorld) heal(ctx context.Context) error {
	for _, p := range nw.proxies {
		p.Reset()
	}
	return nw.net.Heal(ctx)
}

// netFault injects network fault p, holds it and heals it; it returns
// once healed, or once ctx ends (healed then too).
func (i *injector) netFault(ctx context.Context, p plannedFault) error {
	nw := i.w.net
	if nw == nil {
		return fmt.Errorf("%s is a fault of --netns", p.kind)
	}
	d := i.d
	// The fault heals even when the round ends under it.
	hctx := context.WithoutCancel(ctx)
	hold := faultHold
	var heal func() error
	switch p.kind {
	case FaultPartition:
		node := fleetNetNode(i.agents[i.rng.IntN(len(i.agents))])
		hold = partitionHold
		if i.rng.IntN(2) == 0 {
			d.Say("partition at %s: node %s cut off from every other, both ways, for %s", p.phase, node, hold)
			heal = func() error { return nw.net.Rejoin(hctx, node) }
			if err := nw.net.Isolate(ctx, node); err != nil {
				return errors.Join(err, heal())
			}
		} else {
			d.Say("partition at %s: node %s's link down for %s", p.phase, node, hold)
			heal = func() error { return nw.net.LinkUp(hctx, node) }
			if err := nw.net.LinkDown(ctx, node); err != nil {
				return errors.Join(err, heal())
			}
		}
	case FaultOneWay:
		node := fleetNetNode(i.agents[i.rng.IntN(len(i.agents))])
		in := i.rng.IntN(2) == 0
		others := slices.DeleteFunc(append(nw.net.Nodes(), hostNode), func(n string) bool { return n == node })
		dir := "it hears nothing"
		if !in {
			dir = "nobody hears it"
		}
		d.Say("one-way partition at %s: node %s, %s, for %s", p.phase, node, dir, hold)
		var errs []error
		for _, o := range others {
			if in {
				errs = append(errs, nw.net.CutOneWay(ctx, o, node))
			} else {
				errs = append(errs, nw.net.CutOneWay(ctx, node, o))
			}
		}
		heal = func() error { return nw.net.Rejoin(hctx, node) }
		if err := errors.Join(errs...); err != nil {
			return errors.Join(err, heal())
		}
	case FaultSplit:
		k := i.rng.IntN(clusterNodes)
		var majority []string
		for j := range clusterNodes {
			if j != k {
				majority = append(majority, natsNetNode(j))
			}
		}
		d.Say("split at %s: NATS node %s apart from %s, for %s", p.phase, natsNetNode(k), strings.Join(majority, " and "), hold)
		heal = func() error {
			var errs []error
			for _, m := range majority {
				errs = append(errs, nw.net.Uncut(hctx, natsNetNode(k), m))
			}
			return errors.Join(errs...)
		}
		if err := nw.net.Split(ctx, []string{natsNetNode(k)}, majority); err != nil {
			return errors.Join(err, heal())
		}
	case FaultSlow:
		latency := time.Duration(50+i.rng.IntN(200)) * time.Millisecond
		node := fleetNetNode(i.agents[i.rng.IntN(len(i.agents))])
		const bits = 2_000_000
		d.Say("slow at %s: %s latency, give or take %s, on every NATS connection; node %s bound to %d kbit/s; for %s",
			p.phase, latency, latency/2, node, bits/1000, hold)
		var errs []error
		for _, px := range nw.proxies {
			errs = append(errs, px.SetLatency(latency, latency/2))
		}
		errs = append(errs, nw.net.Bandwidth(ctx, node, bits))
		heal = func() error {
			for _, px := range nw.proxies {
				px.Reset()
			}
			return nw.net.Bandwidth(hctx, node, 0)
		}
		if err := errors.Join(errs...); err != nil {
			return errors.Join(err, heal())
		}
	case FaultLossy:
		nodes := nw.net.Nodes()
		node := nodes[i.rng.IntN(len(nodes))]
		percent := 5 + i.rng.IntN(16)
		d.Say("lossy at %s: %d%% of node %s's packets dropped, for %s", p.phase, percent, node, hold)
		heal = func() error { return nw.net.Loss(hctx, node, 0) }
		if err := nw.net.Loss(ctx, node, percent); err != nil {
			return errors.Join(err, heal())
		}
	default:
		return fmt.Errorf("unknown network fault %q", p.kind)
	}
	if i.applied != nil {
		i.applied()
	}
	t := time.NewTimer(hold)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	if err := heal(); err != nil {
		return fmt.Errorf("%s: heal: %w", p, err)
	}
	d.Say("%s healed", p.kind)
	return nil
}

// wrap is the fleet's FleetConfig.Wrap: nil without --netns.
func (w *chaosWorld) wrap() func(string) []string {
	if w.net == nil {
		return nil
	}
	return w.net.wrap(demo.AgentNames(w.f.agents))
}

// modelHost is the address the model server listens on: with --netns,
// chaos's address on the network, which the sandboxes reach.
func (w *chaosWorld) modelHost() string {
	if w.net == nil {
		return "127.0.0.1"
	}
	return w.net.net.HostAddr().String()
}
