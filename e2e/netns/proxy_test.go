package netns

import (
	"bufio"
	"net"
	"slices"
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
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("the proxy listens after Close")
	}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}
