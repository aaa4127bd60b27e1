// Package netns is the network layer of the nemesis (issue 35): it puts
// each node of a test cluster (a NATS server, or an owner with its
// sandboxes and agents) in a network namespace of its own, joins them with
// veth pairs and a bridge, and cuts, slows and drops the traffic between
// them, every fault reversible and Heal undoing them all. It needs root and
// the tools of iproute2 (ip, tc), nftables (nft) and util-linux (nsenter):
// apt-get install iproute2 nftables util-linux.
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
// as no address of it is in the host's namespace (unless the run has a
// host link, below), it cannot clash with the host's networks either way.
//
// Close deletes the namespaces (and kills what still runs in them, or
// their interfaces would live on). Sweep deletes those a former run left
// behind when it crashed: the pid in a namespace's name says whether its
// run is still alive, so a Sweep never takes the network of a live run.
// New sweeps before it makes anything.
//
// # The host
//
// A run whose own process (a chaos injector, its model server, its
// proxies) must reach the nodes names one more node, Config.Host, whose
// end is in the host's namespace (the caller's): a veth from the bridge
// to it, named "sph", the pid and the random part of the tag, at most 15
// characters, with the last address of the subnet (HostAddr):
//
//	namespace spnet-4242-9f3a_br:  br0, v0 v1 ..., vh (peer of sph4242-9f3a)
//	host's namespace:              sph4242-9f3a 198.18.35.254/24
//
// That address gives the host a route for the subnet, so two runs with
// hosts cannot share one: with no Config.Subnet, New takes the first /24
// of 198.18.0.0/15 (HostBlock) that no route or address of the host's
// namespace overlaps, and it refuses a given subnet that one overlaps
// (ErrSubnetInUse). It holds a flock on /run/stillpoint-netns.lock from
// the choice to the link's address, so parallel runs, whose links are
// then routes the next one sees, never choose the same subnet. Close and
// Sweep delete the host link before the bridge's namespace: the kernel
// would delete the pair with that namespace, but in the background, a
// moment later. The host link is an interface of the host like any
// other: the host's own firewall applies to it, and one that drops input
// from unknown interfaces must let it in.
//
// Addr is a node's address (the host's too); Command and Exec run a
// program inside a node's namespace with `ip netns exec`, which also gives
// the program a mount namespace of its own with the /sys of that network
// namespace and the files of /etc/netns/<name>, the way the ip tools
// themselves expect a namespace to be entered. Enter is the start of an
// argv (`nsenter --net=/run/netns/<name> --`) that enters the network
// namespace only: use it for a program that mounts what the host must see,
// or must find the host's mounts, such as an owner whose sandboxes are
// overlay mounts it finds again after a restart; use Command for the rest.
// On the host, Command and Exec run a program as it is, and Enter is
// empty.
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
//     No rule ever goes in the host's namespace, so its firewall is left
//     alone: a cut involving the host is in the node's namespace only, an
//     input drop of the host's packets and an output drop of those to it.
//     A TCP connection needs both ways, so a one-way cut stops TCP both
//     ways; datagrams show the direction. Uncut and UncutOneWay undo them.
//   - Isolate(node) cuts a node from every other and the host, both ways;
//     Split(groups...) cuts every pair of nodes in different groups (a
//     partition), leaving a node named in no group joined to all. Both may
//     name the host.
//   - Loss(node, percent) drops each packet into or out of node with that
//     probability (nftables `numgen random mod 100 < p`); Loss(node, 0)
//     ends it.
//   - LinkDown(node) sets the node's link down, LinkUp back up.
//   - Bandwidth(node, bits) bounds the node's traffic, each way, with a
//     tbf qdisc on both ends of its veth; Bandwidth(node, 0) ends it.
//   - Heal undoes all of them.
//
// Loss, LinkDown and Bandwidth act on a node's own link and namespace: on
// the host they return ErrHostFault.
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
