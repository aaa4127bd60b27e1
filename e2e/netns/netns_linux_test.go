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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/internal/poll"
)

// helperEnv makes the test binary a helper inside a namespace (TestMain):
// its value is the mode, os.Args[1:] its arguments.
const helperEnv = "STILLPOINT_NETNS_HELPER"

// port is the port of every node's helper server.
const port = "7411"

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		os.Exit(helperMain(mode, os.Args[1:]))
	}
	leak.VerifyTestMain(m)
}

// helperMain is the helper's modes:
//
//	serve ADDR          TCP and UDP on ADDR: "ready", then "udp PAYLOAD" per
//	                    datagram, "tcp BYTES MS" per connection at its EOF
//	dial ADDR           exit 0 if a TCP connection opens within a second
//	udp ADDR TOKEN N    send N datagrams TOKEN
//	send ADDR BYTES     send BYTES bytes over TCP, wait for the close
//	mknet PREFIX        make a network with a host link, print its tag
//	                    and host link, wait to be killed (mknet)
func helperMain(mode string, args []string) int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, mode, err); return 3 }
	switch mode {
	case "serve":
		ln, err := net.Listen("tcp", args[0])
		if err != nil {
			return fail(err)
		}
		pc, err := net.ListenPacket("udp", args[0])
		if err != nil {
			return fail(err)
		}
		_ = pc.(*net.UDPConn).SetReadBuffer(1 << 20)
		var out sync.Mutex
		say := func(f string, a ...any) { out.Lock(); fmt.Printf(f+"\n", a...); out.Unlock() }
		go func() {
			buf := make([]byte, 2048)
			for {
				k, _, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				say("udp %s", buf[:k])
			}
		}()
		say("ready")
		for {
			c, err := ln.Accept()
			if err != nil {
				return fail(err)
			}
			go func() {
				defer c.Close()
				first := make([]byte, 1)
				k, _ := c.Read(first)
				start := time.Now()
				rest, _ := io.Copy(io.Discard, c)
				say("tcp %d %d", int64(k)+rest, time.Since(start).Milliseconds())
			}()
		}
	case "dial":
		c, err := net.DialTimeout("tcp", args[0], time.Second)
		if err != nil {
			return fail(err)
		}
		c.Close()
		return 0
	case "udp":
		c, err := net.Dial("udp", args[0])
		if err != nil {
			return fail(err)
		}
		k, _ := strconv.Atoi(args[2])
		for range k {
			_, _ = c.Write([]byte(args[1])) // a refused one is as lost
		}
		return 0
	case "send":
		c, err := net.DialTimeout("tcp", args[0], 5*time.Second)
		if err != nil {
			return fail(err)
		}
		size, _ := strconv.Atoi(args[1])
		if _, err := c.Write(make([]byte, size)); err != nil {
			return fail(err)
		}
		_ = c.(*net.TCPConn).CloseWrite()
		_, _ = io.Copy(io.Discard, c)
		return 0
	case "mknet":
		if err := mknet(args[0]); err != nil {
			return fail(err)
		}
		return 0
	}
	return fail(errors.New("unknown mode"))
}

// server is a node's helper server and what it has printed.
type server struct {
	mu    sync.Mutex
	lines []string
}

func (s *server) count(line string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := 0
	for _, l := range s.lines {
		if l == line {
			k++
		}
	}
	return k
}

func (s *server) prefixed(p string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, l := range s.lines {
		if strings.HasPrefix(l, p) {
			out = append(out, l)
		}
	}
	return out
}

// cluster is a test's network, each node with its helper server, and the
// host, if any, with a server in the test process.
type cluster struct {
	t       *testing.T
	n       *Net
	servers map[string]*server
}

// requireRoot fails (never skips) a test that cannot make namespaces or
// lacks a tool, saying what to do.
func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("netns tests make network namespaces: run them as root")
	}
	if err := CheckTools(); err != nil {
		t.Fatal(err)
	}
}

// newCluster makes a network of three nodes, n1 to n3, and no host.
func newCluster(t *testing.T) *cluster {
	t.Helper()
	return newClusterOf(t, Config{Name: t.Name(), Nodes: []string{"n1", "n2", "n3"}})
}

func newClusterOf(t *testing.T, cfg Config) *cluster {
	t.Helper()
	requireRoot(t)
	t.Parallel()
	n, err := cfg.New(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Error(err)
		}
	})
	c := &cluster{t: t, n: n, servers: map[string]*server{}}
	for _, node := range n.Nodes() {
		c.servers[node] = c.serve(node)
	}
	if h := n.Host(); h != "" {
		c.servers[h] = c.serveHere()
	}
	return c
}

