package netns

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// table is the nftables table this package owns in each node's namespace.
const table = "inet stillpoint_netns"

// Cut drops every packet between a and b, both ways, until Uncut or Heal.
// Either may be the host: the rules are then in the other's namespace
// only, in its input and output hooks.
func (n *Net) Cut(ctx context.Context, a, b string) error {
	return n.change(ctx, []string{a, b}, func() error {
		if a == b {
			return fmt.Errorf("netns: Cut(%s, %s): a node cannot be cut from itself", a, b)
		}
		n.cut(a, b)
		n.cut(b, a)
		return nil
	}, n.ends(a, b)...)
}

// CutOneWay drops every packet from from to to, in to's input hook (in
// from's output hook if to is the host), until UncutOneWay, Uncut or Heal.
// A TCP connection needs both ways, so it stops TCP between the two both
// ways; datagrams the other way pass.
func (n *Net) CutOneWay(ctx context.Context, from, to string) error {
	return n.change(ctx, []string{from, to}, func() error {
		if from == to {
			return fmt.Errorf("netns: CutOneWay(%s, %s): a node cannot be cut from itself", from, to)
		}
		n.cut(from, to)
		return nil
	}, n.ends(from, to)...)
}

// Uncut ends the cuts between a and b, both ways.
func (n *Net) Uncut(ctx context.Context, a, b string) error {
	return n.change(ctx, []string{a, b}, func() error {
		n.uncut(a, b)
		n.uncut(b, a)
		return nil
	}, n.ends(a, b)...)
}

// UncutOneWay ends the cut from from to to (a cut the other way stays).
func (n *Net) UncutOneWay(ctx context.Context, from, to string) error {
	return n.change(ctx, []string{from, to}, func() error {
		n.uncut(from, to)
		return nil
	}, n.ends(from, to)...)
}

// Isolate cuts node from every other node and the host, both ways; the
// host may be isolated from every node too.
func (n *Net) Isolate(ctx context.Context, node string) error {
	return n.change(ctx, []string{node}, func() error {
		for _, other := range n.all() {
			if other != node {
				n.cut(node, other)
				n.cut(other, node)
			}
		}
		return nil
	}, n.nodes...)
}

// Rejoin ends every cut to and from node (or the host).
func (n *Net) Rejoin(ctx context.Context, node string) error {
	return n.change(ctx, []string{node}, func() error {
		for _, other := range n.all() {
			if other != node {
				n.uncut(node, other)
				n.uncut(other, node)
			}
		}
		return nil
	}, n.nodes...)
}

// Split partitions the network: it cuts, both ways, every pair of nodes
// that are in different groups; a group may name the host. A node in no
// group keeps its links; a node in two groups is an error. Cuts already
// in force stay.
func (n *Net) Split(ctx context.Context, groups ...[]string) error {
	all := slices.Concat(groups...)
	return n.change(ctx, all, func() error {
		group := map[string]int{}
		for g, nodes := range groups {
			for _, node := range nodes {
				if h, ok := group[node]; ok && h != g {
					return fmt.Errorf("netns: Split: node %s is in groups %d and %d", node, h, g)
				}
				group[node] = g
			}
		}
		for a, ga := range group {
			for b, gb := range group {
				if ga != gb {
					n.cut(a, b)
				}
			}
		}
		return nil
	}, n.ends(all...)...)
}

// cut drops from's packets to to: in to's input hook, or in from's output
// hook if to is the host, whose namespace gets no rules.
func (n *Net) cut(from, to string) {
	if to == n.host {
		n.faults[n.index[from]].dropTo[to] = true
		return
	}
	n.faults[n.index[to]].dropFrom[from] = true
}

// uncut ends what cut(from, to) does.
func (n *Net) uncut(from, to string) {
	if to == n.host {
		delete(n.faults[n.index[from]].dropTo, to)
		return
	}
	delete(n.faults[n.index[to]].dropFrom, from)
}

