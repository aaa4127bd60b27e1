package relay

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
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
	reading  int   // calls whose request body is being read (they count as open)
	used     int64 // bytes the open calls keep: request bodies, reply bytes not yet delivered
	counts   sandboxapi.RelayCounts
	changed  chan struct{} // closed (and replaced) when the hold ends or kept bytes are freed
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
		upstream: strings.TrimRight(cfg.Upstream, "/"), open: map[uint64]*call{}, changed: make(chan struct{}), stopping: make(chan struct{})}, nil
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
	r.broadcastLocked()
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
	r.broadcastLocked()
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
	st := sandboxapi.RelayStatus{Up: r.up, URL: r.url, Upstream: r.upstream, Generation: r.gen, Holding: r.holding, Calls: r.counts, KeptBytes: r.used}
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

// errOverBudget: the open calls keep Config.MaxOpenBytes already.
var errOverBudget = errors.New("relay: over the open calls' byte budget")

// ServeHTTP implements http.Handler: one call. Over Config.MaxOpenCalls
// open calls, it is refused at once (503 too_many_calls), before its body
// is read, and counted as failed.
func (r *Relay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	r.mu.Lock()
	select {
	case <-r.stopping:
		r.mu.Unlock()
		relayError(w, http.StatusServiceUnavailable, "relay_stopping", "relay: stopping")
		return
	default:
	}
	if n := len(r.open) + r.reading; n >= r.cfg.MaxOpenCalls {
		r.counts.Total++
		r.counts.Failed++
		r.mu.Unlock()
		relayError(w, http.StatusServiceUnavailable, "too_many_calls", fmt.Sprintf("relay: %d model calls open, the most it keeps", n))
		return
	}
	r.reading++
	r.handlers.Add(1)
	r.mu.Unlock()
	defer r.handlers.Done()

	body, err := r.readBody(req.Body)
	c := r.take(req, body)
	switch {
	case errors.Is(err, errOverBudget):
		r.refuse(req.Context(), w, c, http.StatusServiceUnavailable, "too_many_calls",
			fmt.Sprintf("relay: the open model calls keep %d bytes, the most they may", r.cfg.MaxOpenBytes))
		return
	case err != nil:
		r.refuse(req.Context(), w, c, http.StatusBadRequest, "bad_request", fmt.Sprintf("relay: reading the request: %v", err))
		return
	case int64(len(body)) > r.cfg.MaxRequestBytes:
		r.refuse(req.Context(), w, c, http.StatusRequestEntityTooLarge, "request_too_large",
			fmt.Sprintf("relay: request body over %d bytes", r.cfg.MaxRequestBytes))
		return
	case len(bytes.TrimSpace(body)) > 0 && !json.Valid(body):
		r.refuse(req.Context(), w, c, http.StatusBadRequest, "malformed_request", "relay: request body is not JSON")
		return
	}
	r.serve(req.Context(), w, c)
}

