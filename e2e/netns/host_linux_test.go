package netns

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
)

// serveHere is the host's server: TCP and UDP at the host's address, in
// the test process, its datagrams counted as a helper server's are.
func (c *cluster) serveHere() *server {
	addr := c.addr(c.n.Host())
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		c.t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		ln.Close()
		c.t.Fatal(err)
	}
	s := &server{}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		buf := make([]byte, 2048)
		for {
			k, _, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			s.mu.Lock()
			s.lines = append(s.lines, "udp "+string(buf[:k]))
			s.mu.Unlock()
		}
	}()
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conn.Close()
		}
	}()
	c.t.Cleanup(func() { ln.Close(); pc.Close(); wg.Wait() })
	return s
}

func newHostCluster(t *testing.T) *cluster {
	t.Helper()
	return newClusterOf(t, Config{Name: t.Name(), Nodes: []string{"n1", "n2"}, Host: "host"})
}

// oneWay checks that datagrams from from reach to, and those from to do
// not reach from, while a one-way cut from to to is in force, and lifts
// it. A datagram sent after the lift, on the same path, is the barrier.
func (c *cluster) oneWay(from, to string) {
	c.t.Helper()
	ctx := c.t.Context()
	must(c.t, c.n.CutOneWay(ctx, from, to))
	must(c.t, c.n.CutOneWay(ctx, from, to)) // idempotent
	back := c.datagrams(to, from, 3)
	poll.Wait(c.t, 20*time.Second, to+"'s datagrams at "+from, func() bool { return c.received(from, back) == 3 })
	lost := c.datagrams(from, to, 3)
	c.blocked(from, to)
	c.blocked(to, from)
	must(c.t, c.n.UncutOneWay(ctx, from, to))
	after := c.datagrams(from, to, 1)
	poll.Wait(c.t, 20*time.Second, from+"'s datagram at "+to+" after the lift", func() bool { return c.received(to, after) == 1 })
	if k := c.received(to, lost); k != 0 {
		c.t.Fatalf("%d datagrams of %s reached %s through the one-way cut", k, from, to)
	}
}

// noHostRules fails if the host's namespace has a table of this package:
// faults never touch the host's firewall.
func noHostRules(t *testing.T) {
	t.Helper()
	out, err := exec.Command("nft", "list", "tables").CombinedOutput()
	must(t, err)
	if strings.Contains(string(out), "stillpoint_netns") {
		t.Fatalf("a table of ours in the host's namespace: %s", out)
	}
}

func TestHostReachesNodesAndBack(t *testing.T) {
	c := newHostCluster(t)
	ctx := t.Context()
	n := c.n
	if last := nthAddr(n.Subnet().Addr(), 254); n.HostAddr() != last || n.Addr("host") != last {
		t.Fatalf("host's address %s (Addr %s), want %s, the last of %s", n.HostAddr(), n.Addr("host"), last, n.Subnet())
	}
	if l := n.HostLink(); l == "" || len(l) > 15 {
		t.Fatalf("host link %q: want a name of 1 to 15 characters", l)
	}
	out, err := exec.Command("ip", "-4", "-o", "addr", "show", "dev", n.HostLink()).CombinedOutput()
	must(t, err)
	if !strings.Contains(string(out), n.HostAddr().String()+"/24") {
		t.Fatalf("the host link has not the host's address %s: %s", n.HostAddr(), out)
	}
	if n.NS("host") != "" || len(n.Enter("host")) != 0 {
		t.Fatalf("the host has a namespace %q or an Enter %q: its namespace is the caller's", n.NS("host"), n.Enter("host"))
	}
	c.reaches("host", "n1") // the test process dials a node's server
	c.reaches("n1", "host") // and a node the test process's
	c.reaches("n2", "host")
	up := c.datagrams("host", "n2", 1)
	down := c.datagrams("n2", "host", 1)
	poll.Wait(t, 20*time.Second, "datagrams between the host and n2", func() bool {
		return c.received("n2", up) == 1 && c.received("host", down) == 1
	})
	// Exec on the host runs in the caller's namespace, where the host
	// link is.
	out, err = n.Exec(ctx, "host", "ip", "-o", "link", "show", "dev", n.HostLink())
	must(t, err)
	if !strings.Contains(string(out), n.HostLink()) {
		t.Fatalf("Exec on the host does not see the host link: %s", out)
	}
}

