package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/internal/poll"
)

// hostPoll is how often a Port looks whether the host has connected again:
// a virtio port with no host reads as end of file and polls as hung up
// until the host connects, so there is nothing to wait on but the state.
const hostPoll = 10 * time.Millisecond

// Port is the guest's end of the control channel: a virtio-serial port.
// The guest keeps it open for its whole life (across snapshots and
// restores); Read waits through the times the host is not connected.
type Port struct {
	f   *os.File
	ctx context.Context
}

// FindPort returns the device of the virtio-serial port named name, found
// in /sys/class/virtio-ports (no udev makes /dev/virtio-ports links).
func FindPort(name string) (string, error) {
	if _, err := os.Stat("/dev/virtio-ports/" + name); err == nil {
		return "/dev/virtio-ports/" + name, nil
	}
	dirs, _ := filepath.Glob("/sys/class/virtio-ports/*")
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, "name"))
		if err == nil && strings.TrimSpace(string(b)) == name {
			return "/dev/" + filepath.Base(d), nil
		}
	}
	return "", fmt.Errorf("guest: no virtio-serial port named %s (looked in /sys/class/virtio-ports)", name)
}

// OpenPort opens the port at path; ctx bounds the waits of its Reads.
func OpenPort(ctx context.Context, path string) (*Port, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return nil, fmt.Errorf("guest: control port: %w", err)
	}
	return &Port{f: f, ctx: ctx}, nil
}

// Read reads what the host sent. When the host is not connected it waits
// until it is and returns ErrHostReconnected, so that a partial line is
// dropped.
func (p *Port) Read(b []byte) (int, error) {
	n, err := p.f.Read(b)
	if n > 0 || !errors.Is(err, io.EOF) {
		return n, err
	}
	if err := poll.Until(p.ctx, poll.Every(hostPoll), p.hostConnected); err != nil {
		return 0, err
	}
	if p.ctx.Err() != nil {
		return 0, p.ctx.Err()
	}
	return 0, ErrHostReconnected
}

// hostConnected reports whether the host side of the port is open.
func (p *Port) hostConnected() (bool, error) {
	rc, err := p.f.SyscallConn()
	if err != nil {
		return false, err
	}
	var revents int16
	var perr error
	if err := rc.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLOUT}}
		_, perr = unix.Poll(fds, 0)
		revents = fds[0].Revents
	}); err != nil {
		return false, err
	}
	if perr != nil && !errors.Is(perr, unix.EINTR) {
		return false, perr
	}
	return revents&unix.POLLHUP == 0 && revents != 0, nil
}

// Write writes to the host; it waits while the host is not connected.
func (p *Port) Write(b []byte) (int, error) { return p.f.Write(b) }

// Close closes the port.
func (p *Port) Close() error { return p.f.Close() }
