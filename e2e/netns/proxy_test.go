package netns

import (
	"bufio"
	"errors"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// echo starts a line echo server on loopback; the test's cleanup stops it
// and waits for its goroutines.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	conns := make(chan net.Conn, 16)
	go func() {
		defer close(done)
		var open []chan struct{}
		defer func() {
			for c := range conns {
				c.Close()
			}
			for _, o := range open {
				<-o
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				close(conns)
				return
			}
			conns <- c
			o := make(chan struct{})
			open = append(open, o)
			go func() {
				defer close(o)
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadBytes('\n')
					if err != nil {
						return
					}
					if _, err := c.Write(line); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); <-done })
	return ln.Addr().String()
}

// roundTrips returns the times of k round trips of a line over one
// connection through addr.
func roundTrips(t *testing.T, addr string, k int) []time.Duration {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	var out []time.Duration
	for range k {
		start := time.Now()
		if _, err := c.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
		if _, err := r.ReadBytes('\n'); err != nil {
			t.Fatal(err)
		}
		out = append(out, time.Since(start))
	}
	return out
}

func TestProxyLatency(t *testing.T) {
	t.Parallel()
	p, err := NewProxy("127.0.0.1:0", echo(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	const latency, jitter = 100 * time.Millisecond, 30 * time.Millisecond
	free := roundTrips(t, p.Addr(), 10)
	if err := p.SetLatency(latency, jitter); err != nil {
		t.Fatal(err)
	}
	if err := p.SetLatency(latency, jitter); err != nil { // in place of the first
		t.Fatal(err)
	}
	slow := roundTrips(t, p.Addr(), 10)
	// Each way a chunk waits latency-jitter at least: a floor that holds
	// however busy the machine is.
	floor := 2 * (latency - jitter)
	t.Logf("round trips: %s median without latency, %s with (%.0fx), floor %s",
		median(free), median(slow), float64(median(slow))/float64(median(free)), floor)
	if m := slices.Min(slow); m < floor {
		t.Fatalf("a round trip took %s with a latency of %s±%s each way, less than %s", m, latency, jitter, floor)
	}
	p.Reset()
	// Without the delay a round trip on loopback takes far less than the
	// floor; one of ten below it shows that Reset acted.
	if m := slices.Min(roundTrips(t, p.Addr(), 10)); m >= floor {
		t.Fatalf("after Reset no round trip of ten took less than %s (the fastest %s)", floor, m)
	}
	if err := p.SetLatency(time.Millisecond, time.Second); err == nil {
		t.Fatal("SetLatency took a jitter above the latency")
	}
	carried, err := net.DialTimeout("tcp", p.Addr(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer carried.Close()
	if !listening(t, p.Addr()) {
		t.Fatalf("no socket of this process listens on %s before Close", p.Addr())
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	// Not a dial: on a busy machine another process may listen on the
	// freed port, or a dial to it may connect to itself.
	if listening(t, p.Addr()) {
		t.Fatal("the proxy listens after Close")
	}
	_ = carried.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := bufio.NewReader(carried).ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a connection the proxy carried is open after Close: read %v", err)
	}
}

// listening tells whether a socket of this process listens on addr's TCP
// port (/proc/net/tcp, LISTEN, matched to this process's descriptors).
func listening(t *testing.T, addr string) bool {
	t.Helper()
	_, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		t.Fatal(err)
	}
	inodes := map[string]bool{}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 || f[3] != "0A" {
			continue
		}
		_, hexPort, _ := strings.Cut(f[1], ":")
		if p, err := strconv.ParseUint(hexPort, 16, 16); err == nil && int(p) == port {
			inodes["socket:["+f[9]+"]"] = true
		}
	}
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, fd := range fds {
		if l, err := os.Readlink("/proc/self/fd/" + fd.Name()); err == nil && inodes[l] {
			return true
		}
	}
	return false
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
