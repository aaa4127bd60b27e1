package netns

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"time"
)

// lockPath is the file whose flock New holds while it chooses the subnet
// of a network with a host link and makes that link: the link's address
// gives the host's namespace a route for the subnet, which the next run
// then sees as used, so parallel runs never choose the same subnet.
const lockPath = "/run/stillpoint-netns.lock"

// hostPort is the name of the host link's end on the bridge; a node's
// port is "v" and a number.
const hostPort = "vh"

// hostLinkName is the name, in the host's namespace, of the host link of
// the run that process pid made with random part r. It is unique while the
// run lives and at most 15 characters (a Linux interface name's limit), as
// a pid has at most 7 digits.
func hostLinkName(pid int, r uint32) string { return fmt.Sprintf("sph%d-%04x", pid, r) }

// lockHosts takes the flock of lockPath, waiting for it until ctx ends;
// the func it returns lets it go.
func lockHosts(ctx context.Context) (func(), error) {
	f, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("netns: host link lock: %w", err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil // closing the file lets the lock go
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("netns: host link lock %s: %w", lockPath, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("netns: host link lock %s: %w", lockPath, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// hostUsed returns the IPv4 prefixes that the host's namespace uses: the
// destinations of its routes in every table (a single address as a /32),
// its default routes left out, and the subnets of its addresses.
func hostUsed(ctx context.Context) ([]netip.Prefix, error) {
	var routes, links bytes.Buffer
	if err := run(ctx, "", &routes, "ip", "-j", "-4", "route", "show", "table", "all"); err != nil {
		return nil, err
	}
	if err := run(ctx, "", &links, "ip", "-j", "-4", "addr", "show"); err != nil {
		return nil, err
	}
	var rs []struct {
		Dst string `json:"dst"`
	}
	var ls []struct {
		AddrInfo []struct {
			Local     string `json:"local"`
			Prefixlen int    `json:"prefixlen"`
		} `json:"addr_info"`
	}
	if err := json.Unmarshal(routes.Bytes(), &rs); err != nil {
		return nil, fmt.Errorf("netns: ip -j route: %w", err)
	}
	if err := json.Unmarshal(links.Bytes(), &ls); err != nil {
		return nil, fmt.Errorf("netns: ip -j addr: %w", err)
	}
	var used []netip.Prefix
	for _, r := range rs {
		if r.Dst == "default" || r.Dst == "" {
			continue
		}
		p, err := netip.ParsePrefix(r.Dst)
		if err != nil {
			a, aerr := netip.ParseAddr(r.Dst)
			if aerr != nil {
				return nil, fmt.Errorf("netns: route to %q: %w", r.Dst, err)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if p.Bits() > 0 {
			used = append(used, p)
		}
	}
	for _, l := range ls {
		for _, ai := range l.AddrInfo {
			a, err := netip.ParseAddr(ai.Local)
			if err != nil {
				return nil, fmt.Errorf("netns: address %q: %w", ai.Local, err)
			}
			used = append(used, netip.PrefixFrom(a, ai.Prefixlen).Masked())
		}
	}
	return used, nil
}

// clash returns a prefix of used that overlaps p, if any.
func clash(p netip.Prefix, used []netip.Prefix) (netip.Prefix, bool) {
	for _, u := range used {
		if u.Overlaps(p) {
			return u, true
		}
	}
	return netip.Prefix{}, false
}

// freeSubnet returns the first /24 of HostBlock, DefaultSubnet tried
// first, that overlaps nothing of used.
func freeSubnet(used []netip.Prefix) (netip.Prefix, error) {
	if _, ok := clash(DefaultSubnet, used); !ok {
		return DefaultSubnet, nil
	}
	for a := HostBlock.Masked().Addr(); HostBlock.Contains(a); a = nthAddr(a, 256) {
		p := netip.PrefixFrom(a, 24)
		if _, ok := clash(p, used); !ok {
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("%w: no /24 of %s is free", ErrSubnetInUse, HostBlock)
}

// chooseSubnet returns c's subnet for a network with a host link: a free
// one if c gives none, c's if it is free, else ErrSubnetInUse.
func chooseSubnet(ctx context.Context, c Config) (netip.Prefix, error) {
	used, err := hostUsed(ctx)
	if err != nil {
		return netip.Prefix{}, err
	}
	if !c.Subnet.IsValid() {
		return freeSubnet(used)
	}
	if u, ok := clash(c.Subnet, used); ok {
		return netip.Prefix{}, fmt.Errorf("%w: %s overlaps %s", ErrSubnetInUse, c.Subnet, u)
	}
	return c.Subnet, nil
}

// nthAddr returns the IPv4 address k after a.
func nthAddr(a netip.Addr, k uint32) netip.Addr {
	b := a.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += k
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// hostSteps are the commands that make the host link: a veth made in the
// bridge's namespace with its peer in this process's (the host's), so
// that no moment has both ends in the host's namespace and deleting the
// bridge's namespace deletes the pair; then its address, which gives the
// host its route to the subnet.
func (n *Net) hostSteps() [][]string {
	br := n.bridgeNS()
	return [][]string{
		{"ip", "-n", br, "link", "add", hostPort, "type", "veth", "peer", "name", n.hostLink, "netns", fmt.Sprint(os.Getpid())},
		{"ip", "-n", br, "link", "set", hostPort, "master", "br0", "up"},
		{"ip", "link", "set", n.hostLink, "up"},
		{"ip", "addr", "add", netip.PrefixFrom(n.hostAddr, n.prefix.Bits()).String(), "dev", n.hostLink},
	}
}

// deleteHostLink deletes the host link name from the host's namespace
// (and with it its peer on the bridge); a link that is not there is no
// error.
func deleteHostLink(ctx context.Context, name string) error {
	if _, err := net.InterfaceByName(name); err != nil {
		return nil
	}
	err := run(ctx, "", nil, "ip", "link", "delete", "dev", name)
	if _, ierr := net.InterfaceByName(name); err != nil && ierr != nil {
		return nil // its namespace's teardown got there first
	}
	return err
}