func TestHostCutAndCutOneWay(t *testing.T) {
	c := newHostCluster(t)
	ctx := t.Context()
	must(t, c.n.Cut(ctx, "n1", "host"))
	must(t, c.n.Cut(ctx, "host", "n1")) // idempotent, either order
	noHostRules(t)
	c.blocked("host", "n1")
	c.blocked("n1", "host")
	c.reaches("host", "n2")
	c.reaches("n2", "host")
	c.reaches("n1", "n2")
	must(t, c.n.Uncut(ctx, "host", "n1"))
	c.reaches("host", "n1")
	c.reaches("n1", "host")

	c.oneWay("host", "n1") // in n1's input hook
	c.oneWay("n1", "host") // in n1's output hook
	c.heal()

	for _, err := range []error{c.n.Cut(ctx, "host", "host"), c.n.CutOneWay(ctx, "host", "host")} {
		if err == nil {
			t.Fatal("the host was cut from itself")
		}
	}
}

func TestHostIsolateAndSplit(t *testing.T) {
	c := newHostCluster(t)
	ctx := t.Context()
	must(t, c.n.Isolate(ctx, "n1"))
	must(t, c.n.Isolate(ctx, "n1"))
	noHostRules(t)
	c.blocked("n1", "host")
	c.blocked("host", "n1")
	c.blocked("n2", "n1")
	c.reaches("host", "n2")
	must(t, c.n.Rejoin(ctx, "n1"))
	c.reaches("n1", "host")
	c.reaches("host", "n1")
	c.reaches("n1", "n2")

	must(t, c.n.Isolate(ctx, "host"))
	c.blocked("host", "n1")
	c.blocked("n2", "host")
	c.reaches("n1", "n2")
	must(t, c.n.Rejoin(ctx, "host"))
	c.reaches("host", "n1")
	c.reaches("n2", "host")

	must(t, c.n.Split(ctx, []string{"n1", "host"}, []string{"n2"}))
	c.reaches("n1", "host")
	c.reaches("host", "n1")
	c.blocked("host", "n2")
	c.blocked("n2", "host")
	c.blocked("n1", "n2")
	c.heal()

	for name, err := range map[string]error{
		"Loss":      c.n.Loss(ctx, "host", 10),
		"LinkDown":  c.n.LinkDown(ctx, "host"),
		"LinkUp":    c.n.LinkUp(ctx, "host"),
		"Bandwidth": c.n.Bandwidth(ctx, "host", 1<<20),
	} {
		if !errors.Is(err, ErrHostFault) {
			t.Errorf("%s on the host: %v, want ErrHostFault", name, err)
		}
	}
	c.reaches("host", "n2")
}

// TestHostSubnetsDiffer makes two networks with hosts at once: they get
// different subnets, and a third asked for the first's subnet is refused.
func TestHostSubnetsDiffer(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	ctx := t.Context()
	nets := make([]*Net, 2)
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range nets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nets[i], errs[i] = Config{Name: fmt.Sprint(t.Name(), i), Nodes: []string{"a"}, Host: "h"}.New(ctx)
		}()
	}
	wg.Wait()
	for i, n := range nets {
		if n != nil {
			t.Cleanup(func() { must(t, n.Close()) })
		}
		must(t, errs[i])
	}
	a, b := nets[0].Subnet(), nets[1].Subnet()
	if a.Overlaps(b) {
		t.Fatalf("two networks with hosts share %s and %s", a, b)
	}
	for _, p := range []netip.Prefix{a, b} {
		if !HostBlock.Contains(p.Addr()) || p.Bits() != 24 {
			t.Fatalf("subnet %s: want a /24 of %s", p, HostBlock)
		}
	}
	_, err := Config{Name: t.Name() + "-clash", Nodes: []string{"a"}, Host: "h", Subnet: a}.New(ctx)
	if !errors.Is(err, ErrSubnetInUse) {
		t.Fatalf("a network on %s, in use: %v, want ErrSubnetInUse", a, err)
	}
}

// mknet is the helper that makes a network with a host and then stands
// for a run that crashes: killed, it never closes the network. Should its
// standard input end first (the test gone), it closes it.
func mknet(prefix string) error {
	n, err := Config{Name: "mknet", Nodes: []string{"a"}, Host: "h", Prefix: prefix}.New(context.Background())
	if err != nil {
		return err
	}
	fmt.Println(n.Tag(), n.HostLink())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return n.Close()
}

