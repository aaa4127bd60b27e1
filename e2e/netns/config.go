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

// Config describes a network; Config.New makes it.
type Config struct {
	// Name is the run's label, in errors only.
	Name string
	// Nodes are the nodes' names: lower-case letters, digits and '-', at
	// most 32 characters, distinct; at least one. Node i gets the i+1th
	// address of Subnet.
	Nodes []string
	// Subnet is the nodes' IPv4 subnet; DefaultSubnet if not valid. It
	// must hold an address for every node, its network and broadcast
	// addresses left out.
	Subnet netip.Prefix
	// Prefix starts the names of the run's namespaces; DefaultPrefix if
	// empty. Sweep takes the same prefix.
	Prefix string
}

func (c *Config) setDefaults() {
	if !c.Subnet.IsValid() {
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
	if !c.Subnet.Addr().Is4() || c.Subnet.Bits() > 30 {
		errs = append(errs, fmt.Errorf("netns: subnet %s: want IPv4, /30 or wider", c.Subnet))
	} else if room := 1<<(32-c.Subnet.Bits()) - 2; len(c.Nodes) > room {
		errs = append(errs, fmt.Errorf("netns: subnet %s holds %d nodes, not %d", c.Subnet, room, len(c.Nodes)))
	}
	return errors.Join(errs...)
}
