package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"time"
)

// start starts an attempt of c at the current upstream (r.mu held).
func (r *Relay) start(ctx context.Context, c *call) *attempt {
	r.rebranchLocked(c) // the label in force when it is sent
	actx, cancel := context.WithCancel(ctx)
	a := &attempt{gen: r.gen, cancel: cancel, done: make(chan struct{})}
	c.att, c.gen = a, r.gen
	target := r.upstream + c.uri
	if c.upURI != "" {
		target = r.upstream + c.upURI
	}
	go r.read(actx, c, a, target)
	return a
}

// read sends attempt a of c to target and reads the reply into a, waking
// c at every change. The call's serve waits for it.
func (r *Relay) read(ctx context.Context, c *call, a *attempt, target string) {
	defer close(a.done)
	defer c.signal()
	// Whether the transport ever had a connection for the request: a
	// dial error after one (the transport's own retry of a request it
	// may have sent, on a connection that broke) is no proof that the
	// upstream never saw it.
	var connected atomic.Bool
	finish := func(err error) {
		r.mu.Lock()
		defer r.mu.Unlock()
		if err != nil {
			a.err = err
			// Cut by a Repoint, or broken while the relay holds (the
			// snapshot's connection to a model server that is gone): a
			// re-send repairs it. Otherwise the harness is told.
			a.cut = a.repointed || r.holding
			if !a.cut && !connected.Load() && unsent(err) && ctx.Err() == nil {
				r.redialLocked(c, a)
			}
		} else {
			a.ended = true
		}
	}
	body := c.body
	if c.upBody != nil {
		body = c.upBody
	}
	trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { connected.Store(true) }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), c.method, target, bytes.NewReader(body))
	if err != nil {
		finish(fmt.Errorf("relay: upstream request: %w", err))
		return
	}
	req.Header = c.header.Clone()
	idHeader(req.Header, c.id)
	branchHeaders(req.Header, c.branch)
	if c.id != "" || c.via != "" {
		// The capture and the translation read the reply: plain bytes.
		req.Header.Del("Accept-Encoding")
	}
	req.ContentLength = int64(len(body))
	resp, err := r.client.Do(req)
	if err != nil {
		finish(fmt.Errorf("relay: upstream %s unreachable: %w", target, err))
		return
	}
	defer resp.Body.Close()
	r.mu.Lock()
	a.status, a.header = resp.StatusCode, copyHeader(resp.Header)
	if c.id != "" || c.via != "" {
		// A stream is what the upstream says it sends, whatever the
		// request asked.
		api := c.api
		if c.via != "" {
			api = c.via
		}
		a.shape = newShaper(strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream"), c.augmented, c.asked, api, r.cfg.MaxKeptReply)
		if c.via != "" && resp.StatusCode == http.StatusOK {
			a.shape.tr = newReplyTranslator(c.api, a.shape.stream)
		}
	}
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
			out, kept := buf[:n], 0
			if a.shape != nil {
				before := a.shape.kept()
				out = a.shape.feed(out)
				kept = a.shape.kept() - before
			}
			r.mu.Lock()
			if a.firstByte.IsZero() {
				a.firstByte = time.Now()
			}
			if !a.released {
				a.buf = append(a.buf, out...)
				r.used += int64(len(out) + kept)
				a.kept += kept
			}
			r.mu.Unlock()
			c.signal()
			if a.shape != nil && a.shape.err != nil {
				finish(a.shape.err)
				return
			}
		}
		if errors.Is(err, io.EOF) {
			switch {
			case a.shape != nil && c.id != "":
				r.record(c, a)
			case a.shape != nil:
				r.deliverTail(a) // translated, not captured
			}
			if c.id == "" && r.cfg.Capture != nil {
				r.mu.Lock()
				r.capture.Unlabeled++
				r.mu.Unlock()
			}
			finish(nil)
			return
		}
		if err != nil {
			finish(fmt.Errorf("relay: upstream %s broke off: %w", target, err))
			return
		}
	}
}

// deliverTail lets the bytes a's shaper kept go to the harness: a reply
// translated but not captured.
func (r *Relay) deliverTail(a *attempt) {
	tail := a.shape.end()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tailLocked(a, tail)
}

// tailLocked moves the bytes a's shaper kept, given as tail, to a's
// buffer (r.mu held).
func (r *Relay) tailLocked(a *attempt, tail []byte) {
	if a.released {
		return
	}
	a.buf = append(a.buf, tail...)
	r.used += int64(len(tail))
	r.freeLocked(a.kept)
	a.kept = 0
}

// record records call c, answered whole by attempt a, in the capture file
// (durably), then lets the reply's held end go to the harness. A record
// that fails is logged and counted, and the reply is delivered all the
// same: the harness is not the capture's to break.
func (r *Relay) record(c *call, a *attempt) {
	r.mu.Lock()
	ex := exchange(c, a)
	p := c.prep
	r.mu.Unlock()
	if p != nil {
		<-p.done
		ex.Request = p.req
	}
	ex.Reply = a.shape.asm.Reply(ex.Status)
	tail := a.shape.end()
	if tr := a.shape.tr; tr != nil && ex.Reply.Error == "" {
		// The record says what the harness got: a translated reply left
		// unfinished, or an error, is no whole reply.
		ex.Reply.Error = tr.incomplete()
	}
	rec, err := r.cfg.Capture.Record(ex)
	r.mu.Lock()
	r.tailLocked(a, tail)
	if err != nil {
		r.capture.Errors++
		r.capture.LastError = err.Error()
	} else {
		r.capture.Recorded++
	}
	r.mu.Unlock()
	if err != nil {
		r.log.Error().Err(err).Str("call", c.id).Uint64("seq", c.seq).Msg("model call not captured")
		return
	}
	r.log.Debug().Str("call", rec.ID).Str("parent", rec.Parent).Str("link", string(rec.Link)).Uint64("generation", ex.Generation).
		Int("status", ex.Status).Bool("tokens", rec.Tokens).Msg("model call captured")
}

// unsent reports whether err says an upstream request failed before any
// connection was made (refused, no route, a dial that timed out): the
// upstream never saw it.
func unsent(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// redialBackoff bounds the pause between two dials of an unreachable
// upstream; maxRedials bounds the dials of one call whatever the clock
// says (a restore may move it).
const (
	redialBackoff = 5 * time.Second
	maxRedials    = 1000
)

// redialLocked makes attempt a of c, which found the upstream
// unreachable, a cut to dial again after a pause (250 ms, doubling to
// redialBackoff) while Config.UnreachableFor has not passed since the
// call first found it so (r.mu held).
func (r *Relay) redialLocked(c *call, a *attempt) {
	now := time.Now()
	if c.unreachable.IsZero() {
		c.unreachable = now
	}
	if r.cfg.UnreachableFor < 0 || now.Sub(c.unreachable) >= r.cfg.UnreachableFor || c.redials >= maxRedials {
		return
	}
	pause := min(250*time.Millisecond<<min(c.redials, 5), redialBackoff)
	c.redials++
	a.cut, a.unsent, a.notBefore = true, true, now.Add(pause)
}