// TestSweepRemovesDeadHostLink kills a process that made a network with a
// host link; Sweep removes the link with the run's namespaces.
func TestSweepRemovesDeadHostLink(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	exe, err := os.Executable()
	must(t, err)
	prefix := fmt.Sprintf("spsweep%04x-", rand.Uint32N(1<<16))
	cmd := exec.Command(exe, prefix)
	cmd.Env = append(os.Environ(), helperEnv+"=mknet")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	must(t, err)
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	t.Cleanup(func() { stdin.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("mknet said %q: %v", line, err)
	}
	var tag, link string
	if _, err := fmt.Sscan(line, &tag, &link); err != nil {
		t.Fatalf("mknet said %q: %v", line, err)
	}
	t.Cleanup(func() {
		for _, ns := range []string{tag + "_br", tag + "-a"} {
			_ = deleteNS(context.Background(), ns)
		}
	})
	must(t, cmd.Process.Signal(syscall.SIGKILL))
	_ = cmd.Wait()
	if err := exec.Command("ip", "link", "show", "dev", link).Run(); err != nil {
		t.Fatalf("the killed run's host link %s is not there before the sweep: %v", link, err)
	}
	must(t, Sweep(t.Context(), prefix))
	if out, err := exec.Command("ip", "link", "show", "dev", link).CombinedOutput(); err == nil {
		t.Fatalf("Sweep left the dead run's host link: %s", out)
	}
	for _, ns := range []string{tag + "_br", tag + "-a"} {
		if _, err := os.Stat("/run/netns/" + ns); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("Sweep left the dead run's %s: %v", ns, err)
		}
	}
}

// TestEnterKeepsMounts runs programs in a node's network namespace through
// Enter and through Command: both are in the node's network namespace;
// only Enter's shares the caller's mount namespace, so a mount it makes is
// the host's.
func TestEnterKeepsMounts(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	ctx := t.Context()
	n, err := New(ctx, t.Name(), []string{"a"})
	must(t, err)
	t.Cleanup(func() { must(t, n.Close()) })
	var st syscall.Stat_t
	must(t, syscall.Stat("/run/netns/"+n.NS("a"), &st))
	nodeNet := fmt.Sprintf("net:[%d]", st.Ino)
	ourMnt, err := os.Readlink("/proc/self/ns/mnt")
	must(t, err)
	links := func(cmd *exec.Cmd) (netLink, mntLink string) {
		t.Helper()
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s: %v: %s", cmd, err, out)
		}
		f := strings.Fields(string(out))
		if len(f) != 2 {
			t.Fatalf("%s: %q", cmd, out)
		}
		return f[0], f[1]
	}
	argv := []string{"readlink", "/proc/self/ns/net", "/proc/self/ns/mnt"}
	gotNet, gotMnt := links(entered(n, "a", argv...))
	if gotNet != nodeNet || gotMnt != ourMnt {
		t.Fatalf("through Enter: %s %s, want the node's %s and the caller's %s", gotNet, gotMnt, nodeNet, ourMnt)
	}
	gotNet, gotMnt = links(n.Command("a", argv[0], argv[1:]...))
	if gotNet != nodeNet || gotMnt == ourMnt {
		t.Fatalf("through Command: %s %s, want the node's %s and a mount namespace not the caller's %s", gotNet, gotMnt, nodeNet, ourMnt)
	}

	// A mount made through Enter is the host's; one through Command is not.
	dir := t.TempDir()
	mounted := func() bool {
		b, err := os.ReadFile("/proc/self/mountinfo")
		must(t, err)
		return strings.Contains(string(b), " "+dir+" ")
	}
	out, err := n.Command("a", "mount", "-t", "tmpfs", "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("mount through Command: %v: %s", err, out)
	}
	if mounted() {
		t.Fatal("a mount through Command is in the caller's mount namespace")
	}
	out, err = entered(n, "a", "mount", "-t", "tmpfs", "tmpfs", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("mount through Enter: %v: %s", err, out)
	}
	t.Cleanup(func() { must(t, syscall.Unmount(dir, 0)) })
	if !mounted() {
		t.Fatal("a mount through Enter is not in the caller's mount namespace")
	}
	if out, err := entered(n, "nosuch", "true").CombinedOutput(); err == nil {
		t.Fatalf("Enter into an unknown node ran: %s", out)
	}
}

// entered is the command that runs argv through n.Enter(node).
func entered(n *Net, node string, argv ...string) *exec.Cmd {
	full := append(n.Enter(node), argv...)
	return exec.Command(full[0], full[1:]...)
}
