package qemu

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/sandboxd/vmctl"
)

// ErrGuest is returned (wrapped, with the guest's message) for a request
// the guest answered with ok false.
var ErrGuest = errors.New("microvm: guest refused")

// ErrOutputTruncated is returned (with the result, its output cut at
// vmctl.MaxOutput bytes a stream) for an exec whose output was longer.
var ErrOutputTruncated = errors.New("microvm: exec output truncated")

// ErrClosed is returned by Call once the control channel closed (the
// guest powered off, QEMU exited, or Close was called).
var ErrClosed = errors.New("microvm: control channel closed")

// Control is the host's end of a guest's control channel (sandboxd/vmctl):
// requests with fresh ids, answered in any order, and the guest's notices
// handed to a callback. Call is safe for concurrent use.
type Control struct {
	conn     net.Conn
	onNotice func(vmctl.Notice)

	mu      sync.Mutex
	next    uint64
	waiting map[uint64]chan *vmctl.Response
	err     error // set once the reader stopped

	done chan struct{}
}

// DialControl connects to the control socket at path (waiting for QEMU to
// create it, until ctx ends) and starts reading. onNotice (may be nil) is
// called from the reading goroutine for every notice. Close stops it.
func DialControl(ctx context.Context, path string, onNotice func(vmctl.Notice)) (*Control, error) {
	var conn net.Conn
	err := poll.Until(ctx, poll.Backoff(2*time.Millisecond, 50*time.Millisecond), func() (bool, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, "unix", path)
		if err != nil {
			return false, nil
		}
		conn = c
		return true, nil
	})
	if err != nil {
		return nil, fmt.Errorf("control %s: %w", path, err)
	}
	c := &Control{conn: conn, onNotice: onNotice, waiting: map[uint64]chan *vmctl.Response{}, done: make(chan struct{}), next: firstID()}
	go c.read() // stopped by Close, which closes conn and waits for done
	return c, nil
}

func (c *Control) read() {
	defer close(c.done)
	sc := bufio.NewScanner(c.conn)
	sc.Buffer(make([]byte, 64<<10), vmctl.MaxLine)
	for sc.Scan() {
		resp, notice, err := vmctl.DecodeGuestLine(sc.Bytes())
		switch {
		case err != nil:
			continue // a line the guest's console noise or a partial write left
		case notice != nil:
			if c.onNotice != nil {
				c.onNotice(*notice)
			}
		default:
			c.mu.Lock()
			ch := c.waiting[resp.ID]
			delete(c.waiting, resp.ID)
			c.mu.Unlock()
			if ch != nil {
				ch <- resp
			}
		}
	}
	err := sc.Err()
	if err == nil {
		err = ErrClosed
	} else {
		err = fmt.Errorf("%w: %w", ErrClosed, err)
	}
	c.mu.Lock()
	c.err = err
	for id, ch := range c.waiting {
		close(ch)
		delete(c.waiting, id)
	}
	c.mu.Unlock()
}

// Call sends req (its ID is set here) and waits for the answer; an answer
// with ok false is an error wrapping ErrGuest.
func (c *Control) Call(ctx context.Context, req vmctl.Request) (*vmctl.Response, error) {
	ch := make(chan *vmctl.Response, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, err
	}
	c.next++
	if c.next == 0 {
		c.next++ // 0 is the id of the guest's answer to a line that did not decode
	}
	req.ID = c.next
	c.waiting[req.ID] = ch
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.waiting, req.ID)
		c.mu.Unlock()
	}
	line, err := vmctl.Encode(req)
	if err != nil {
		forget()
		return nil, err
	}
	c.mu.Lock() // one writer at a time: lines must not interleave
	if dl, ok := ctx.Deadline(); ok {
		_ = c.conn.SetWriteDeadline(dl)
	} else {
		_ = c.conn.SetWriteDeadline(time.Time{})
	}
	_, err = c.conn.Write(line)
	c.mu.Unlock()
	if err != nil {
		forget()
		return nil, fmt.Errorf("control %s: %w", req.Op, err)
	}
	select {
	case resp, ok := <-ch:
		if !ok {
			c.mu.Lock()
			err := c.err
			c.mu.Unlock()
			return nil, fmt.Errorf("control %s: %w", req.Op, err)
		}
		if !resp.OK {
			return resp, fmt.Errorf("%w: %s: %s", ErrGuest, req.Op, resp.Error)
		}
		return resp, nil
	case <-ctx.Done():
		forget()
		return nil, fmt.Errorf("control %s: %w", req.Op, ctx.Err())
	}
}

// firstID is where a connection's ids start: a random value, so that an
// answer the guest owed the host of an earlier connection (a request in
// flight at a snapshot's instant, answered in a fork) does not carry an id
// this connection also uses. The guest drops such answers too
// (guest.ErrHostReconnected); this covers a guest that was not told.
func firstID() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return binary.LittleEndian.Uint64(b[:]) >> 1 // far from wrapping
}

// Hello asks the guest's state, sending hello again every second until
// an answer comes (a guest still booting reads nothing yet).
func (c *Control) Hello(ctx context.Context) (*vmctl.Hello, error) {
	answers := make(chan *vmctl.Response, 1)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	cctx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); wg.Wait() }()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		wg.Add(1)
		go func() { // ended by cancel: Call returns when cctx ends
			defer wg.Done()
			resp, err := c.Call(cctx, vmctl.Request{Op: vmctl.OpHello})
			if err != nil {
				select {
				case errs <- err:
				default:
				}
				return
			}
			select {
			case answers <- resp:
			default:
			}
		}()
		select {
		case resp := <-answers:
			if resp.Hello == nil {
				return nil, fmt.Errorf("%w: hello: no state in the answer", ErrGuest)
			}
			return resp.Hello, nil
		case err := <-errs:
			if ctx.Err() != nil || errors.Is(err, ErrClosed) || errors.Is(err, ErrGuest) {
				return nil, err
			}
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
		}
	}
}

// Close closes the connection and waits for the reader.
func (c *Control) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}
