package netns

import (
	"errors"
	"fmt"
	"net/netip"
	"regexp"
)

// DefaultPrefix starts the name of every namespace this package makes, if
// Config.Prefix does not say otherwise.
const DefaultPrefix = "spnet-"

// DefaultSubnet is the nodes' subnet if Config.Subnet does not say
// otherwise: in 198.18.0.0/15, which RFC 2544 sets aside for network tests.
var DefaultSubnet = netip.MustParsePrefix("198.18.35.0/24")

// ErrMissingTool is returned by New and CheckTools when ip, tc or nft is
// not installed.
var ErrMissingTool = errors.New("netns: missing tool")

// ErrUnknownNode is returned by a method given a node that is not in the
// network.
var ErrUnknownNode = errors.New("netns: unknown node")

// ErrClosed is returned by a fault asked of a Net after its Close.
var ErrClosed = errors.New("netns: network closed")

// ErrHostFault is returned by a fault that acts on a node's own link or
// namespace (Loss, LinkDown, LinkUp, Bandwidth) asked of the host: the
// host's namespace is the caller's, which this package never changes.
var ErrHostFault = errors.New("netns: fault not for the host")

// ErrSubnetInUse is returned by New when Config.Host is set and the
// subnet, given or sought, clashes with a route or an address of the
// host's namespace (another run's host link among them).
var ErrSubnetInUse = errors.New("netns: subnet in use in the host's namespace")

// HostBlock is where New looks for a free /24 for a network with a host
// link and no Config.Subnet: 198.18.0.0/15, which RFC 2544 sets aside for
// network tests.
var HostBlock = netip.MustParsePrefix("198.18.0.0/15")

// Config describes a network; Config.New makes it.
type Config struct {
	// Name is the run's label, in errors only.
	Name string
	// Nodes are the nodes' names: lower-case letters, digits and '-', at
	// most 32 characters, distinct; at least one. Node i gets the i+1th
	// address of Subnet.
	Nodes []string
	// Subnet is the nodes' IPv4 subnet. If it is not valid, it is
	// DefaultSubnet, or with Host a /24 of HostBlock that the host's
	// namespace does not use. It must hold an address for every node and
	// the host, its network and broadcast addresses left out.
	Subnet netip.Prefix
	// Host, if not empty, names one more node, whose end is in the host's
	// namespace (the caller's): a veth from the bridge to that namespace,
	// with the last address of Subnet. It is named as a node is, and not
	// as one of Nodes. Cuts may name it; faults of a node's own link may
	// not (ErrHostFault).
	Host string
	// Prefix starts the names of the run's namespaces; DefaultPrefix if
	// empty. Sweep takes the same prefix.
	Prefix string
}

func (c *Config) setDefaults() {
	if !c.Subnet.IsValid() && c.Host == "" {
		c.Subnet = DefaultSubnet
	}
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
}

// nodeName is what a node's name may be.
var nodeName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,31}$`)

// Validate says what is wrong with c, if anything, once its defaults are
// set.
func (c Config) Validate() error {
	var errs []error
	if len(c.Nodes) == 0 {
		errs = append(errs, errors.New("netns: no nodes"))
	}
	seen := map[string]bool{}
	for _, node := range c.Nodes {
		if !nodeName.MatchString(node) {
			errs = append(errs, fmt.Errorf("netns: node name %q: want lower-case letters, digits and '-', at most 32", node))
		}
		if seen[node] {
			errs = append(errs, fmt.Errorf("netns: node %q named twice", node))
		}
		seen[node] = true
	}
	want := len(c.Nodes)
	if c.Host != "" {
		want++
		if !nodeName.MatchString(c.Host) {
			errs = append(errs, fmt.Errorf("netns: host name %q: want lower-case letters, digits and '-', at most 32", c.Host))
		}
		if seen[c.Host] {
			errs = append(errs, fmt.Errorf("netns: host %q is named as a node too", c.Host))
		}
	}
	subnet := c.Subnet
	if !subnet.IsValid() && c.Host != "" {
		subnet = netip.PrefixFrom(HostBlock.Addr(), 24) // New chooses which /24
	}
	if !subnet.Addr().Is4() || subnet.Bits() > 30 {
		errs = append(errs, fmt.Errorf("netns: subnet %s: want IPv4, /30 or wider", subnet))
	} else if room := 1<<(32-subnet.Bits()) - 2; want > room {
		errs = append(errs, fmt.Errorf("netns: subnet %s holds %d nodes, not %d", subnet, room, want))
	}
	return errors.Join(errs...)
}
