package guest

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/sandboxd/vmctl"
)

func TestMain(m *testing.M) { leak.VerifyTestMain(m) }

// fakeGuest records what the server asked of it; its exec waits for
// release.
type fakeGuest struct {
	mu       sync.Mutex
	ids      []vmctl.Request
	clock    time.Time
	synced   int
	release  chan struct{}
	identify error
}

func (g *fakeGuest) Hello() vmctl.Hello {
	return vmctl.Hello{BootID: "b1", Identity: vmctl.Identity{PID: 1, Start: 5}}
}

func (g *fakeGuest) Identify(_ context.Context, req vmctl.Request) (vmctl.Hello, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.identify != nil {
		return vmctl.Hello{}, g.identify
	}
	g.ids = append(g.ids, req)
	return vmctl.Hello{Sandbox: req.Sandbox, Run: req.Run, Member: "sandbox." + req.Sandbox, Epoch: req.Epoch}, nil
}

func (g *fakeGuest) Exec(ctx context.Context, req vmctl.Request) (vmctl.ExecResult, error) {
	if req.Argv[0] == "big" { // an answer beyond vmctl.MaxLine
		return vmctl.ExecResult{Stdout: make([]byte, vmctl.MaxLine)}, nil
	}
	select {
	case <-g.release:
	case <-ctx.Done():
		return vmctl.ExecResult{}, ctx.Err()
	}
	return vmctl.ExecResult{Exit: 0, Stdout: []byte(req.Argv[0])}, nil
}

func (g *fakeGuest) SetClock(w time.Time) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.clock = w
	return nil
}

func (g *fakeGuest) Sync() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.synced++
	return nil
}

// host is the test's side of the pipe.
type host struct {
	t     *testing.T
	conn  net.Conn
	lines *bufio.Reader
}

func (h *host) send(line string) {
	h.t.Helper()
	_ = h.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(h.conn, line+"\n"); err != nil {
		h.t.Fatal(err)
	}
}

func (h *host) recv() (*vmctl.Response, *vmctl.Notice) {
	h.t.Helper()
	_ = h.conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := h.lines.ReadBytes('\n')
	if err != nil {
		h.t.Fatal(err)
	}
	r, n, err := vmctl.DecodeGuestLine(line)
	if err != nil {
		h.t.Fatalf("%s: %v", line, err)
	}
	return r, n
}

func (h *host) answer(id uint64) *vmctl.Response {
	h.t.Helper()
	r, n := h.recv()
	if n != nil || r.ID != id {
		h.t.Fatalf("want the answer to %d, got %+v %+v", id, r, n)
	}
	return r
}

func serve(t *testing.T, g Guest, lease *Lease) (*Server, *host, func()) {
	t.Helper()
	srv, err := NewServer(ServerConfig{Guest: g, Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	guestEnd, hostEnd := net.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, guestEnd) }()
	stop := func() {
		cancel()
		hostEnd.Close()
		guestEnd.Close()
		if err := <-done; err != nil && !errors.Is(err, io.ErrClosedPipe) {
			t.Errorf("Serve: %v", err)
		}
	}
	return srv, &host{t: t, conn: hostEnd, lines: bufio.NewReader(hostEnd)}, stop
}

const entropy = `"AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQ=="`

