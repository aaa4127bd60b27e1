package relay

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"sync"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// Relay is the model relay. Create it with New; Run (or Serve) serves it;
// Hold, Release, Repoint and Status may be called from any goroutine,
// before, during and after Run.
type Relay struct {
	cfg    Config
	log    zerolog.Logger
	client *http.Client

	mu       sync.Mutex
	holding  bool
	upstream string
	gen      uint64
	url      string // the URL a harness is given, once listening
	up       bool
	seq      uint64
	open     map[uint64]*call
	counts   sandboxapi.RelayCounts
	stopping chan struct{} // closed when Serve is returning
	handlers sync.WaitGroup
}

// New checks cfg and returns a relay that is not yet serving.
func New(cfg Config) (*Relay, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.setDefaults()
	return &Relay{cfg: cfg, log: cfg.Logger.With().Str("component", "relay").Logger(),
		client:   &http.Client{Transport: cfg.Transport, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		upstream: strings.TrimRight(cfg.Upstream, "/"), open: map[uint64]*call{}, stopping: make(chan struct{})}, nil
}

func checkUpstream(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%w %q: %w", ErrBadUpstream, s, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return fmt.Errorf("%w %q (want http(s)://host[:port][/path])", ErrBadUpstream, s)
	}
	return nil
}

// Run listens on Config.Listen and serves until ctx ends (see Serve).
func (r *Relay) Run(ctx context.Context) error {
	if r.cfg.Listen == "" {
		return errors.New("relay: Config.Listen is required by Run")
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", r.cfg.Listen)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	return r.Serve(ctx, ln)
}

// Serve serves on ln until ctx ends, then closes every connection and
// waits for every handler (and the upstream reads they started). A relay
// is served once.
func (r *Relay) Serve(ctx context.Context, ln net.Listener) error {
	srv := &http.Server{Handler: r, BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) }}
	r.mu.Lock()
	r.url, r.up = "http://"+ln.Addr().String(), true
	r.mu.Unlock()
	r.log.Info().Str("url", r.url).Str("upstream", r.Upstream()).Msg("model relay listening")
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	served := false
	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
		served = true
	}
	r.mu.Lock()
	r.up = false
	close(r.stopping)
	r.mu.Unlock()
	_ = srv.Close()
	if !served {
		err = <-errc
	}
	r.handlers.Wait()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// URL returns the URL a harness is given ("" before Serve).
func (r *Relay) URL() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.url
}

// Upstream returns the current upstream URL.
func (r *Relay) Upstream() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.upstream
}

// Hold holds the relay: new calls wait before they are forwarded, and no
// reply reaches the harness until Release. Holding twice is holding.
func (r *Relay) Hold() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.holding {
		r.holding = true
		r.log.Info().Int("open", len(r.open)).Msg("holding model calls")
	}
}

// Release ends the hold: held calls go upstream, kept replies reach the
// harness. Releasing a relay that does not hold does nothing.
func (r *Relay) Release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.holding {
		return
	}
	r.holding = false
	r.log.Info().Int("open", len(r.open)).Msg("releasing model calls")
	// A kept-alive upstream connection may not have outlived the hold (a
	// restored VM's old forward): calls from now on dial afresh.
	r.client.CloseIdleConnections()
	for _, c := range r.open {
		c.signal()
	}
}

// Drop ends the hold as Release does, but first fails every call the relay
// holds or has in flight (each harness still connected gets a 503
// call_abandoned): what a restore kept of a launch its agent abandoned
// (killed, not continued) must not reach the next model server, where the
// relaunched harness makes its own calls. Dropping a relay that does not
// hold does nothing.
func (r *Relay) Drop(why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.holding {
		return
	}
	r.holding = false
	r.log.Warn().Int("open", len(r.open)).Str("why", why).Msg("dropping the held model calls")
	r.client.CloseIdleConnections()
	for _, c := range r.open {
		c.dropped = why
		if a := c.att; a != nil {
			a.cancel()
		}
		c.signal()
	}
}

// Holding reports whether the relay holds.
func (r *Relay) Holding() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.holding
}

