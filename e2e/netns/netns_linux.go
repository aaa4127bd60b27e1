package netns

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Net is the network of one run: a namespace per node, joined by a bridge,
// and the faults in force. Its methods may be called from several
// goroutines; the faults are applied one at a time.
type Net struct {
	tag    string
	nodes  []string
	index  map[string]int
	addrs  []netip.Addr
	prefix netip.Prefix

	mu     sync.Mutex
	faults []nodeFaults // by node index
	closed bool
}

// nodeFaults are the faults in force at one node.
type nodeFaults struct {
	// dropFrom is the nodes whose packets the node drops.
	dropFrom map[string]bool
	loss     int    // percent of packets dropped each way
	down     bool   // link set down
	rate     uint64 // bits per second, 0 for none
}

// New makes the network of a run named name (a label, kept in nothing but
// errors) with one namespace per node, in DefaultSubnet. See Config.New.
func New(ctx context.Context, name string, nodes []string) (*Net, error) {
	return Config{Name: name, Nodes: nodes}.New(ctx)
}

// New makes the network that c describes: it checks the tools, sweeps the
// leftovers of dead runs with c's prefix, makes the bridge's namespace,
// then each node's namespace with its veth, address and loopback up. On an
// error it removes what it made.
func (c Config) New(ctx context.Context) (*Net, error) {
	c.setDefaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := CheckTools(); err != nil {
		return nil, err
	}
	if err := Sweep(ctx, c.Prefix); err != nil {
		return nil, err
	}
	n := &Net{
		tag:    fmt.Sprintf("%s%d-%04x", c.Prefix, os.Getpid(), rand.Uint32N(1<<16)),
		nodes:  append([]string(nil), c.Nodes...),
		index:  make(map[string]int, len(c.Nodes)),
		prefix: c.Subnet,
		faults: make([]nodeFaults, len(c.Nodes)),
	}
	a := c.Subnet.Masked().Addr()
	for i, node := range c.Nodes {
		a = a.Next()
		n.index[node] = i
		n.addrs = append(n.addrs, a)
		n.faults[i].dropFrom = map[string]bool{}
	}
	if err := n.build(ctx); err != nil {
		return nil, errors.Join(fmt.Errorf("netns: %s: %w", c.Name, err), n.Close())
	}
	return n, nil
}

// build makes the namespaces, the bridge and the veths.
func (n *Net) build(ctx context.Context) error {
	br := n.bridgeNS()
	steps := [][]string{
		{"ip", "netns", "add", br},
		{"ip", "-n", br, "link", "add", "br0", "type", "bridge", "stp_state", "0"},
		{"ip", "-n", br, "link", "set", "br0", "up"},
	}
	for i, node := range n.nodes {
		ns, veth := n.NS(node), bridgePort(i)
		steps = append(steps,
			[]string{"ip", "netns", "add", ns},
			[]string{"ip", "-n", br, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"ip", "-n", br, "link", "set", veth, "master", "br0", "up"},
			[]string{"ip", "-n", ns, "addr", "add", netip.PrefixFrom(n.addrs[i], n.prefix.Bits()).String(), "dev", "eth0"},
			[]string{"ip", "-n", ns, "link", "set", "eth0", "up"},
			[]string{"ip", "-n", ns, "link", "set", "lo", "up"},
		)
	}
	for _, argv := range steps {
		if err := run(ctx, "", nil, argv...); err != nil {
			return err
		}
	}
	return nil
}

// bridgePort is the name of node i's veth end on the bridge.
func bridgePort(i int) string { return "v" + strconv.Itoa(i) }

// Tag is the run's tag: every namespace of the run is named after it.
func (n *Net) Tag() string { return n.tag }

// Nodes returns the nodes, in the order given to New.
func (n *Net) Nodes() []string { return append([]string(nil), n.nodes...) }

// NS returns the name of node's namespace (as `ip netns` knows it), or ""
// for a node that is not in the network.
func (n *Net) NS(node string) string {
	if _, ok := n.index[node]; !ok {
		return ""
	}
	return n.tag + "-" + node
}

// bridgeNS is the name of the bridge's namespace: "_br" cannot be a node's
// name, which Validate keeps to lower-case letters, digits and '-'.
func (n *Net) bridgeNS() string { return n.tag + "_br" }