// TestServerProtocol runs the control protocol's ops in the order a
// provider sends them: ready, hello, identify, exec beside a lease, clock,
// sync, and the refusals of the wrong state and of bad lines.
func TestServerProtocol(t *testing.T) {
	g := &fakeGuest{release: make(chan struct{})}
	lease := NewLease(0)
	srv, h, stop := serve(t, g, lease)
	defer stop()

	if _, n := h.recv(); n == nil || n.Event != vmctl.EventReady || n.State != vmctl.StateTemplate {
		t.Fatalf("first line: want the ready notice, got %+v", n)
	}
	h.send(`{"id":1,"op":"hello"}`)
	if r := h.answer(1); !r.OK || r.Hello == nil || r.State != vmctl.StateTemplate || r.BootID != "b1" || r.Identity.PID != 1 {
		t.Fatalf("hello: %+v", r)
	}
	h.send(`{"id":2,"op":"reidentify","sandbox":"s1","run":"r1","nats_url":"nats://10.0.2.100:4222","epoch":1,"entropy":` + entropy + `}`)
	if r := h.answer(2); r.OK || r.Error == "" {
		t.Fatalf("reidentify of a template: %+v", r)
	}
	h.send(`{"id":3,"op":"identify","sandbox":"s1","run":"r1","nats_url":"nats://10.0.2.100:4222","lease_ms":60000,"entropy":` + entropy + `}`)
	if r := h.answer(3); !r.OK || r.Member != "sandbox.s1" || r.State != vmctl.StateIdentified {
		t.Fatalf("identify: %+v", r)
	}
	if left, ok := lease.Left(); !ok || left < 50*time.Second {
		t.Fatalf("identify's lease: %s %v", left, ok)
	}
	if srv.State() != vmctl.StateIdentified {
		t.Fatalf("state %s after identify", srv.State())
	}
	h.send(`{"id":4,"op":"identify","sandbox":"s1","run":"r1","nats_url":"nats://10.0.2.100:4222","entropy":` + entropy + `}`)
	if r := h.answer(4); r.OK {
		t.Fatalf("second identify: %+v", r)
	}
	// An exec in flight does not hold up a lease renewal: the answers come
	// out of order.
	h.send(`{"id":5,"op":"exec","argv":["echo"]}`)
	h.send(`{"id":6,"op":"lease","until_ms":120000}`)
	if r := h.answer(6); !r.OK {
		t.Fatalf("lease: %+v", r)
	}
	if left, _ := lease.Left(); left < 110*time.Second {
		t.Fatalf("lease not renewed: %s", left)
	}
	close(g.release)
	if r := h.answer(5); !r.OK || r.ExecResult == nil || string(r.Stdout) != "echo" {
		t.Fatalf("exec: %+v", r)
	}
	h.send(`{"id":7,"op":"clock","wall":"2026-12-01T11:00:00Z"}`)
	h.answer(7)
	h.send(`{"id":8,"op":"sync"}`)
	h.answer(8)
	g.mu.Lock()
	if !g.clock.Equal(time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC)) || g.synced != 1 {
		t.Errorf("clock %s, synced %d", g.clock, g.synced)
	}
	g.mu.Unlock()
	h.send(`{"id":9,"op":"reidentify","sandbox":"s2","run":"r1","nats_url":"nats://10.0.2.101:4222","epoch":2,"entropy":` + entropy + `}`)
	if r := h.answer(9); !r.OK || r.Member != "sandbox.s2" || r.Epoch != 2 {
		t.Fatalf("reidentify: %+v", r)
	}
	h.send(`{"id":10,"op":"fly"}`)
	if r := h.answer(10); r.OK || r.Error == "" {
		t.Fatalf("unknown op: %+v", r)
	}
	h.send(`not json`)
	if r := h.answer(0); r.OK || r.Error == "" {
		t.Fatalf("bad line: %+v", r)
	}
}

// TestServerFailedIdentifyStaysTemplate: an identify that fails leaves the
// guest a template, so that the host may try again.
func TestServerFailedIdentifyStaysTemplate(t *testing.T) {
	g := &fakeGuest{release: make(chan struct{}), identify: errors.New("no bus")}
	srv, h, stop := serve(t, g, nil)
	defer stop()
	h.recv() // ready
	h.send(`{"id":1,"op":"identify","sandbox":"s1","run":"r1","nats_url":"nats://x:1","entropy":` + entropy + `}`)
	if r := h.answer(1); r.OK || r.Error != "no bus" {
		t.Fatalf("identify: %+v", r)
	}
	if srv.State() != vmctl.StateTemplate {
		t.Fatalf("state %s", srv.State())
	}
}

// reconnecting is a conn whose first read ends in a partial line and a
// reconnect of the host.
type reconnecting struct {
	io.Writer
	reads [][]byte
	errs  []error
	rest  io.Reader
}

func (c *reconnecting) Read(b []byte) (int, error) {
	if len(c.reads) > 0 {
		n := copy(b, c.reads[0])
		err := c.errs[0]
		c.reads, c.errs = c.reads[1:], c.errs[1:]
		return n, err
	}
	return c.rest.Read(b)
}

