package freeport

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
)

// lowest is the lowest port Reserve hands out: above the well-known and
// the usual fixed ports of local services.
const lowest = 10000

// Ports is a set of reserved ports; Release gives them back.
type Ports struct {
	// List is the ports, in the order asked.
	List  []int
	mu    sync.Mutex
	locks []*os.File
}

// Release gives the ports back (the process's exit does as well). It may
// be called more than once.
func (p *Ports) Release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, f := range p.locks {
		_ = f.Close() // closing the file drops its lock
	}
	p.locks = nil
}

// Reserve returns n distinct ports on host, free now, below the kernel's
// ephemeral range and locked for this process until Release. Where the
// range leaves no room below it, it falls back to ports the kernel gives
// for port 0 (the race above is then possible again).
func Reserve(host string, n int) (*Ports, error) {
	lo, err := ephemeralLow()
	if err != nil || lo-lowest < 64*n {
		return kernelPorts(host, n)
	}
	dir := filepath.Join(os.TempDir(), "stillpoint-ports")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("freeport: %w", err)
	}
	p := &Ports{}
	taken := map[int]bool{}
	for tries := 0; len(p.List) < n; tries++ {
		if tries > 1000 {
			p.Release()
			return nil, fmt.Errorf("freeport: no %d free ports between %d and %d on %s after %d tries", n, lowest, lo, host, tries)
		}
		port := lowest + rand.IntN(lo-lowest)
		if taken[port] {
			continue
		}
		f, ok := lock(filepath.Join(dir, strconv.Itoa(port)))
		if !ok {
			continue // another process holds it
		}
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			_ = f.Close() // bound by something else now
			continue
		}
		_ = l.Close()
		taken[port] = true
		p.List, p.locks = append(p.List, port), append(p.locks, f)
	}
	return p, nil
}

// lock opens and locks (exclusive, not waiting) the file at path.
func lock(path string) (*os.File, bool) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, false
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		return nil, false
	}
	return f, true
}

// ephemeralLow returns the low end of the kernel's ephemeral port range.
func ephemeralLow() (int, error) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, errors.New("freeport: ip_local_port_range: " + string(b))
	}
	return strconv.Atoi(f[0])
}

// kernelPorts is Reserve's fallback: n ports the kernel gives for port 0,
// found by listening and closing.
func kernelPorts(host string, n int) (*Ports, error) {
	p := &Ports{}
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
		if err != nil {
			return nil, fmt.Errorf("freeport: %w", err)
		}
		ls = append(ls, l)
		p.List = append(p.List, l.Addr().(*net.TCPAddr).Port)
	}
	return p, nil
}

// Addr returns host:port of port i.
func (p *Ports) Addr(host string, i int) string {
	return net.JoinHostPort(host, strconv.Itoa(p.List[i]))
}