// ends returns names without the host: the nodes whose tables a change of
// cuts among names rewrites.
func (n *Net) ends(names ...string) []string {
	var out []string
	for _, name := range names {
		if name != n.host && !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

// all returns the nodes and the host, if any.
func (n *Net) all() []string {
	if n.host == "" {
		return n.nodes
	}
	return append(n.Nodes(), n.host)
}

// notHost returns ErrHostFault, naming what, if node is the host.
func (n *Net) notHost(what, node string) error {
	if node == n.host {
		return fmt.Errorf("%w: %s(%s): it acts on a node's own link; cut the host instead", ErrHostFault, what, node)
	}
	return nil
}

// Loss drops each packet into or out of node with probability percent/100,
// until Loss(node, 0) or Heal. percent is from 0 to 100. It is for nodes
// only: for the host it returns ErrHostFault.
func (n *Net) Loss(ctx context.Context, node string, percent int) error {
	return n.change(ctx, []string{node}, func() error {
		if err := n.notHost("Loss", node); err != nil {
			return err
		}
		if percent < 0 || percent > 100 {
			return fmt.Errorf("netns: Loss(%s, %d): percent is from 0 to 100", node, percent)
		}
		n.faults[n.index[node]].loss = percent
		return nil
	}, node)
}

// change checks that nodes are known (the host is) and the network open,
// applies edit to the faults and rewrites the tables of the nodes in
// apply, which holds no host.
func (n *Net) change(ctx context.Context, nodes []string, edit func() error, apply ...string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	for _, node := range nodes {
		if err := n.known(node); err != nil {
			return err
		}
	}
	if err := edit(); err != nil {
		return err
	}
	var errs []error
	for _, node := range apply {
		errs = append(errs, n.applyRules(ctx, node))
	}
	return errors.Join(errs...)
}

// known returns ErrUnknownNode for a name that is neither a node of the
// network nor its host.
func (n *Net) known(node string) error {
	if _, ok := n.index[node]; !ok && (node != n.host || node == "") {
		return fmt.Errorf("%w: %q (nodes: %s)", ErrUnknownNode, node, strings.Join(n.all(), ", "))
	}
	return nil
}

// applyRules rewrites node's table from its faults in one nft transaction:
// it makes the table (so that deleting it cannot fail), deletes it, and
// makes it again with the rules in force, if any.
func (n *Net) applyRules(ctx context.Context, node string) error {
	f := n.faults[n.index[node]]
	var b strings.Builder
	fmt.Fprintf(&b, "table %s\ndelete table %s\n", table, table)
	var from, to []string
	for _, other := range n.all() {
		if f.dropFrom[other] {
			from = append(from, n.Addr(other).String())
		}
		if f.dropTo[other] {
			to = append(to, n.Addr(other).String())
		}
	}
	if len(from) > 0 || len(to) > 0 || f.loss > 0 {
		fmt.Fprintf(&b, "table %s {\n", table)
		b.WriteString("\tchain input {\n\t\ttype filter hook input priority filter; policy accept;\n\t\tiif \"lo\" accept\n")
		if len(from) > 0 {
			fmt.Fprintf(&b, "\t\tip saddr { %s } drop\n", strings.Join(from, ", "))
		}
		// numgen's range is 0 to 99: a loss of 100 drops all.
		lossRule := fmt.Sprintf("numgen random mod 100 < %d drop", f.loss)
		if f.loss == 100 {
			lossRule = "drop"
		}
		if f.loss > 0 {
			fmt.Fprintf(&b, "\t\t%s\n", lossRule)
		}
		b.WriteString("\t}\n")
		if len(to) > 0 || f.loss > 0 {
			b.WriteString("\tchain output {\n\t\ttype filter hook output priority filter; policy accept;\n\t\toif \"lo\" accept\n")
			if len(to) > 0 {
				fmt.Fprintf(&b, "\t\tip daddr { %s } drop\n", strings.Join(to, ", "))
			}
			if f.loss > 0 {
				fmt.Fprintf(&b, "\t\t%s\n", lossRule)
			}
			b.WriteString("\t}\n")
		}
		b.WriteString("}\n")
	}
	return runIn(ctx, node, b.String(), nil, "ip", "netns", "exec", n.NS(node), "nft", "-f", "-")
}

// LinkDown sets node's link (its end of the veth) down, until LinkUp or
// Heal: the node loses the carrier and every packet to or from it. It is
// for nodes only: for the host it returns ErrHostFault.
func (n *Net) LinkDown(ctx context.Context, node string) error {
	return n.link(ctx, node, true)
}

// LinkUp sets node's link up again.
func (n *Net) LinkUp(ctx context.Context, node string) error {
	return n.link(ctx, node, false)
}

func (n *Net) link(ctx context.Context, node string, down bool) error {
	return n.change(ctx, []string{node}, func() error {
		if err := n.notHost("LinkDown/LinkUp", node); err != nil {
			return err
		}
		n.faults[n.index[node]].down = down
		state := "up"
		if down {
			state = "down"
		}
		return run(ctx, node, nil, "ip", "-n", n.NS(node), "link", "set", "eth0", state)
	})
}

// Bandwidth bounds node's traffic to bits per second each way, with a tbf
// qdisc on the node's end of its veth (what it sends) and on the bridge's
// end (what it receives), until Bandwidth(node, 0) or Heal. It is for
// nodes only: for the host it returns ErrHostFault.
func (n *Net) Bandwidth(ctx context.Context, node string, bits uint64) error {
	return n.change(ctx, []string{node}, func() error {
		if err := n.notHost("Bandwidth", node); err != nil {
			return err
		}
		i := n.index[node]
		if bits == 0 {
			if n.faults[i].rate == 0 {
				return nil
			}
			n.faults[i].rate = 0
			return errors.Join(
				run(ctx, node, nil, "ip", "netns", "exec", n.NS(node), "tc", "qdisc", "del", "dev", "eth0", "root"),
				run(ctx, node, nil, "ip", "netns", "exec", n.bridgeNS(), "tc", "qdisc", "del", "dev", bridgePort(i), "root"))
		}
		n.faults[i].rate = bits
		// The bucket holds 20 ms of traffic, at least two full frames; a
		// packet waits at most 200 ms for tokens before it is dropped.
		burst := max(bits/8/50, 3200)
		tbf := []string{"tbf", "rate", strconv.FormatUint(bits, 10) + "bit", "burst", strconv.FormatUint(burst, 10), "latency", "200ms"}
		return errors.Join(
			run(ctx, node, nil, append([]string{"ip", "netns", "exec", n.NS(node), "tc", "qdisc", "replace", "dev", "eth0", "root"}, tbf...)...),
			run(ctx, node, nil, append([]string{"ip", "netns", "exec", n.bridgeNS(), "tc", "qdisc", "replace", "dev", bridgePort(i), "root"}, tbf...)...))
	})
}

// Heal ends every fault: cuts, loss, links down and bandwidth bounds. It
// goes on past an error, and returns them all.
func (n *Net) Heal(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return ErrClosed
	}
	var errs []error
	for i, node := range n.nodes {
		f := &n.faults[i]
		clear(f.dropFrom)
		clear(f.dropTo)
		f.loss = 0
		errs = append(errs, n.applyRules(ctx, node))
		if f.down {
			errs = append(errs, run(ctx, node, nil, "ip", "-n", n.NS(node), "link", "set", "eth0", "up"))
			f.down = false
		}
		if f.rate != 0 {
			errs = append(errs,
				run(ctx, node, nil, "ip", "netns", "exec", n.NS(node), "tc", "qdisc", "del", "dev", "eth0", "root"),
				run(ctx, node, nil, "ip", "netns", "exec", n.bridgeNS(), "tc", "qdisc", "del", "dev", bridgePort(i), "root"))
			f.rate = 0
		}
	}
	return errors.Join(errs...)
}
