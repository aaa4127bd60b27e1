package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
)

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