// Repoint makes upstream, at generation gen, the relay's upstream. gen
// must be higher than the current generation (else ErrStaleGeneration).
// Every call of an older generation whose reply has not ended upstream has
// its attempt cut and is sent again to the new upstream: at once if the
// relay does not hold, else at the Release (never if a Drop comes first).
func (r *Relay) Repoint(upstream string, gen uint64) (sandboxapi.RelayStatus, error) {
	if err := checkUpstream(upstream); err != nil {
		return r.Status(), err
	}
	r.mu.Lock()
	if gen <= r.gen {
		cur := r.gen
		r.mu.Unlock()
		return r.Status(), fmt.Errorf("%w: %d is not above %d", ErrStaleGeneration, gen, cur)
	}
	old := r.upstream
	r.upstream, r.gen = strings.TrimRight(upstream, "/"), gen
	// Idle connections to the old upstream (after a restore: to a forward
	// the new VM does not have, where a request could wait forever) are
	// never used again, even for the same address.
	r.client.CloseIdleConnections()
	cut := 0
	for _, c := range r.open {
		if a := c.att; a != nil && !a.ended && a.err == nil && a.gen < gen {
			a.repointed = true
			a.cancel()
			cut++
		}
		c.signal()
	}
	r.mu.Unlock()
	r.log.Warn().Str("from", old).Str("to", upstream).Uint64("generation", gen).Int("cut", cut).Msg("relay re-pointed")
	return r.Status(), nil
}

// Status returns the relay's status.
func (r *Relay) Status() sandboxapi.RelayStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	st := sandboxapi.RelayStatus{Up: r.up, URL: r.url, Upstream: r.upstream, Generation: r.gen, Holding: r.holding, Calls: r.counts}
	for _, c := range r.open {
		switch c.state {
		case sandboxapi.CallHeld:
			st.Calls.Held++
		case sandboxapi.CallForwarding, sandboxapi.CallReplied:
			st.Calls.InFlight++
		}
		st.Open = append(st.Open, c.snapshot())
	}
	sort.Slice(st.Open, func(i, j int) bool { return st.Open[i].Seq < st.Open[j].Seq })
	return st
}

// hopHeaders are not forwarded either way.
var hopHeaders = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization", "Proxy-Connection",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade", "Content-Length", "Host"}

func copyHeader(h http.Header) http.Header {
	out := h.Clone()
	for _, k := range hopHeaders {
		out.Del(k)
	}
	return out
}

// relayError is the JSON error a harness gets from the relay itself.
func relayError(w http.ResponseWriter, status int, code, msg string) {
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"message": msg, "type": "relay_error", "code": code}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", fmt.Sprint(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// ServeHTTP implements http.Handler: one call.
func (r *Relay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	select {
	case <-r.stopping:
		r.mu.Unlock()
		relayError(w, http.StatusServiceUnavailable, "relay_stopping", "relay: stopping")
		return
	default:
	}
	r.handlers.Add(1)
	r.mu.Unlock()
	defer r.handlers.Done()

	body, err := io.ReadAll(io.LimitReader(req.Body, r.cfg.MaxRequestBytes+1))
	c := r.take(req, body)
	switch {
	case err != nil:
		r.refuse(w, c, http.StatusBadRequest, "bad_request", fmt.Sprintf("relay: reading the request: %v", err))
		return
	case int64(len(body)) > r.cfg.MaxRequestBytes:
		r.refuse(w, c, http.StatusRequestEntityTooLarge, "request_too_large",
			fmt.Sprintf("relay: request body over %d bytes", r.cfg.MaxRequestBytes))
		return
	case len(bytes.TrimSpace(body)) > 0 && !json.Valid(body):
		r.refuse(w, c, http.StatusBadRequest, "malformed_request", "relay: request body is not JSON")
		return
	}
	r.serve(req.Context(), w, c)
}

