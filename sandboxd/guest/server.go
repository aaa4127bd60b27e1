package guest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/sandboxd/vmctl"
)

// ErrHostReconnected is what a Conn's Read returns once the host has
// connected again after it went away (a restore, a restarted owner): the
// server drops the partial line it held and reads on.
var ErrHostReconnected = errors.New("guest: the host connected again")

// ErrState is returned for an op the guest's state does not allow: an
// identify of a guest that has its identity, a reidentify of a template.
var ErrState = errors.New("guest: not in this state")

// Guest is what the control ops do to the machine: System is the Linux
// one, a test gives its own.
type Guest interface {
	// Hello reports the guest's state and identity.
	Hello() vmctl.Hello
	// Identify carries out an identify or a reidentify (req.Op says
	// which) and returns the Hello once the member joined.
	Identify(ctx context.Context, req vmctl.Request) (vmctl.Hello, error)
	// Exec runs a command and waits for it.
	Exec(ctx context.Context, req vmctl.Request) (vmctl.ExecResult, error)
	// SetClock sets the realtime clock.
	SetClock(wall time.Time) error
	// Sync flushes the file systems.
	Sync() error
}

// ServerConfig configures a Server.
type ServerConfig struct {
	// Guest carries out the ops. Required.
	Guest Guest
	// Lease is the guest's lease, renewed by lease and identify (may be
	// nil: no lease).
	Lease *Lease
	// Identified starts the server in StateIdentified (a test's fork).
	Identified bool
	// Logger receives the server's logs.
	Logger zerolog.Logger
}

// Server serves the control protocol (package vmctl) to the host, one
// request at a time per goroutine: an exec does not hold up a lease
// renewal. Identify and reidentify are serialised, and move the state.
type Server struct {
	cfg ServerConfig
	log zerolog.Logger

	idMu  sync.Mutex // serialises identify and reidentify
	mu    sync.Mutex
	state vmctl.State
	ready bool // the ready notice was written

	wmu sync.Mutex // one line at a time
	w   io.Writer
	// conns counts the host's reconnects (guarded by wmu): an answer to a
	// request read on an earlier connection is not written on this one.
	conns uint64
}

// line is a request line and the connection (Server.conns) it came on.
type line struct {
	b    []byte
	conn uint64
}

// NewServer returns a server in StateTemplate (or StateIdentified).
func NewServer(cfg ServerConfig) (*Server, error) {
	if cfg.Guest == nil {
		return nil, errors.New("guest: ServerConfig.Guest is required")
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With().Str("component", "vmctl").Logger(), state: vmctl.StateTemplate}
	if cfg.Identified {
		s.state = vmctl.StateIdentified
	}
	return s, nil
}

// State returns the guest's state as the server moved it.
func (s *Server) State() vmctl.State {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// Serve reads requests from conn and answers each on conn until conn's
// Read returns io.EOF (Serve returns nil) or another error than
// ErrHostReconnected; then it waits for the requests in flight. The end
// of ctx cancels the requests in flight and stops reading at the next
// line; a Read that blocks ends only when conn is closed, so a caller
// that ends ctx closes conn too. A guest still waiting for its identity
// first writes the ready notice (once per Server).
func (s *Server) Serve(ctx context.Context, conn io.ReadWriter) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.wmu.Lock()
	s.w = conn
	s.wmu.Unlock()
	var wg sync.WaitGroup
	defer wg.Wait()
	s.mu.Lock()
	announce := s.state == vmctl.StateTemplate && !s.ready
	s.ready = s.ready || announce
	s.mu.Unlock()
	if announce {
		wg.Go(func() { s.Notify(vmctl.Notice{Event: vmctl.EventReady, State: vmctl.StateTemplate}) })
	}
	lines := make(chan line)
	readErr := make(chan error, 1)
	wg.Go(func() { readErr <- s.read(ctx, conn, lines) })
	for {
		select {
		case err := <-readErr:
			if errors.Is(err, io.EOF) || ctx.Err() != nil {
				return nil
			}
			return err
		case l := <-lines:
			req, err := vmctl.DecodeRequest(l.b)
			if err != nil {
				s.answer(l.conn, vmctl.Response{ID: req.ID, Error: err.Error()})
				continue
			}
			wg.Go(func() { s.answer(l.conn, s.handle(ctx, req)) })
		}
	}
}