// Addr returns node's address, or the zero Addr for a node that is not in
// the network.
func (n *Net) Addr(node string) netip.Addr {
	i, ok := n.index[node]
	if !ok {
		return netip.Addr{}
	}
	return n.addrs[i]
}

// Command returns the command that runs name with args inside node's
// namespace, through `ip netns exec`, not yet started (set its Env, its
// output, then Start or Run it). For a node that is not in the network the
// command fails when it runs.
func (n *Net) Command(node, name string, args ...string) *exec.Cmd {
	ns := n.NS(node)
	if ns == "" {
		ns = n.tag + "-unknown-node-" + node
	}
	return exec.Command("ip", append([]string{"netns", "exec", ns, name}, args...)...)
}

// Exec runs argv inside node's namespace and returns its standard output;
// an error names the node and the command and holds its standard error.
func (n *Net) Exec(ctx context.Context, node string, argv ...string) ([]byte, error) {
	if err := n.known(node); err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		return nil, fmt.Errorf("netns: node %s: Exec without a command", node)
	}
	var out bytes.Buffer
	if err := run(ctx, node, &out, append([]string{"ip", "netns", "exec", n.NS(node)}, argv...)...); err != nil {
		return out.Bytes(), err
	}
	return out.Bytes(), nil
}

// Close kills whatever still runs in the run's namespaces, then deletes
// them, and with them every veth, the bridge and the nftables tables. It
// may be called more than once.
func (n *Net) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return nil
	}
	n.closed = true
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	names := []string{n.bridgeNS()}
	for _, node := range n.nodes {
		names = append(names, n.NS(node))
	}
	var errs []error
	for _, ns := range names {
		errs = append(errs, deleteNS(ctx, ns))
	}
	return errors.Join(errs...)
}

// deleteNS kills the processes in namespace ns and deletes it; a namespace
// that is not there is no error.
func deleteNS(ctx context.Context, ns string) error {
	if _, err := os.Stat("/run/netns/" + ns); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	var out bytes.Buffer
	if err := run(ctx, "", &out, "ip", "netns", "pids", ns); err == nil {
		for _, f := range strings.Fields(out.String()) {
			if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL) // gone already is fine
			}
		}
	}
	err := run(ctx, "", nil, "ip", "netns", "delete", ns)
	if _, serr := os.Stat("/run/netns/" + ns); err != nil && errors.Is(serr, os.ErrNotExist) {
		return nil // a Sweep of another run's got there first
	}
	return err
}

// leftover matches a namespace name of a run: the prefix is taken off
// before, and what is left starts with the run's pid.
var leftover = regexp.MustCompile(`^([0-9]+)-[0-9a-f]{4}[-_]`)

// Sweep deletes the namespaces whose names start with prefix (DefaultPrefix
// if empty) and whose run is dead: the pid in the name is no live process.
// A crashed run's namespaces, and so its veths, bridge and tables, go with
// them; a live run's are left alone.
func Sweep(ctx context.Context, prefix string) error {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	entries, err := os.ReadDir("/run/netns")
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("netns: sweep: %w", err)
	}
	var errs []error
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		m := leftover.FindStringSubmatch(rest)
		if !ok || m == nil {
			continue
		}
		pid, err := strconv.Atoi(m[1])
		if err != nil || alive(pid) {
			continue
		}
		errs = append(errs, deleteNS(ctx, e.Name()))
	}
	return errors.Join(errs...)
}

// alive says whether a process pid exists.
func alive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// run runs argv (its first element a tool looked up on PATH), with its
// standard output to out if not nil; an error names the node (if any) and
// the command and holds the command's standard error.
func run(ctx context.Context, node string, out *bytes.Buffer, argv ...string) error {
	return runIn(ctx, node, "", out, argv...)
}

// runIn is run with stdin as the command's standard input.
func runIn(ctx context.Context, node, stdin string, out *bytes.Buffer, argv ...string) error {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if out != nil { // a nil *bytes.Buffer is no nil io.Writer
		cmd.Stdout = out
	}
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		who := "netns"
		if node != "" {
			who = "netns: node " + node
		}
		return fmt.Errorf("%s: %s: %w: %s", who, strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// CheckTools returns ErrMissingTool, saying what to install, if ip, tc or
// nft is not on PATH.
func CheckTools() error {
	var missing []string
	for _, tool := range []string{"ip", "tc", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s (apt-get install iproute2 nftables)", ErrMissingTool, strings.Join(missing, ", "))
	}
	return nil
}