// readBody reads a request body, at most Config.MaxRequestBytes+1 bytes,
// counting them against the byte budget as they come: past the budget it
// stops with errOverBudget. What it returns is counted (take hands it to
// the call, whose end frees it).
func (r *Relay) readBody(body io.Reader) ([]byte, error) {
	var out []byte
	chunk := make([]byte, 32<<10)
	for {
		n, err := body.Read(chunk[:min(int64(len(chunk)), r.cfg.MaxRequestBytes+1-int64(len(out)))])
		if n > 0 {
			r.mu.Lock()
			over := r.used+int64(n) > r.cfg.MaxOpenBytes
			if !over {
				r.used += int64(n)
			}
			r.mu.Unlock()
			if over {
				return out, errOverBudget
			}
			out = append(out, chunk[:n]...)
			if int64(len(out)) > r.cfg.MaxRequestBytes {
				return out, nil
			}
		}
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// broadcastLocked wakes whoever waits on r.changed (r.mu held).
func (r *Relay) broadcastLocked() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// freeLocked gives n kept bytes back to the budget (r.mu held).
func (r *Relay) freeLocked(n int) {
	if n > 0 {
		r.used -= int64(n)
		r.broadcastLocked()
	}
}

// dropBufLocked frees what attempt a keeps and keeps nothing more of it
// (r.mu held): it was replaced, or its call ended.
func (r *Relay) dropBufLocked(a *attempt) {
	if a == nil || a.released {
		return
	}
	r.freeLocked(len(a.buf))
	a.buf, a.released = nil, true
}

// take records a new call (held if the relay holds); its body is counted
// in the budget already.
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
	r.reading--
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
		r.freeLocked(len(c.body))
		r.dropBufLocked(c.att)
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
// failed. While the relay holds, the answer waits for the release (or the
// drop, or the harness gone): nothing reaches a harness during a hold.
func (r *Relay) refuse(ctx context.Context, w http.ResponseWriter, c *call, status int, code, msg string) {
	r.mu.Lock()
	for r.holding && c.dropped == "" {
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			r.fail(c, "relay: harness gone")
			return
		case <-r.stopping:
			r.fail(c, "relay: stopping")
			return
		}
		r.mu.Lock()
	}
	r.mu.Unlock()
	r.fail(c, msg)
	relayError(w, status, code, msg)
}

// serve forwards c and delivers its reply: the writer side of the call.
// It starts at most one attempt at a time and waits for each it started.
// What it delivered is kept as a length and a SHA-256, not a copy: a
// re-sent reply's first bytes are hashed as they come, the attempt's
// buffer trimmed as they are, and compared once they reach that length.
func (r *Relay) serve(ctx context.Context, w http.ResponseWriter, c *call) {
	var sentLen int64       // body bytes written to the harness
	sentSum := sha256.New() // and their hash
	var check hash.Hash     // the hash of the current attempt's first sentLen bytes
	var checkFor *attempt   // the attempt check is of
	status := 0             // status written to the harness (0: none yet)
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
					r.dropBufLocked(a)
					r.log.Info().Uint64("call", c.seq).Str("digest", c.digest).Uint64("generation", r.gen).
						Int64("delivered_bytes", sentLen).Msg("re-sending a cut call")
				}
				if r.upstream == "" {
					r.mu.Unlock()
					r.refuse(ctx, w, c, http.StatusServiceUnavailable, "no_upstream", "relay: no upstream (the relay was never pointed at a model server)")
					return
				}
				r.to(c, sandboxapi.CallForwarding)
				a = r.start(ctx, c)
			} else {
				a.repointed, a.cut = false, false
			}
		}
		if a != nil && a.err != nil && !a.cut && !a.repointed && r.holding {
			// It failed while the relay holds (or just before, and is seen
			// now): nothing reaches the harness during a hold, so it is
			// sent again at the release.
			a.cut = true
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
			if checkFor != a {
				checkFor, check = a, sha256.New()
			}
			switch {
			case status != 0 && a.status != status:
				failed = fmt.Sprintf("relay: the re-sent call was answered %d, not %d", a.status, status)
			case a.off < sentLen:
				// The re-sent reply's bytes up to what was delivered: hashed,
				// not written.
				n := int(min(int64(len(a.buf)), sentLen-a.off))
				check.Write(a.buf[:n])
				r.trimLocked(a, n)
				switch {
				case a.off == sentLen && !bytes.Equal(check.Sum(nil), sentSum.Sum(nil)),
					a.off < sentLen && a.ended:
					failed = "relay: the re-sent call's reply differs from what was delivered"
				}
			}
			if failed == "" && a.off >= sentLen {
				if status == 0 {
					writeStatus, head = a.status, a.header
				}
				if len(a.buf) > 0 {
					write = a.buf
					a.buf = nil
					a.off += int64(len(write))
					r.freeLocked(len(write))
				}
				finished = a.ended
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
			sentLen += int64(len(write))
			sentSum.Write(write)
			if _, err := w.Write(write); err != nil {
				r.fail(c, "relay: harness gone: "+err.Error())
				return
			}
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

// trimLocked drops the first n bytes of a's buffer, consumed (r.mu
// held).
func (r *Relay) trimLocked(a *attempt, n int) {
	if n == 0 {
		return
	}
	a.buf = append([]byte(nil), a.buf[n:]...)
	a.off += int64(n)
	r.freeLocked(n)
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
		// Over the byte budget, wait for bytes to be freed, unless this
		// attempt keeps none: every reply can always move on, one read at
		// a time, so the budget is exceeded by at most one read per open
		// call, and a hold that keeps the replies stops their reading.
		r.mu.Lock()
		for r.used > r.cfg.MaxOpenBytes && len(a.buf) > 0 && !a.released {
			ch := r.changed
			r.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				finish(fmt.Errorf("relay: upstream %s: %w", target, context.Cause(ctx)))
				return
			}
			r.mu.Lock()
		}
		r.mu.Unlock()
		n, err := resp.Body.Read(buf)
		if n > 0 {
			r.mu.Lock()
			if !a.released {
				a.buf = append(a.buf, buf[:n]...)
				r.used += int64(n)
			}
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
