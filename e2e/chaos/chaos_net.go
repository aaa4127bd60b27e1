package chaos

import (
	"slices"
	"time"
)

// The network faults (--netns; issue 35). Each holds for a while, then
// heals; the round's check runs once every fault is healed.
const (
	// FaultPartition cuts one fleet node (an agent, its owner and its
	// sandboxes) off from everything else, both ways (nftables drops, or
	// its link set down), for partitionHold: past the members' lease, so
	// that checkpoints commit without the node and carry its rollouts,
	// and the node comes back to a later epoch than it left.
	FaultPartition = "partition"
	// FaultOneWay drops the packets of one direction only between one
	// fleet node and everything else, for faultHold: the node hears
	// nothing, or nobody hears it.
	FaultOneWay = "partition-oneway"
	// FaultSplit splits the NATS cluster into a minority (one node) and a
	// majority, for faultHold; the clients connected to the minority keep
	// their connections.
	FaultSplit = "split"
	// FaultSlow adds latency and jitter to every client connection to the
	// NATS cluster (the proxies), and bounds one fleet node's bandwidth,
	// for faultHold.
	FaultSlow = "slow"
	// FaultLossy drops a share of one node's packets (a NATS node's or a
	// fleet node's), at random, for faultHold.
	FaultLossy = "lossy"
)

// netFaults are the network faults, the kinds --netns adds.
var netFaults = []string{FaultPartition, FaultOneWay, FaultSplit, FaultSlow, FaultLossy}

// How long the network faults hold.
const (
	// partitionHold is past the members' heartbeat lease (30 s).
	partitionHold = 40 * time.Second
	faultHold     = 15 * time.Second
)

// isNetFault reports whether kind is a network fault.
func isNetFault(kind string) bool { return slices.Contains(netFaults, kind) }

// registerWait is how long a process of the fleet started again may take
// to register: with --netns, past a partition's hold, since a node cut
// off registers once it heals (a fleet killed while a node is cut off).
func (w *chaosWorld) registerWait() time.Duration {
	if w.net == nil {
		return 0
	}
	return partitionHold + 30*time.Second
}