// names returns the nodes and the host, if any.
func (c *cluster) names() []string {
	if h := c.n.Host(); h != "" {
		return append(c.n.Nodes(), h)
	}
	return c.n.Nodes()
}

// helper returns the command that runs the test binary as a helper in
// node's namespace.
func (c *cluster) helper(node, mode string, args ...string) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := c.n.Command(node, exe, args...)
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	return cmd
}

// serve starts node's helper server and waits for it to listen; the
// test's cleanup kills and reaps it.
func (c *cluster) serve(node string) *server {
	cmd := c.helper(node, "serve", c.addr(node))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		c.t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	s := &server{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			s.mu.Lock()
			s.lines = append(s.lines, sc.Text())
			s.mu.Unlock()
		}
	}()
	c.t.Cleanup(func() { _ = cmd.Process.Kill(); <-done; _ = cmd.Wait() })
	poll.Wait(c.t, 30*time.Second, node+"'s server to listen", func() bool { return s.count("ready") == 1 })
	return s
}

func (c *cluster) addr(node string) string { return net.JoinHostPort(c.n.Addr(node).String(), port) }

// dials says whether a TCP connection from from to to's server opens
// within a second: without a fault the kernel opens it in far less, busy
// or not, so a failure is the fault's doing.
func (c *cluster) dials(from, to string) bool {
	if from == c.n.Host() {
		conn, err := net.DialTimeout("tcp", c.addr(to), time.Second)
		if err == nil {
			conn.Close()
		}
		return err == nil
	}
	return c.helper(from, "dial", c.addr(to)).Run() == nil
}

// reaches waits until from dials to (a fault just ended may take a moment
// to end: a link coming up).
func (c *cluster) reaches(from, to string) {
	c.t.Helper()
	poll.Wait(c.t, 20*time.Second, from+" to reach "+to, func() bool { return c.dials(from, to) })
}

func (c *cluster) blocked(from, to string) {
	c.t.Helper()
	if c.dials(from, to) {
		c.t.Fatalf("%s reached %s through the fault", from, to)
	}
}

// datagrams sends k datagrams of a fresh token from from to to and returns
// the token; the count of them that to received is c.received(to, token).
func (c *cluster) datagrams(from, to string, k int) string {
	c.t.Helper()
	token := fmt.Sprintf("%s-%s-%08x", from, to, rand.Uint32())
	if from == c.n.Host() {
		conn, err := net.Dial("udp", c.addr(to))
		if err != nil {
			c.t.Fatal(err)
		}
		defer conn.Close()
		for range k {
			_, _ = conn.Write([]byte(token)) // a refused one is as lost
		}
		return token
	}
	if out, err := c.helper(from, "udp", c.addr(to), token, strconv.Itoa(k)).CombinedOutput(); err != nil {
		c.t.Fatalf("udp %s to %s: %v: %s", from, to, err, out)
	}
	return token
}

func (c *cluster) received(to, token string) int { return c.servers[to].count("udp " + token) }