// read splits conn into lines; a reconnect of the host drops the partial
// line and makes the answers to the requests read before it go nowhere.
func (s *Server) read(ctx context.Context, conn io.Reader, lines chan<- line) error {
	br := bufio.NewReaderSize(conn, 64<<10)
	var cur []byte
	s.wmu.Lock()
	gen := s.conns
	s.wmu.Unlock()
	for {
		chunk, err := br.ReadSlice('\n')
		cur = append(cur, chunk...)
		switch {
		case err == nil:
			b := cur
			cur = nil
			if len(b) > 1 {
				select {
				case lines <- line{b: b, conn: gen}:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
		case errors.Is(err, bufio.ErrBufferFull):
			if len(cur) > vmctl.MaxLine {
				return fmt.Errorf("%w: a line longer than %d bytes", vmctl.ErrProtocol, vmctl.MaxLine)
			}
		case errors.Is(err, ErrHostReconnected):
			s.log.Info().Int("dropped", len(cur)).Msg("host connected again")
			cur = nil
			s.wmu.Lock()
			s.conns++
			gen = s.conns
			s.wmu.Unlock()
			br.Reset(conn)
		default:
			return err
		}
	}
}

// handle carries out one request.
func (s *Server) handle(ctx context.Context, req vmctl.Request) vmctl.Response {
	res := vmctl.Response{ID: req.ID}
	var err error
	switch req.Op {
	case vmctl.OpHello:
		h := s.cfg.Guest.Hello()
		h.State = s.State()
		res.Hello = &h
	case vmctl.OpIdentify, vmctl.OpReidentify:
		var h vmctl.Hello
		h, err = s.identify(ctx, req)
		res.Hello = &h
	case vmctl.OpExec:
		var r vmctl.ExecResult
		r, err = s.cfg.Guest.Exec(ctx, req)
		res.ExecResult = &r
	case vmctl.OpLease:
		if s.cfg.Lease != nil {
			s.cfg.Lease.Renew(time.Duration(req.UntilMS) * time.Millisecond)
		}
	case vmctl.OpClock:
		err = s.cfg.Guest.SetClock(req.Wall)
	case vmctl.OpSync:
		err = s.cfg.Guest.Sync()
	}
	if err != nil {
		s.log.Warn().Err(err).Str("op", string(req.Op)).Uint64("id", req.ID).Msg("request failed")
		return vmctl.Response{ID: req.ID, Error: err.Error()}
	}
	res.OK = true
	return res
}

// identify moves template -> identified (identify) or identified ->
// identified (reidentify), one at a time.
func (s *Server) identify(ctx context.Context, req vmctl.Request) (vmctl.Hello, error) {
	s.idMu.Lock()
	defer s.idMu.Unlock()
	want := vmctl.StateTemplate
	if req.Op == vmctl.OpReidentify {
		want = vmctl.StateIdentified
	}
	if st := s.State(); st != want {
		return vmctl.Hello{}, fmt.Errorf("%w: %s needs a guest in state %s, this one is %s", ErrState, req.Op, want, st)
	}
	if req.LeaseMS > 0 && s.cfg.Lease != nil {
		// Renewed first: a slow join must not let the old lease run out.
		s.cfg.Lease.Renew(time.Duration(req.LeaseMS) * time.Millisecond)
	}
	h, err := s.cfg.Guest.Identify(ctx, req)
	if err != nil {
		return vmctl.Hello{}, err
	}
	s.mu.Lock()
	s.state = vmctl.StateIdentified
	s.mu.Unlock()
	h.State = vmctl.StateIdentified
	return h, nil
}

// Notify writes a notice line to the host (best effort).
func (s *Server) Notify(n vmctl.Notice) {
	s.write(n)
}

// answer writes r, the answer to a request read on connection conn,
// unless the host connected again since: ids are the old host's (or, in a
// fork, the snapshot's host's), and the host now connected may have a
// request of its own with that id outstanding. An answer that does not
// encode (longer than vmctl.MaxLine) is replaced by a refusal of the
// request: the host's call must not wait for an answer that never comes.
func (s *Server) answer(conn uint64, r vmctl.Response) {
	b, err := vmctl.Encode(r)
	if err != nil {
		s.log.Error().Err(err).Uint64("id", r.ID).Msg("encode an answer to the host")
		if b, err = vmctl.Encode(vmctl.Response{ID: r.ID, Error: "guest: the answer does not fit in a line: " + err.Error()}); err != nil {
			return
		}
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if conn != s.conns {
		s.log.Info().Uint64("id", r.ID).Msg("answer to a request of an earlier host connection dropped")
		return
	}
	s.writeLocked(b)
}

func (s *Server) write(v any) {
	line, err := vmctl.Encode(v)
	if err != nil {
		s.log.Error().Err(err).Msg("encode a line to the host")
		return
	}
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.writeLocked(line)
}

func (s *Server) writeLocked(line []byte) {
	if s.w == nil {
		return
	}
	if _, err := s.w.Write(line); err != nil {
		s.log.Warn().Err(err).Msg("write to the host")
	}
}
