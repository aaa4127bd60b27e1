// Package netns is the network layer of the nemesis (issue 35): it puts
// each node of a test cluster (a NATS server, or an owner with its
// sandboxes and agents) in a network namespace of its own, joins them with
// veth pairs and a bridge, and cuts, slows and drops the traffic between
// them, every fault reversible and Heal undoing them all. It needs root and
// the tools of iproute2 (ip, tc) and nftables (nft): apt-get install
// iproute2 nftables.
//
// # The network
//
// New makes, for a run, one namespace per node and one for the bridge,
// all named after a tag unique to the run (DefaultPrefix, the creating
// process's pid and a random part: "spnet-4242-9f3a-n1"), so that runs
// and parallel tests never meet:
//
//	namespace spnet-4242-9f3a_br:  br0 (bridge), v0 v1 v2 (its ports)
//	namespace spnet-4242-9f3a-n1:  eth0 198.18.35.1/24 (peer of v0), lo
//	namespace spnet-4242-9f3a-n2:  eth0 198.18.35.2/24 (peer of v1), lo
//	...
//
// The bridge has a namespace of its own rather than the root one: nothing
// of the run is in the host's namespace, so the host's firewall (a
// FORWARD policy of drop, br_netfilter) cannot get in its way, the run
// cannot disturb the host's network, and deleting the namespaces removes
// every interface with them. The subnet (Config.Subnet) is 198.18.35.0/24
// by default, from the block that RFC 2544 sets aside for network tests;
// as no address of it is in the host's namespace, it cannot clash with the
// host's networks either way.
//
// Close deletes the namespaces (and kills what still runs in them, or
// their interfaces would live on). Sweep deletes those a former run left
// behind when it crashed: the pid in a namespace's name says whether its
// run is still alive, so a Sweep never takes the network of a live run.
// New sweeps before it makes anything.
//
// Addr is a node's address; Command and Exec run a program inside a
// node's namespace with `ip netns exec`, which also gives the program a
// /sys of that namespace and the files of /etc/netns/<name>, the way the
// ip tools themselves expect a namespace to be entered.
//
// # Faults
//
// The faults act in the nodes' namespaces, each through a table of
// nftables ("inet stillpoint_netns") that this package owns, rewritten
// whole and atomically from the faults in force at each change, so that
// every fault is idempotent and its undoing is the same rewrite:
//
//   - Cut(a, b) drops the packets between a and b, both ways; CutOneWay(from,
//     to) only those from one to the other, in the receiver's input hook.
//     A TCP connection needs both ways, so a one-way cut stops TCP both
//     ways; datagrams show the direction. Uncut and UncutOneWay undo them.
//   - Isolate(node) cuts a node from every other, both ways; Split(groups...)
//     cuts every pair of nodes in different groups (a partition), leaving a
//     node named in no group joined to all.
//   - Loss(node, percent) drops each packet into or out of node with that
//     probability (nftables `numgen random mod 100 < p`); Loss(node, 0)
//     ends it.
//   - LinkDown(node) sets the node's link down, LinkUp back up.
//   - Bandwidth(node, bits) bounds the node's traffic, each way, with a
//     tbf qdisc on both ends of its veth; Bandwidth(node, 0) ends it.
//   - Heal undoes all of them.
//
// # Latency
//
// This kernel has no netem, so latency and jitter are added in user space,
// by a Proxy in front of a port: a TCP proxy from a listen address to an
// upstream whose SetLatency delays every chunk of data, each way, by a
// latency give or take a jitter. It is Toxiproxy's proxy
// (github.com/Shopify/toxiproxy/v2) used as a library: Toxiproxy is made
// for exactly this, is kept by Shopify, and its latency keeps a stream's
// order while it jitters; the modules it adds are few and small (gorilla/mux,
// rs/xid, tomb.v1), everything else it needs the project has already. A
// Proxy runs in the process that makes it, in that process's namespace.
package netns