// heal heals and checks that every node reaches every other.
func (c *cluster) heal() {
	c.t.Helper()
	if err := c.n.Heal(c.t.Context()); err != nil {
		c.t.Fatal(err)
	}
	for _, a := range c.names() {
		for _, b := range c.names() {
			if a != b {
				c.reaches(a, b)
			}
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestCutStopsBothWaysAndHealRestores(t *testing.T) {
	c := newCluster(t)
	ctx := t.Context()
	c.reaches("n1", "n2")
	c.reaches("n2", "n1")
	must(t, c.n.Cut(ctx, "n1", "n2"))
	must(t, c.n.Cut(ctx, "n1", "n2")) // idempotent
	c.blocked("n1", "n2")
	c.blocked("n2", "n1")
	c.reaches("n1", "n3")
	c.reaches("n3", "n2")
	c.heal()
	must(t, c.n.Cut(ctx, "n2", "n3"))
	c.blocked("n3", "n2")
	must(t, c.n.Uncut(ctx, "n3", "n2"))
	c.reaches("n3", "n2")
	c.reaches("n2", "n3")
}

func TestCutOneWayStopsOneDirection(t *testing.T) {
	c := newCluster(t)
	ctx := t.Context()
	must(t, c.n.CutOneWay(ctx, "n1", "n2"))
	must(t, c.n.CutOneWay(ctx, "n1", "n2"))
	// n2 to n1 still arrives; n1 to n2 does not. A datagram sent after
	// the heal, on the same path, is the barrier: the lost ones, had they
	// been delivered, would have been read before it.
	back := c.datagrams("n2", "n1", 3)
	poll.Wait(t, 20*time.Second, "n2's datagrams at n1", func() bool { return c.received("n1", back) == 3 })
	lost := c.datagrams("n1", "n2", 3)
	c.blocked("n1", "n2") // and TCP, which needs both ways, both ways
	c.blocked("n2", "n1")
	must(t, c.n.UncutOneWay(ctx, "n1", "n2"))
	after := c.datagrams("n1", "n2", 1)
	poll.Wait(t, 20*time.Second, "n1's datagram at n2 after the heal", func() bool { return c.received("n2", after) == 1 })
	if k := c.received("n2", lost); k != 0 {
		t.Fatalf("%d datagrams of n1 reached n2 through the one-way cut", k)
	}
	c.heal()
}

func TestIsolateAndSplit(t *testing.T) {
	c := newCluster(t)
	ctx := t.Context()
	must(t, c.n.Isolate(ctx, "n3"))
	must(t, c.n.Isolate(ctx, "n3"))
	c.blocked("n3", "n1")
	c.blocked("n2", "n3")
	c.reaches("n1", "n2")
	must(t, c.n.Rejoin(ctx, "n3"))
	c.reaches("n3", "n1")
	c.reaches("n2", "n3")

	must(t, c.n.Split(ctx, []string{"n1"}, []string{"n2", "n3"}))
	c.blocked("n1", "n2")
	c.blocked("n3", "n1")
	c.reaches("n2", "n3")
	c.reaches("n3", "n2")
	c.heal()
	if err := c.n.Split(ctx, []string{"n1", "n2"}, []string{"n2"}); err == nil {
		t.Fatal("Split took a node in two groups")
	}
	if err := c.n.Cut(ctx, "n1", "n9"); !errors.Is(err, ErrUnknownNode) {
		t.Fatalf("Cut to an unknown node: %v, want ErrUnknownNode", err)
	}
}

func TestLoss(t *testing.T) {
	c := newCluster(t)
	ctx := t.Context()
	must(t, c.n.Loss(ctx, "n2", 100))
	c.blocked("n1", "n2")
	c.blocked("n2", "n3")
	c.reaches("n1", "n3")

	// Half: a fair coin over 200 datagrams lands outside 20..180 with a
	// chance below 10^-29.
	must(t, c.n.Loss(ctx, "n2", 50))
	half := c.datagrams("n1", "n2", 200)
	must(t, c.n.Loss(ctx, "n2", 0))
	barrier := c.datagrams("n1", "n2", 1)
	poll.Wait(t, 20*time.Second, "the datagram after the loss", func() bool { return c.received("n2", barrier) == 1 })
	if k := c.received("n2", half); k < 20 || k > 180 {
		t.Fatalf("%d of 200 datagrams arrived with a loss of 50%%", k)
	}

	c.reaches("n1", "n2")
	all := c.datagrams("n1", "n2", 100)
	poll.Wait(t, 20*time.Second, "100 of 100 datagrams with no loss", func() bool { return c.received("n2", all) == 100 })
	if err := c.n.Loss(ctx, "n2", 101); err == nil {
		t.Fatal("Loss took 101%")
	}
	c.heal()
}

func TestLinkDownAndUp(t *testing.T) {
	c := newCluster(t)
	ctx := t.Context()
	must(t, c.n.LinkDown(ctx, "n1"))
	must(t, c.n.LinkDown(ctx, "n1"))
	c.blocked("n2", "n1")
	c.blocked("n1", "n3")
	c.reaches("n2", "n3")
	must(t, c.n.LinkUp(ctx, "n1"))
	must(t, c.n.LinkUp(ctx, "n1"))
	c.reaches("n2", "n1")
	c.reaches("n1", "n3")
	must(t, c.n.LinkDown(ctx, "n3"))
	c.heal()
}

func TestBandwidth(t *testing.T) {
	c := newCluster(t)
	ctx := t.Context()
	const size, rate = 1 << 20, 8 << 20 // 1 MiB at 8 Mibit/s: a second
	send := func() time.Duration {
		t.Helper()
		before := len(c.servers["n2"].prefixed("tcp "))
		if out, err := c.helper("n1", "send", c.addr("n2"), strconv.Itoa(size)).CombinedOutput(); err != nil {
			t.Fatalf("send: %v: %s", err, out)
		}
		var line string
		poll.Wait(t, 30*time.Second, "n2 to count the bytes", func() bool {
			l := c.servers["n2"].prefixed("tcp ")
			if len(l) > before {
				line = l[before]
			}
			return line != ""
		})
		var got, ms int
		fmt.Sscanf(line, "tcp %d %d", &got, &ms)
		if got != size {
			t.Fatalf("n2 got %d bytes of %d", got, size)
		}
		return time.Duration(ms) * time.Millisecond
	}
	free := send()
	must(t, c.n.Bandwidth(ctx, "n1", rate))
	must(t, c.n.Bandwidth(ctx, "n1", rate))
	slow := send()
	// The bound is a floor: the bytes past the first bucket cannot pass
	// faster than the rate, however busy the machine.
	floor := time.Duration((size - rate/8/50) * 8 * 9 / 10 * int64(time.Second) / rate)
	t.Logf("1 MiB: %s unbounded, %s at 8 Mibit/s (floor %s)", free, slow, floor)
	if slow < floor {
		t.Fatalf("1 MiB took %s at 8 Mibit/s, less than %s", slow, floor)
	}
	must(t, c.n.Bandwidth(ctx, "n1", 0))
	must(t, c.n.Bandwidth(ctx, "n1", 0))
	must(t, c.n.Bandwidth(ctx, "n3", rate))
	c.heal()
}

// TestCloseLeavesNothing makes a network with a host link, a fault of each
// kind and a process in a namespace, closes it, and looks for anything of
// it left, in the host's namespace too.
func TestCloseLeavesNothing(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	ctx := t.Context()
	n, err := Config{Name: t.Name(), Nodes: []string{"a", "b"}, Host: "h"}.New(ctx)
	must(t, err)
	must(t, n.Cut(ctx, "a", "b"))
	must(t, n.Cut(ctx, "a", "h"))
	must(t, n.Loss(ctx, "a", 10))
	must(t, n.Bandwidth(ctx, "b", 1<<20))
	must(t, n.LinkDown(ctx, "b"))
	out, err := n.Exec(ctx, "a", "nft", "list", "tables")
	must(t, err)
	if !strings.Contains(string(out), "stillpoint_netns") {
		t.Fatalf("no table of ours in a's namespace: %s", out)
	}
	if out, err := exec.Command("ip", "link", "show", "dev", n.HostLink()).CombinedOutput(); err != nil {
		t.Fatalf("no host link %s before Close: %v: %s", n.HostLink(), err, out)
	}
	sleeper := n.Command("a", "sleep", "600")
	must(t, sleeper.Start())
	must(t, n.Close())
	must(t, n.Close())
	if err := sleeper.Wait(); err == nil {
		t.Fatal("the process in a's namespace outlived Close")
	}
	for _, argv := range [][]string{{"ip", "netns", "list"}, {"ip", "link"}, {"nft", "list", "tables"}} {
		out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
		must(t, err)
		if strings.Contains(string(out), n.Tag()) || strings.Contains(string(out), n.HostLink()) ||
			strings.Contains(string(out), "stillpoint_netns") {
			t.Fatalf("%s after Close: %s", strings.Join(argv, " "), out)
		}
	}
	if err := n.Cut(ctx, "a", "b"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Cut after Close: %v, want ErrClosed", err)
	}
}

// TestSweepRemovesDeadRunsOnly makes namespaces named as a dead run's and
// as a live one's; Sweep takes the dead run's only.
func TestSweepRemovesDeadRunsOnly(t *testing.T) {
	requireRoot(t)
	t.Parallel()
	ctx := t.Context()
	prefix := fmt.Sprintf("spsweep%04x-", rand.Uint32N(1<<16))
	gone := exec.Command("true")
	must(t, gone.Run())
	dead := fmt.Sprintf("%s%d-abcd-n1", prefix, gone.Process.Pid)
	live := fmt.Sprintf("%s%d-abcd-n1", prefix, os.Getpid())
	for _, ns := range []string{dead, live} {
		must(t, run(ctx, "", nil, "ip", "netns", "add", ns))
	}
	t.Cleanup(func() { _ = deleteNS(context.Background(), live); _ = deleteNS(context.Background(), dead) })
	must(t, Sweep(ctx, prefix))
	if _, err := os.Stat("/run/netns/" + dead); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Sweep left the dead run's %s: %v", dead, err)
	}
	if _, err := os.Stat("/run/netns/" + live); err != nil {
		t.Fatalf("Sweep took the live run's %s: %v", live, err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{},
		{Nodes: []string{"A"}},
		{Nodes: []string{"a", "a"}},
		{Nodes: []string{"a", "b", "c"}, Subnet: netip.MustParsePrefix("198.18.35.0/30")},
		{Nodes: []string{"a", "b"}, Host: "h", Subnet: netip.MustParsePrefix("198.18.35.0/30")},
		{Nodes: []string{"a"}, Host: "a"},
		{Nodes: []string{"a"}, Host: "H"},
	} {
		c.setDefaults()
		if c.Validate() == nil {
			t.Errorf("%+v is valid", c)
		}
	}
	ok := Config{Nodes: []string{"a", "b"}, Host: "h"}
	ok.setDefaults()
	if err := ok.Validate(); err != nil || ok.Subnet.IsValid() {
		t.Errorf("%+v: %v; want valid, its subnet left for New to choose", ok, err)
	}
}
