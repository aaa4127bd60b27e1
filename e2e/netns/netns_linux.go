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

	host     string     // the host's name, "" for none
	hostAddr netip.Addr // the host's address on the subnet
	hostLink string     // its end of the host link, in the host's namespace

	mu     sync.Mutex
	faults []nodeFaults // by node index
	closed bool
}

// nodeFaults are the faults in force at one node.
type nodeFaults struct {
	// dropFrom is the nodes whose packets the node drops.
	dropFrom map[string]bool
	// dropTo is the nodes the node drops its packets to: only ever the
	// host, whose namespace gets no rules.
	dropTo map[string]bool
	loss   int    // percent of packets dropped each way
	down   bool   // link set down
	rate   uint64 // bits per second, 0 for none
}

// New makes the network of a run named name (a label, kept in nothing but
// errors) with one namespace per node, in DefaultSubnet. See Config.New.
func New(ctx context.Context, name string, nodes []string) (*Net, error) {
	return Config{Name: name, Nodes: nodes}.New(ctx)
}

// New makes the network that c describes: it checks the tools, sweeps the
// leftovers of dead runs with c's prefix, makes the bridge's namespace and
// the host link if any, then each node's namespace with its veth, address
// and loopback up. With a host it holds a lock on the host's namespace
// from choosing the subnet to the host link's address, so that parallel
// runs have different subnets. On an error it removes what it made.
func (c Config) New(ctx context.Context) (n *Net, err error) {
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
	unlock := func() {}
	if c.Host != "" {
		if unlock, err = lockHosts(ctx); err != nil {
			return nil, err
		}
		defer func() { unlock() }()
		if c.Subnet, err = chooseSubnet(ctx, c); err != nil {
			return nil, fmt.Errorf("netns: %s: %w", c.Name, err)
		}
	}
	r := freeTag(c.Prefix)
	n = &Net{
		tag:    fmt.Sprintf("%s%d-%04x", c.Prefix, os.Getpid(), r),
		nodes:  append([]string(nil), c.Nodes...),
		index:  make(map[string]int, len(c.Nodes)),
		prefix: c.Subnet.Masked(),
		faults: make([]nodeFaults, len(c.Nodes)),
		host:   c.Host,
	}
	a := n.prefix.Addr()
	for i, node := range c.Nodes {
		a = a.Next()
		n.index[node] = i
		n.addrs = append(n.addrs, a)
		n.faults[i].dropFrom = map[string]bool{}
		n.faults[i].dropTo = map[string]bool{}
	}
	if n.host != "" {
		n.hostAddr = nthAddr(n.prefix.Addr(), 1<<(32-n.prefix.Bits())-2)
		n.hostLink = hostLinkName(os.Getpid(), r)
	}
	err = n.buildBridge(ctx)
	unlock()
	unlock = func() {}
	if err == nil {
		err = n.buildNodes(ctx)
	}
	if err != nil {
		return nil, errors.Join(fmt.Errorf("netns: %s: %w", c.Name, err), n.Close())
	}
	return n, nil
}

// buildBridge makes the bridge's namespace, the bridge and the host link.
func (n *Net) buildBridge(ctx context.Context) error {
	br := n.bridgeNS()
	steps := [][]string{
		{"ip", "netns", "add", br},
		{"ip", "-n", br, "link", "add", "br0", "type", "bridge", "stp_state", "0"},
		{"ip", "-n", br, "link", "set", "br0", "up"},
	}
	if n.host != "" {
		steps = append(steps, n.hostSteps()...)
	}
	return runAll(ctx, steps)
}

// buildNodes makes the nodes' namespaces and their veths.
func (n *Net) buildNodes(ctx context.Context) error {
	br := n.bridgeNS()
	var steps [][]string
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
	return runAll(ctx, steps)
}

// runAll runs each of steps, up to the first that fails.
func runAll(ctx context.Context, steps [][]string) error {
	for _, argv := range steps {
		if err := run(ctx, "", nil, argv...); err != nil {
			return err
		}
	}
	return nil
}

// bridgePort is the name of node i's veth end on the bridge.
func bridgePort(i int) string { return "v" + strconv.Itoa(i) }

// tags are the random parts this process has given its nets' tags: two
// nets of one process never share a tag, so that one's failed New, which
// closes what bears its tag, cannot take the other's namespaces.
var tags = struct {
	sync.Mutex
	used map[uint32]bool
}{used: map[uint32]bool{}}

// freeTag draws the random part of a new net's tag, one that no net of
// this process has had and no namespace bears.
func freeTag(prefix string) uint32 {
	tags.Lock()
	defer tags.Unlock()
	for {
		r := rand.Uint32N(1 << 16)
		if _, err := os.Stat(fmt.Sprintf("/run/netns/%s%d-%04x_br", prefix, os.Getpid(), r)); tags.used[r] || err == nil {
			continue
		}
		tags.used[r] = true
		return r
	}
}

// Tag is the run's tag: every namespace of the run is named after it.
func (n *Net) Tag() string { return n.tag }

// Nodes returns the nodes, in the order given to New; the host is not
// among them.
func (n *Net) Nodes() []string { return append([]string(nil), n.nodes...) }

