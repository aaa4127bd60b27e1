package relay

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"hash"
	"net/http"
	"time"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

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
				switch {
				case a != nil && a.unsent:
					c.resends++
					r.counts.Resent++
					r.log.Info().Uint64("call", c.seq).Str("digest", c.digest).Int("dials", c.redials).
						AnErr("last", a.err).Msg("the upstream was unreachable: dialing it again")
				case a != nil:
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
				if status == 0 && (a.ended || len(a.buf) > 0 || a.shape == nil || !a.shape.holdsStatus()) {
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
		var redial *time.Timer // the next dial of an unreachable upstream
		if a != nil && a.unsent && a.cut && !r.holding {
			redial = time.NewTimer(time.Until(a.notBefore))
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
		var redialC <-chan time.Time
		if redial != nil {
			redialC = redial.C
		}
		select {
		case <-c.wake:
		case <-redialC:
		case <-ctx.Done():
			r.fail(c, "relay: harness gone")
			return
		case <-r.stopping:
			r.fail(c, "relay: stopping")
			return
		}
		if redial != nil {
			redial.Stop()
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
		return !r.holding && !time.Now().Before(a.notBefore)
	}
	return false
}
