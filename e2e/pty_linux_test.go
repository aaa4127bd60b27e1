package e2e

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// terminal is a pseudo-terminal whose output is copied to a buffer: a
// child given tty as its stderr sees a terminal there.
type terminal struct {
	tty  *os.File
	out  *jstest.Buffer
	done chan struct{}
}

// openTerminal opens a pseudo-terminal and starts copying what is written
// to it into out.
func openTerminal(out *jstest.Buffer) (*terminal, error) {
	ptm, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	fd := int(ptm.Fd())
	if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
		ptm.Close()
		return nil, fmt.Errorf("unlock the pseudo-terminal: %w", err)
	}
	// TIOCGPTPEER opens the matching end directly, whichever devpts
	// mount the master belongs to.
	pfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TIOCGPTPEER, uintptr(unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC))
	if errno != 0 {
		ptm.Close()
		return nil, fmt.Errorf("open the pseudo-terminal's peer: %w", errno)
	}
	tty := os.NewFile(pfd, "pty")
	t := &terminal{tty: tty, out: out, done: make(chan struct{})}
	go func() {
		defer close(t.done)
		defer ptm.Close()
		// Reading ends with EIO once no process holds the terminal open.
		_, err := io.Copy(out, ptm)
		if err != nil && !errors.Is(err, syscall.EIO) {
			fmt.Fprintf(out, "\n[terminal: %v]\n", err)
		}
	}()
	return t, nil
}

// close closes the test's end of the terminal and waits until everything
// the children wrote has been copied, or a few seconds if a child still
// holds the terminal open (a test that failed before it ended).
func (t *terminal) close() {
	t.tty.Close()
	select {
	case <-t.done:
	case <-time.After(5 * time.Second):
	}
}