// TestServerDropsThePartialLineOfAHostThatWentAway: what a host sent
// before it went away (a restore) is not glued to the first line of the
// next connection.
func TestServerDropsThePartialLineOfAHostThatWentAway(t *testing.T) {
	g := &fakeGuest{release: make(chan struct{})}
	srv, err := NewServer(ServerConfig{Guest: g, Identified: true})
	if err != nil {
		t.Fatal(err)
	}
	out, in := io.Pipe()
	conn := &reconnecting{Writer: in, reads: [][]byte{[]byte(`{"id":1,"op":"hel`), nil}, errs: []error{nil, ErrHostReconnected},
		rest: &lineThenEOF{line: `{"id":2,"op":"hello"}` + "\n"}}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background(), conn) }()
	r, n, err := vmctl.DecodeGuestLine(mustLine(t, bufio.NewReader(out)))
	if err != nil || n != nil || r.ID != 2 || !r.OK || r.State != vmctl.StateIdentified {
		t.Fatalf("after the reconnect: %+v %+v %v", r, n, err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	in.Close()
}

type lineThenEOF struct {
	line string
	sent bool
}

func (l *lineThenEOF) Read(b []byte) (int, error) {
	if l.sent {
		return 0, io.EOF
	}
	l.sent = true
	return copy(b, l.line), nil
}

func mustLine(t *testing.T, r *bufio.Reader) []byte {
	t.Helper()
	line, err := r.ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	return line
}

// TestLease: a lease that is not renewed calls its expiry; one renewed in
// time does not, until the renewal runs out too.
func TestLease(t *testing.T) {
	l := NewLease(0)
	if _, ok := l.Left(); ok {
		t.Fatal("NewLease(0) has a lease")
	}
	ctx, cancel := context.WithCancel(context.Background())
	expired := make(chan time.Time, 1)
	done := make(chan bool, 1)
	start := time.Now()
	go func() { done <- l.Run(ctx, func() { expired <- time.Now() }) }()
	l.Renew(300 * time.Millisecond)
	l.Renew(600 * time.Millisecond) // a later renewal moves the end
	select {
	case at := <-expired:
		if at.Sub(start) < 600*time.Millisecond {
			t.Fatalf("expired after %s, before the renewal's 600ms", at.Sub(start))
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the lease never ran out")
	}
	if !<-done {
		t.Fatal("Run returned false after the expiry")
	}
	cancel()
	l2 := NewLease(time.Hour)
	ctx2, cancel2 := context.WithCancel(context.Background())
	go func() { done <- l2.Run(ctx2, func() { t.Error("expired") }) }()
	cancel2()
	if <-done {
		t.Fatal("Run returned true when ctx ended")
	}
}

// scriptedConn's reads come from a channel, one read a send: a test says
// when the host sends a line and when it connects again.
type scriptedConn struct {
	io.Writer
	reads chan scriptedRead
}

type scriptedRead struct {
	b   []byte
	err error
}

func (c *scriptedConn) Read(b []byte) (int, error) {
	r, ok := <-c.reads
	if !ok {
		return 0, io.EOF
	}
	return copy(b, r.b), r.err
}

// TestServerDropsAnswersToAnEarlierHost: a request in flight when the host
// connects again (a fork of a snapshot taken meanwhile, a restarted
// owner) is not answered on the new connection, whose host may have a
// request of the same id outstanding.
func TestServerDropsAnswersToAnEarlierHost(t *testing.T) {
	g := &fakeGuest{release: make(chan struct{})}
	srv, err := NewServer(ServerConfig{Guest: g, Identified: true})
	if err != nil {
		t.Fatal(err)
	}
	out, in := io.Pipe()
	conn := &scriptedConn{Writer: in, reads: make(chan scriptedRead)}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(context.Background(), conn) }()
	conn.reads <- scriptedRead{b: []byte(`{"id":7,"op":"exec","argv":["old"]}` + "\n")}
	conn.reads <- scriptedRead{err: ErrHostReconnected}
	conn.reads <- scriptedRead{b: []byte(`{"id":7,"op":"hello"}` + "\n")}
	lines := bufio.NewReader(out)
	r, n, err := vmctl.DecodeGuestLine(mustLine(t, lines))
	if err != nil || n != nil || r.ID != 7 || r.Hello == nil {
		t.Fatalf("first answer on the new connection: %+v %+v %v, want the hello's", r, n, err)
	}
	close(g.release) // the old exec ends now: its answer must go nowhere
	conn.reads <- scriptedRead{b: []byte(`{"id":8,"op":"sync"}` + "\n")}
	r, n, err = vmctl.DecodeGuestLine(mustLine(t, lines))
	if err != nil || n != nil || r.ID != 8 {
		t.Fatalf("after the old exec ended: %+v %+v %v, want the answer to 8 (the exec's answer was written)", r, n, err)
	}
	rest := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(lines); rest <- b }()
	close(conn.reads)
	if err := <-done; err != nil { // Serve waited for the exec
		t.Fatalf("Serve: %v", err)
	}
	in.Close()
	if b := <-rest; len(b) > 0 {
		t.Fatalf("written after the reconnect: %s (the old exec's answer)", b)
	}
}

// TestServerRefusesAnAnswerTooLongForALine: an answer that cannot be
// written in one line is replaced by a refusal of its request, so that the
// host's call ends.
func TestServerRefusesAnAnswerTooLongForALine(t *testing.T) {
	g := &fakeGuest{release: make(chan struct{})}
	_, h, stop := serve(t, g, nil)
	defer stop()
	h.recv() // ready
	h.send(`{"id":1,"op":"exec","argv":["big"]}`)
	// Refused before it is encoded (vmctl.Encode): at once, however
	// loaded the machine.
	if r, _ := h.recv(); r == nil || r.ID != 1 || r.OK || !strings.Contains(r.Error, "does not fit") {
		t.Fatalf("exec with an answer too long: %+v", r)
	}
}
