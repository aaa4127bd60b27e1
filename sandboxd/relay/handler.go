package relay

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

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
	c := r.take(req, body, err == nil && int64(len(body)) <= r.cfg.MaxRequestBytes)
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

// take records a new call (held if the relay holds); its body is counted
// in the budget already. With edit (a body read whole), the launch's
// relay edits are applied to it first, then the branch label's seed
// (branch.go).
func (r *Relay) take(req *http.Request, body []byte, edit bool) *call {
	r.mu.Lock()
	eds, branch := r.edits, r.branch
	r.mu.Unlock()
	api := trajectory.APIOf(req.URL.Path)
	var edited, seeded []trajectory.Edit
	var base []byte
	if edit {
		// The launch's edits and the branch's seed, before anything looks
		// at the body: the digest, the upstream's bytes (every attempt's)
		// and the record are of the edited body.
		in := len(body)
		if len(eds) > 0 {
			body, edited = applyEdits(eds, req.URL.RequestURI(), body)
		}
		body, seeded, base = seedBody(api, body, branch)
		r.mu.Lock()
		r.used += int64(len(body) - in + len(base))
		r.mu.Unlock()
	}
	h := sha256.New()
	fmt.Fprintf(h, "%s %s\n", req.Method, req.URL.RequestURI())
	h.Write(body)
	c := &call{digest: hex.EncodeToString(h.Sum(nil)), method: req.Method, uri: req.URL.RequestURI(),
		header: copyHeader(req.Header), body: body, launchEdits: edited, wake: make(chan struct{}, 1), api: api,
		branch: branch, base: base}
	c.edits = append(append([]trajectory.Edit(nil), edited...), seeded...)
	var probe struct {
		Stream bool `json:"stream"`
	}
	if json.Unmarshal(body, &probe) == nil {
		c.stream = probe.Stream
	}
	if edit {
		r.upstreamBody(c)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.used += int64(len(c.upBody))
	r.reading--
	r.seq++
	r.counts.Total++
	c.seq, c.gen, c.state = r.seq, r.gen, sandboxapi.CallHeld
	r.open[c.seq] = c
	if r.cfg.Capture != nil {
		c.started = time.Now()
		if r.episode != "" {
			k := r.episode + "." + r.launch
			if _, ok := r.nums[k]; !ok {
				r.nums[k] = r.cfg.Capture.Next(r.episode, r.launch) - 1
			}
			r.nums[k]++
			c.episode, c.launch, c.n = r.episode, r.launch, r.nums[k]
			c.id, _ = trajectory.CallID(c.episode, c.launch, c.n)
		}
		// The record's request side needs the request alone: split it
		// while the upstream answers, off the reply's way to the harness.
		c.prep = prepare(c.uri, body)
	}
	return c
}

// upstreamBody sets what c sends upstream when that is not its body:
// with Config.Translate, a Messages or a Responses call as a chat
// completion (translate.go; a body that is no request of its API goes as
// it came); with Config.Tokens and a capture, a chat completion asking
// for token ids and logprobs (capture.go). It reads c.body and c.api, and
// the relay's configuration alone.
func (r *Relay) upstreamBody(c *call) {
	c.upBody, c.upURI, c.via, c.augmented, c.asked = nil, "", "", false, asked{}
	if r.cfg.Translate && (c.api == trajectory.APIMessages || c.api == trajectory.APIResponses) {
		if up, err := translateRequest(c.api, c.body); err != nil {
			r.log.Warn().Err(err).Str("path", c.uri).Msg("model call not translated")
		} else {
			c.upBody, c.upURI, c.via = up, translatePath, trajectory.APIChat
		}
	}
	if r.cfg.Capture != nil && r.cfg.Tokens && (c.api == trajectory.APIChat || c.via == trajectory.APIChat) {
		// The token fields are chat completions': a Messages or a
		// Responses call goes as it came unless translated
		// (docs/TRAJECTORIES.md).
		src := c.body
		if c.upBody != nil {
			src = c.upBody
		}
		up, a := augment(src)
		if up != nil {
			c.upBody, c.augmented = up, c.via == ""
		}
		if c.via == "" {
			c.asked = a
		}
	}
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
		r.freeLocked(len(c.body) + len(c.upBody) + len(c.base))
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