// Host returns the host's name (Config.Host), "" if the network has none.
func (n *Net) Host() string { return n.host }

// HostAddr returns the host's address on the subnet, the address of the
// host link in the host's namespace, or the zero Addr if the network has
// no host.
func (n *Net) HostAddr() netip.Addr { return n.hostAddr }

// HostLink returns the name of the host link's end in the host's
// namespace, "" if the network has no host.
func (n *Net) HostLink() string { return n.hostLink }

// Subnet returns the network's subnet, chosen by New if Config.Subnet
// gave none.
func (n *Net) Subnet() netip.Prefix { return n.prefix }

// NS returns the name of node's namespace (as `ip netns` knows it), or ""
// for a node that is not in the network and for the host, whose namespace
// is the caller's.
func (n *Net) NS(node string) string {
	if _, ok := n.index[node]; !ok {
		return ""
	}
	return n.tag + "-" + node
}

// bridgeNS is the name of the bridge's namespace: "_br" cannot be a node's
// name, which Validate keeps to lower-case letters, digits and '-'.
func (n *Net) bridgeNS() string { return n.tag + "_br" }

// Addr returns node's address (the host's too), or the zero Addr for a
// node that is not in the network.
func (n *Net) Addr(node string) netip.Addr {
	if node == n.host && node != "" {
		return n.hostAddr
	}
	i, ok := n.index[node]
	if !ok {
		return netip.Addr{}
	}
	return n.addrs[i]
}

// Command returns the command that runs name with args inside node's
// namespace, through `ip netns exec`, not yet started (set its Env, its
// output, then Start or Run it); for the host, the command runs as it is,
// in the caller's namespace. `ip netns exec` also gives the program a
// mount namespace of its own, with the /sys of node's network namespace:
// a program that must share the caller's mounts uses Enter instead. For a
// node that is not in the network the command fails when it runs.
func (n *Net) Command(node, name string, args ...string) *exec.Cmd {
	if node == n.host && node != "" {
		return exec.Command(name, args...)
	}
	return exec.Command("ip", append([]string{"netns", "exec", n.nsOrMissing(node), name}, args...)...)
}

// Enter returns the start of an argv that runs the rest inside node's
// network namespace and nothing else: `nsenter --net=/run/netns/NS --`
// (util-linux). Unlike Command's `ip netns exec`, the program keeps the
// caller's mount namespace, so its mounts are the host's and it sees
// them: what an owner that mounts its sandboxes' overlays needs. It
// keeps the caller's /sys too, which shows the host's interfaces, not
// node's. For the host it is empty; for a node that is not in the network
// the argv fails when it runs.
func (n *Net) Enter(node string) []string {
	if node == n.host && node != "" {
		return nil
	}
	return []string{"nsenter", "--net=/run/netns/" + n.nsOrMissing(node), "--"}
}

// nsOrMissing is node's namespace, or for a node not in the network a
// name that no namespace has.
func (n *Net) nsOrMissing(node string) string {
	if ns := n.NS(node); ns != "" {
		return ns
	}
	return n.tag + "-unknown-node-" + node
}

// Exec runs argv inside node's namespace (the caller's for the host), as
// Command does, and returns its standard output;
// an error names the node and the command and holds its standard error.
func (n *Net) Exec(ctx context.Context, node string, argv ...string) ([]byte, error) {
	if err := n.known(node); err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		return nil, fmt.Errorf("netns: node %s: Exec without a command", node)
	}
	if node != n.host {
		argv = append([]string{"ip", "netns", "exec", n.NS(node)}, argv...)
	}
	var out bytes.Buffer
	if err := run(ctx, node, &out, argv...); err != nil {
		return out.Bytes(), err
	}
	return out.Bytes(), nil
}

// Close kills whatever still runs in the run's namespaces, then deletes
// them, and with them every veth, the bridge and the nftables tables. It
// deletes the host link first: the kernel tears a deleted namespace down
// in the background, so its veths would otherwise outlive Close for a
// moment. It may be called more than once.
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
	if n.hostLink != "" {
		errs = append(errs, deleteHostLink(ctx, n.hostLink))
	}
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
var leftover = regexp.MustCompile(`^([0-9]+)-([0-9a-f]{4})[-_]`)

// Sweep deletes the namespaces whose names start with prefix (DefaultPrefix
// if empty) and whose run is dead: the pid in the name is no live process.
// A crashed run's namespaces, and so its veths, bridge and tables, go with
// them, and its host link, named after its pid and random part, before
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
		r, _ := strconv.ParseUint(m[2], 16, 16)
		errs = append(errs, deleteHostLink(ctx, hostLinkName(pid, uint32(r))), deleteNS(ctx, e.Name()))
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

// CheckTools returns ErrMissingTool, saying what to install, if ip, tc,
// nft or nsenter is not on PATH.
func CheckTools() error {
	var missing []string
	for _, tool := range []string{"ip", "tc", "nft", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: %s (apt-get install iproute2 nftables util-linux)", ErrMissingTool, strings.Join(missing, ", "))
	}
	return nil
}