// take records a new call (held if the relay holds).
func (r *Relay) take(req *http.Request, body []byte) *call {
	h := sha256.New()
	fmt.Fprintf(h, "%s %s\n", req.Method, req.URL.RequestURI())
	h.Write(body)
	c := &call{digest: hex.EncodeToString(h.Sum(nil)), method: req.Method, uri: req.URL.RequestURI(),
		header: copyHeader(req.Header), body: body, wake: make(chan struct{}, 1)}
	var probe struct {
		Stream bool `json:"stream"`
	}
	if json.Unmarshal(body, &probe) == nil {
		c.stream = probe.Stream
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seq++
	r.counts.Total++
	c.seq, c.gen, c.state = r.seq, r.gen, sandboxapi.CallHeld
	r.open[c.seq] = c
	return c
}

// to moves c to state s (r.mu held); an illegal move is logged and
// refused.
func (r *Relay) to(c *call, s sandboxapi.CallState) bool {
	if err := checkTransition(c.state, s); err != nil {
		r.log.Error().Err(err).Uint64("call", c.seq).Msg("call state")
		return false
	}
	c.state = s
	if s == sandboxapi.CallDelivered || s == sandboxapi.CallFailed {
		delete(r.open, c.seq)
		if s == sandboxapi.CallDelivered {
			r.counts.Delivered++
		} else {
			r.counts.Failed++
		}
		r.log.Debug().Uint64("call", c.seq).Str("digest", c.digest).Uint64("generation", c.gen).
			Stringer("state", s).Int("resends", c.resends).Str("error", c.err).Msg("call ended")
	}
	return true
}

// fail records c as failed with why (r.mu not held).
func (r *Relay) fail(c *call, why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c.err = why
	r.to(c, sandboxapi.CallFailed)
}

// refuse answers a call the relay will not forward, recorded once as
// failed.
func (r *Relay) refuse(w http.ResponseWriter, c *call, status int, code, msg string) {
	r.fail(c, msg)
	relayError(w, status, code, msg)
}

// serve forwards c and delivers its reply: the writer side of the call.
// It starts at most one attempt at a time and waits for each it started.
func (r *Relay) serve(ctx context.Context, w http.ResponseWriter, c *call) {
	var sent []byte // body bytes written to the harness
	status := 0     // status written to the harness (0: none yet)
	fl, _ := w.(http.Flusher)
	defer func() {
		r.mu.Lock()
		a := c.att
		r.mu.Unlock()
		if a != nil {
			a.cancel()
			<-a.done
		}
	}()
	for {
		r.mu.Lock()
		a := c.att
		if why := c.dropped; why != "" {
			r.mu.Unlock()
			r.fail(c, "relay: call abandoned: "+why)
			if status == 0 {
				relayError(w, http.StatusServiceUnavailable, "call_abandoned", "relay: call abandoned: "+why)
				return
			}
			panic(http.ErrAbortHandler)
		}
		if r.startable(c) {
			if a != nil {
				// Make sure the attempt it replaces has stopped: a reply that
				// ended after all is delivered, not sent again.
				r.mu.Unlock()
				a.cancel()
				<-a.done
				r.mu.Lock()
				if c.dropped != "" || r.holding {
					r.mu.Unlock()
					continue // dropped, or held again, meanwhile
				}
			}
			if a == nil || !a.ended {
				if a != nil {
					c.resends++
					r.counts.Resent++
					r.log.Info().Uint64("call", c.seq).Str("digest", c.digest).Uint64("generation", r.gen).
						Int("delivered_bytes", len(sent)).Msg("re-sending a cut call")
				}
				if r.upstream == "" {
					r.mu.Unlock()
					r.refuse(w, c, http.StatusServiceUnavailable, "no_upstream", "relay: no upstream (the relay was never pointed at a model server)")
					return
				}
				r.to(c, sandboxapi.CallForwarding)
				a = r.start(ctx, c)
			} else {
				a.repointed, a.cut = false, false
			}
		}
		needs := a == nil || a.repointed || a.cut
		if a != nil && a.ended && c.state == sandboxapi.CallForwarding {
			r.to(c, sandboxapi.CallReplied)
		}
		var write []byte
		var head http.Header
		writeStatus := 0
		finished, failed := false, ""
		if a != nil && !needs && !r.holding && a.status != 0 {
			switch {
			case status != 0 && a.status != status:
				failed = fmt.Sprintf("relay: the re-sent call was answered %d, not %d", a.status, status)
			case len(a.buf) < len(sent) && (a.ended || !bytes.Equal(a.buf, sent[:len(a.buf)])),
				len(a.buf) >= len(sent) && !bytes.Equal(a.buf[:len(sent)], sent):
				failed = "relay: the re-sent call's reply differs from what was delivered"
			default:
				if status == 0 {
					writeStatus, head = a.status, a.header
				}
				if len(a.buf) > len(sent) {
					write = a.buf[len(sent):]
				}
				if a.ended {
					finished = true
				}
			}
			c.status = a.status
		}
		if a != nil && a.err != nil && !a.cut && !a.repointed && failed == "" {
			failed = a.err.Error()
		}
		r.mu.Unlock()

		if failed != "" {
			r.fail(c, failed)
			if status == 0 {
				relayError(w, http.StatusBadGateway, "upstream_failed", failed)
				return
			}
			panic(http.ErrAbortHandler) // a reply cut short: never spliced
		}
		if writeStatus != 0 {
			for k, v := range head {
				w.Header()[k] = v
			}
			w.WriteHeader(writeStatus)
			status = writeStatus
		}
		if len(write) > 0 {
			if _, err := w.Write(write); err != nil {
				r.fail(c, "relay: harness gone: "+err.Error())
				return
			}
			sent = append(sent, write...)
		}
		if (writeStatus != 0 || len(write) > 0) && fl != nil {
			fl.Flush()
		}
		if finished {
			r.mu.Lock()
			r.to(c, sandboxapi.CallDelivered)
			r.mu.Unlock()
			return
		}
		select {
		case <-c.wake:
		case <-ctx.Done():
			r.fail(c, "relay: harness gone")
			return
		case <-r.stopping:
			r.fail(c, "relay: stopping")
			return
		}
	}
}

// startable reports whether c needs an attempt started now (r.mu held):
// its first once the relay does not hold; a re-send of one a Repoint cut,
// once the relay does not hold; a re-send of one that broke off while the
// relay held, once it no longer holds.
func (r *Relay) startable(c *call) bool {
	a := c.att
	switch {
	case a == nil:
		return !r.holding
	case a.repointed:
		return !r.holding
	case a.cut:
		return !r.holding
	}
	return false
}

// start starts an attempt of c at the current upstream (r.mu held).
func (r *Relay) start(ctx context.Context, c *call) *attempt {
	actx, cancel := context.WithCancel(ctx)
	a := &attempt{gen: r.gen, cancel: cancel, done: make(chan struct{})}
	c.att, c.gen = a, r.gen
	target := r.upstream + c.uri
	go r.read(actx, c, a, target)
	return a
}

// read sends attempt a of c to target and reads the reply into a, waking
// c at every change. The call's serve waits for it.
func (r *Relay) read(ctx context.Context, c *call, a *attempt, target string) {
	defer close(a.done)
	defer c.signal()
	finish := func(err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if err != nil {
			a.err = err
			// Cut by a Repoint, or broken while the relay holds (the
			// snapshot's connection to a model server that is gone): a
			// re-send repairs it. Otherwise the harness is told.
			a.cut = a.repointed || r.holding
		} else {
			a.ended = true
		}
	}
	req, err := http.NewRequestWithContext(ctx, c.method, target, bytes.NewReader(c.body))
	if err != nil {
		finish(fmt.Errorf("relay: upstream request: %w", err))
		return
	}
	req.Header = c.header.Clone()
	req.ContentLength = int64(len(c.body))
	resp, err := r.client.Do(req)
	if err != nil {
		finish(fmt.Errorf("relay: upstream %s unreachable: %w", target, err))
		return
	}
	defer resp.Body.Close()
	r.mu.Lock()
	a.status, a.header = resp.StatusCode, copyHeader(resp.Header)
	r.mu.Unlock()
	c.signal()
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			r.mu.Lock()
			a.buf = append(a.buf, buf[:n]...)
			r.mu.Unlock()
			c.signal()
		}
		if errors.Is(err, io.EOF) {
			finish(nil)
			return
		}
		if err != nil {
			finish(fmt.Errorf("relay: upstream %s broke off: %w", target, err))
			return
		}
	}
}
