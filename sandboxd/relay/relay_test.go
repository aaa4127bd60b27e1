package relay_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

func TestMain(m *testing.M) { leak.VerifyTestMain(m) }

// upstream is a model server of the test's: it records every request and
// answers with what answer says.
type upstream struct {
	*httptest.Server
	mu     sync.Mutex
	bodies []string
	got    chan string
}

func newUpstream(t testing.TB, answer func(w http.ResponseWriter, r *http.Request, body []byte)) *upstream {
	t.Helper()
	u := &upstream{got: make(chan string, 16)}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.bodies = append(u.bodies, string(b))
		u.mu.Unlock()
		u.got <- string(b)
		answer(w, r, b)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) count() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.bodies)
}

func echo(w http.ResponseWriter, _ *http.Request, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"echo":%s}`, body)
}

// startRelay serves a relay on a loopback port until the test ends.
func startRelay(t *testing.T, up string) *relay.Relay {
	t.Helper()
	return serveRelay(t, relay.Config{Upstream: up})
}

// serveRelay serves a relay of cfg (its logs the test's) on a loopback
// port until the test ends.
func serveRelay(t *testing.T, cfg relay.Config) *relay.Relay {
	t.Helper()
	cfg.Logger = zerolog.New(zerolog.NewTestWriter(t))
	r, err := relay.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln) }()
	poll.Wait(t, 5*time.Second, "the relay serving", func() bool { return r.URL() != "" })
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return r
}

type reply struct {
	status int
	body   string
	err    error
}

// post sends body to the relay's path in a goroutine; the reply comes on
// the channel.
func post(t *testing.T, r *relay.Relay, path, body string) <-chan reply {
	t.Helper()
	ch := make(chan reply, 1)
	url := r.URL() + path
	go func() {
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			ch <- reply{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		ch <- reply{status: resp.StatusCode, body: string(b), err: err}
	}()
	return ch
}

func wait(t *testing.T, ch <-chan reply) reply {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no reply in 10 s")
	}
	return reply{}
}

func noReply(t *testing.T, ch <-chan reply) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("the harness got a reply while the relay holds: %+v", r)
	default:
	}
}

// noReplyFor checks that no reply comes on ch for d.
func noReplyFor(t *testing.T, ch <-chan reply, d time.Duration) {
	t.Helper()
	poll.Holds(t, d, func() error {
		select {
		case r := <-ch:
			return fmt.Errorf("the harness got a reply while the relay holds: %+v", r)
		default:
			return nil
		}
	})
}

func openState(r *relay.Relay, state sandboxapi.CallState) bool {
	st := r.Status()
	return len(st.Open) == 1 && st.Open[0].State == state
}

// Calls pass through byte for byte, streaming or not, and each is recorded
// once.
func TestRelayForwards(t *testing.T) {
	events := []string{"data: {\"n\":1}\n\n", "data: {\"n\":2}\n\n", "data: [DONE]\n\n"}
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if !bytes.Contains(body, []byte(`"stream":true`)) {
			echo(w, r, body)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for _, e := range events {
			_, _ = io.WriteString(w, e)
			w.(http.Flusher).Flush()
		}
	})
	r := startRelay(t, up.URL)
	got := wait(t, post(t, r, "/v1/chat/completions", `{"model":"m","messages":[]}`))
	if got.err != nil || got.status != 200 || got.body != `{"echo":{"model":"m","messages":[]}}` {
		t.Fatalf("plain call: %+v", got)
	}
	got = wait(t, post(t, r, "/v1/chat/completions", `{"stream":true}`))
	if got.err != nil || got.status != 200 || got.body != strings.Join(events, "") {
		t.Fatalf("streamed call: %+v", got)
	}
	st := r.Status()
	if st.Calls.Total != 2 || st.Calls.Delivered != 2 || len(st.Open) != 0 || !st.Up || st.Generation != 0 {
		t.Fatalf("status %+v", st)
	}
}

// A hold keeps a new call from going upstream and the reply of a call in
// flight from reaching the harness; the release lets both through.
func TestRelayHoldAndRelease(t *testing.T) {
	gate := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		if bytes.Contains(body, []byte("slow")) {
			<-gate
		}
		echo(w, r, body)
	})
	r := startRelay(t, up.URL)
	inflight := post(t, r, "/v1/chat/completions", `{"q":"slow"}`)
	<-up.got // upstream has it
	r.Hold()
	held := post(t, r, "/v1/chat/completions", `{"q":"new"}`)
	poll.Wait(t, 5*time.Second, "the new call held", func() bool { return r.Status().Calls.Held == 1 })
	close(gate)
	poll.Wait(t, 5*time.Second, "the reply in flight ended upstream", func() bool {
		for _, c := range r.Status().Open {
			if c.State == sandboxapi.CallReplied {
				return true
			}
		}
		return false
	})
	noReply(t, inflight)
	noReply(t, held)
	if n := up.count(); n != 1 {
		t.Fatalf("upstream saw %d calls while the relay holds, want 1", n)
	}
	r.Release()
	if g := wait(t, inflight); g.body != `{"echo":{"q":"slow"}}` {
		t.Fatalf("call in flight: %+v", g)
	}
	if g := wait(t, held); g.body != `{"echo":{"q":"new"}}` {
		t.Fatalf("held call: %+v", g)
	}
	if n := up.count(); n != 2 {
		t.Fatalf("upstream saw %d calls, want 2 (none twice)", n)
	}
}

// After a restore, a re-point cuts the call the snapshot caught in flight,
// and the release sends it to the new upstream, the same bytes, once; the
// old upstream never answers it. A held call goes to the new upstream at
// the release too.
func TestRelayRepointResendsTheCutCall(t *testing.T) {
	old := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		<-r.Context().Done() // a model server that is gone
	})
	fresh := newUpstream(t, echo)
	r := startRelay(t, old.URL)
	cutBody := `{"messages":[{"role":"user","content":"cut"}]}`
	cut := post(t, r, "/v1/chat/completions", cutBody)
	if got := <-old.got; got != cutBody {
		t.Fatalf("old upstream got %q", got)
	}
	r.Hold()
	held := post(t, r, "/v1/chat/completions", `{"q":"held"}`)
	poll.Wait(t, 5*time.Second, "the new call held", func() bool { return r.Status().Calls.Held == 1 })
	st, err := r.Repoint(fresh.URL, 1)
	if err != nil || st.Generation != 1 || st.Upstream != fresh.URL {
		t.Fatalf("Repoint: %+v, %v", st, err)
	}
	poll.Wait(t, 5*time.Second, "the cut attempt stopped", func() bool {
		st := r.Status()
		return len(st.Open) == 2 && st.Open[0].Generation == 0
	})
	if n := fresh.count(); n != 0 {
		t.Fatalf("the new upstream got %d calls while the relay holds", n)
	}
	noReply(t, cut)
	r.Release()
	if got := <-fresh.got; got != cutBody && got != `{"q":"held"}` {
		t.Fatalf("new upstream got %q", got)
	}
	if g := wait(t, cut); g.body != `{"echo":`+cutBody+`}` {
		t.Fatalf("cut call: %+v", g)
	}
	if g := wait(t, held); g.body != `{"echo":{"q":"held"}}` {
		t.Fatalf("held call: %+v", g)
	}
	if o, f := old.count(), fresh.count(); o != 1 || f != 2 {
		t.Fatalf("old upstream saw %d calls, new %d: want 1 and 2", o, f)
	}
	st = r.Status()
	if st.Calls.Resent != 1 || st.Calls.Delivered != 2 || st.Calls.Total != 2 || len(st.Open) != 0 {
		t.Fatalf("status %+v", st)
	}
}

// A call whose upstream connection breaks while the relay holds (the old
// VM's forward is gone) waits, the harness told nothing, and is sent
// again once the relay is released: to the same upstream when no re-point
// came (a re-point is not what makes it a re-send).
func TestRelayResendsACallBrokenWhileHeld(t *testing.T) {
	breakNow := make(chan struct{})
	var mu sync.Mutex
	n := 0
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request, body []byte) {
		mu.Lock()
		n++
		first := n == 1
		mu.Unlock()
		if !first {
			echo(w, r, body)
			return
		}
		<-breakNow
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = conn.Close()
		}
	})
	r := startRelay(t, up.URL)
	cut := post(t, r, "/v1/chat/completions", `{"q":"x"}`)
	<-up.got
	r.Hold()
	close(breakNow)
	poll.Wait(t, 5*time.Second, "the attempt's error recorded", func() bool {
		st := r.Status()
		return len(st.Open) == 1 && st.Open[0].State == sandboxapi.CallForwarding && st.Open[0].AttemptError != ""
	})
	noReplyFor(t, cut, 300*time.Millisecond)
	r.Release()
	if got := <-up.got; got != `{"q":"x"}` {
		t.Fatalf("the re-send sent %q", got)
	}
	if g := wait(t, cut); g.status != 200 || g.body != `{"echo":{"q":"x"}}` {
		t.Fatalf("cut call: %+v", g)
	}
	if st := r.Status(); st.Calls.Resent != 1 || st.Calls.Delivered != 1 || st.Generation != 0 {
		t.Fatalf("status %+v: want one re-send, to generation 0", st)
	}
}

// A re-point accepts only a higher generation, and a well-formed URL.
func TestRelayRepointGenerations(t *testing.T) {
	r := startRelay(t, "")
	if _, err := r.Repoint("http://127.0.0.1:1", 2); err != nil {
		t.Fatal(err)
	}
	for _, gen := range []uint64{0, 1, 2} {
		if _, err := r.Repoint("http://127.0.0.1:2", gen); !errors.Is(err, relay.ErrStaleGeneration) {
			t.Errorf("Repoint(gen %d) after 2 = %v, want ErrStaleGeneration", gen, err)
		}
	}
	for _, bad := range []string{"", "127.0.0.1:1", "ftp://x", "http://h/p?q=1", "http://"} {
		if _, err := r.Repoint(bad, 9); !errors.Is(err, relay.ErrBadUpstream) {
			t.Errorf("Repoint(%q) = %v, want ErrBadUpstream", bad, err)
		}
	}
	if st := r.Status(); st.Generation != 2 || st.Upstream != "http://127.0.0.1:1" {
		t.Fatalf("status %+v", st)
	}
	if _, err := r.Repoint("http://127.0.0.1:3/", 3); err != nil || r.Upstream() != "http://127.0.0.1:3" {
		t.Fatalf("Repoint gen 3: %v, upstream %q", err, r.Upstream())
	}
}

// Bad input gets a clear error, and each such call is recorded once, as
// failed; a body that is not JSON is forwarded all the same (the upstream
// judges it); an upstream's own error status passes through.
func TestRelayRefusals(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		http.Error(w, `{"error":"overloaded"}`, http.StatusTooManyRequests)
	})
	rl, err := relay.New(relay.Config{Upstream: up.URL, MaxRequestBytes: 64, UnreachableFor: -1, Logger: zerolog.New(zerolog.NewTestWriter(t))})
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rl.Serve(ctx, ln) }()
	defer func() { cancel(); <-done }()
	poll.Wait(t, 5*time.Second, "the relay serving", func() bool { return rl.URL() != "" })

	cases := []struct {
		body   string
		status int
		code   string
	}{
		{strings.Repeat("x", 65), 413, "request_too_large"},
		{`{"messages": [`, 429, ""},
		{`{"ok":true}`, 429, ""},
	}
	for _, c := range cases {
		g := wait(t, post(t, rl, "/v1/chat/completions", c.body))
		if g.err != nil || g.status != c.status || c.code != "" && !strings.Contains(g.body, `"code":"`+c.code+`"`) {
			t.Errorf("body %.20q: %+v, want %d %s", c.body, g, c.status, c.code)
		}
	}
	if n := up.count(); n != 2 {
		t.Errorf("upstream saw %d calls, want the two under the limit", n)
	}
	// An upstream nobody listens on.
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadURL := "http://" + dead.Addr().String()
	_ = dead.Close()
	if _, err := rl.Repoint(deadURL, 1); err != nil {
		t.Fatal(err)
	}
	g := wait(t, post(t, rl, "/v1/chat/completions", `{}`))
	if g.status != 502 || !strings.Contains(g.body, "upstream_failed") || !strings.Contains(g.body, "unreachable") {
		t.Errorf("dead upstream: %+v", g)
	}
	st := rl.Status()
	if st.Calls.Total != 4 || st.Calls.Failed != 2 || st.Calls.Delivered != 2 || len(st.Open) != 0 {
		t.Fatalf("status %+v, want 4 calls: 2 failed once each, 2 delivered", st)
	}
}

// A relay with no upstream says so.
func TestRelayWithoutUpstream(t *testing.T) {
	r := startRelay(t, "")
	g := wait(t, post(t, r, "/v1/chat/completions", `{}`))
	if g.status != 503 || !strings.Contains(g.body, "no_upstream") {
		t.Fatalf("%+v", g)
	}
}

// A streamed reply partly delivered before the cut continues only if the
// re-sent reply starts with the same bytes; otherwise the harness's
// connection is cut, never spliced.
func TestRelayResendOfAPartlyDeliveredStream(t *testing.T) {
	for _, same := range []bool{true, false} {
		t.Run(fmt.Sprintf("same=%v", same), func(t *testing.T) {
			first := "data: {\"n\":1}\n\n"
			old := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
				w.Header().Set("Content-Type", "text/event-stream")
				_, _ = io.WriteString(w, first)
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			})
			fresh := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				w.Header().Set("Content-Type", "text/event-stream")
				if same {
					_, _ = io.WriteString(w, first)
				} else {
					_, _ = io.WriteString(w, "data: {\"n\":7}\n\n")
				}
				_, _ = io.WriteString(w, "data: [DONE]\n\n")
			})
			r := startRelay(t, old.URL)
			// Read the first event as the harness does, then hold.
			resp, err := http.Post(r.URL()+"/v1/chat/completions", "application/json", strings.NewReader(`{"stream":true}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			buf := make([]byte, len(first))
			if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != first {
				t.Fatalf("first event %q, %v", buf, err)
			}
			r.Hold()
			if _, err := r.Repoint(fresh.URL, 1); err != nil {
				t.Fatal(err)
			}
			r.Release()
			<-fresh.got
			rest, err := io.ReadAll(resp.Body)
			if same {
				if err != nil || string(rest) != "data: [DONE]\n\n" {
					t.Fatalf("rest %q, %v", rest, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("a diverging re-send was spliced: rest %q", rest)
			}
			poll.Wait(t, 5*time.Second, "the call failed", func() bool { return r.Status().Calls.Failed == 1 })
		})
	}
}

// A drop (the agent abandoned the held launch and launches anew) fails
// every call the hold kept, held or in flight, with call_abandoned; none
// reaches the new upstream, and calls after it flow.
func TestRelayDrop(t *testing.T) {
	old := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ []byte) { <-r.Context().Done() })
	fresh := newUpstream(t, echo)
	r := startRelay(t, old.URL)
	inflight := post(t, r, "/v1/chat/completions", `{"q":"in flight"}`)
	<-old.got
	r.Hold()
	held := post(t, r, "/v1/chat/completions", `{"q":"held"}`)
	poll.Wait(t, 5*time.Second, "the new call held", func() bool { return r.Status().Calls.Held == 1 })
	if _, err := r.Repoint(fresh.URL, 1); err != nil {
		t.Fatal(err)
	}
	r.Drop("launch abandoned")
	for _, ch := range []<-chan reply{inflight, held} {
		if g := wait(t, ch); g.status != 503 || !strings.Contains(g.body, "call_abandoned") {
			t.Errorf("dropped call: %+v", g)
		}
	}
	if g := wait(t, post(t, r, "/v1/chat/completions", `{"q":"next"}`)); g.body != `{"echo":{"q":"next"}}` {
		t.Fatalf("a call after the drop: %+v", g)
	}
	if n := fresh.count(); n != 1 {
		t.Fatalf("the new upstream saw %d calls, want only the one after the drop", n)
	}
	if st := r.Status(); st.Calls.Failed != 2 || st.Calls.Delivered != 1 || len(st.Open) != 0 || st.Holding {
		t.Fatalf("status %+v", st)
	}
}

// startRelayWith serves a relay of cfg (its logger the test's) until the
// test ends.
func startRelayWith(t *testing.T, cfg relay.Config) *relay.Relay {
	t.Helper()
	cfg.Logger = zerolog.New(zerolog.NewTestWriter(t))
	r, err := relay.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln) }()
	poll.Wait(t, 5*time.Second, "the relay serving", func() bool { return r.URL() != "" })
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return r
}

// The relay keeps at most Config.MaxOpenCalls calls open: one more is
// refused at once with 503 too_many_calls, counted as failed, and never
// reaches the upstream; once a call ends, a new one is taken.
func TestRelayLimitsOpenCalls(t *testing.T) {
	up := newUpstream(t, echo)
	r := startRelayWith(t, relay.Config{Upstream: up.URL, MaxOpenCalls: 2})
	r.Hold()
	a := post(t, r, "/v1/chat/completions", `{"q":1}`)
	b := post(t, r, "/v1/chat/completions", `{"q":2}`)
	poll.Wait(t, 5*time.Second, "two calls held", func() bool { return r.Status().Calls.Held == 2 })
	if g := wait(t, post(t, r, "/v1/chat/completions", `{"q":3}`)); g.status != 503 || !strings.Contains(g.body, `"code":"too_many_calls"`) {
		t.Fatalf("a third open call: %+v, want 503 too_many_calls", g)
	}
	r.Release()
	for _, ch := range []<-chan reply{a, b} {
		if g := wait(t, ch); g.status != 200 {
			t.Fatalf("held call: %+v", g)
		}
	}
	if g := wait(t, post(t, r, "/v1/chat/completions", `{"q":4}`)); g.status != 200 {
		t.Fatalf("a call once the others ended: %+v", g)
	}
	if st := r.Status(); st.Calls.Total != 4 || st.Calls.Failed != 1 || st.Calls.Delivered != 3 || up.count() != 3 || st.KeptBytes != 0 {
		t.Fatalf("status %+v, upstream saw %d: want 4 calls, 1 refused, 3 delivered, nothing kept", st, up.count())
	}
}

// The open calls keep at most Config.MaxOpenBytes: a request that would
// pass it is refused (503 too_many_calls, answered only at the release,
// as nothing reaches a harness during a hold); a reply larger than the
// budget is read while the relay holds only up to about the budget, and
// is delivered whole, byte for byte, once released, nothing kept after.
func TestRelayByteBudget(t *testing.T) {
	big := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, body []byte) {
		if string(body) == `{"q":"big"}` {
			_, _ = w.Write(big)
			return
		}
		echo(w, nil, body)
	})
	const budget = 256 << 10
	r := startRelayWith(t, relay.Config{Upstream: up.URL, MaxOpenBytes: budget})
	bigCall := post(t, r, "/v1/chat/completions", `{"q":"big"}`)
	<-up.got
	r.Hold()
	// The reply's reading stops near the budget while held.
	poll.Wait(t, 10*time.Second, "the big reply kept up to the budget", func() bool { return r.Status().KeptBytes >= budget })
	poll.Holds(t, 300*time.Millisecond, func() error {
		if k := r.Status().KeptBytes; k > budget+2*32<<10 {
			return fmt.Errorf("the open calls keep %d bytes while held, over the budget %d by more than a read", k, budget)
		}
		return nil
	})
	over := post(t, r, "/v1/chat/completions", `{"pad":"`+strings.Repeat("x", 64<<10)+`"}`)
	poll.Wait(t, 10*time.Second, "the call over the budget recorded", func() bool { return r.Status().Calls.Total == 2 })
	noReplyFor(t, over, 300*time.Millisecond)
	noReply(t, bigCall)
	r.Release()
	if g := wait(t, over); g.status != 503 || !strings.Contains(g.body, `"code":"too_many_calls"`) {
		t.Fatalf("a call over the byte budget: %+v", g)
	}
	if g := wait(t, bigCall); g.err != nil || g.status != 200 || g.body != string(big) {
		t.Fatalf("the big reply: status %d, %d bytes, %v; want 200 and the %d bytes as sent", g.status, len(g.body), g.err, len(big))
	}
	if st := r.Status(); st.KeptBytes != 0 || st.Calls.Delivered != 1 || st.Calls.Failed != 1 {
		t.Fatalf("status %+v: want nothing kept, one delivered, one refused", st)
	}
}

// A refusal that comes while the relay holds (a body over the limit) is
// answered at the release, not during the hold.
func TestRelayRefusalWaitsForTheRelease(t *testing.T) {
	r := startRelayWith(t, relay.Config{Upstream: "http://127.0.0.1:1", MaxRequestBytes: 8})
	r.Hold()
	bad := post(t, r, "/v1/chat/completions", `{"messages": []}`)
	poll.Wait(t, 5*time.Second, "the refused call recorded", func() bool { return r.Status().Calls.Total == 1 })
	noReplyFor(t, bad, 300*time.Millisecond)
	r.Release()
	if g := wait(t, bad); g.status != 413 || !strings.Contains(g.body, "request_too_large") {
		t.Fatalf("%+v", g)
	}
}

// A delivered prefix longer than one read (kept as its length and hash)
// is compared whole: a re-sent reply that matches it continues with only
// the rest, one that differs in its last byte is cut.
func TestRelayResendComparesALongDeliveredPrefix(t *testing.T) {
	prefix := bytes.Repeat([]byte("abcdefgh"), 100<<10/8) // 100 KiB
	for _, same := range []bool{true, false} {
		t.Run(fmt.Sprintf("same=%v", same), func(t *testing.T) {
			old := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
				_, _ = w.Write(prefix)
				w.(http.Flusher).Flush()
				<-r.Context().Done()
			})
			fresh := newUpstream(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
				p := bytes.Clone(prefix)
				if !same {
					p[len(p)-1] = 'X'
				}
				_, _ = w.Write(p)
				_, _ = io.WriteString(w, "tail")
			})
			r := startRelay(t, old.URL)
			resp, err := http.Post(r.URL()+"/v1/chat/completions", "application/json", strings.NewReader(`{}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			got := make([]byte, len(prefix))
			if _, err := io.ReadFull(resp.Body, got); err != nil || !bytes.Equal(got, prefix) {
				t.Fatalf("the first %d bytes: %v", len(prefix), err)
			}
			r.Hold()
			if _, err := r.Repoint(fresh.URL, 1); err != nil {
				t.Fatal(err)
			}
			r.Release()
			rest, err := io.ReadAll(resp.Body)
			if same {
				if err != nil || string(rest) != "tail" {
					t.Fatalf("rest %q, %v; want only the tail", rest, err)
				}
			} else if err == nil {
				t.Fatalf("a re-send differing in the prefix's last byte was spliced: rest %q", rest)
			}
			poll.Wait(t, 5*time.Second, "nothing kept", func() bool { st := r.Status(); return len(st.Open) == 0 && st.KeptBytes == 0 })
		})
	}
}

// An upstream that cannot be reached (nobody listens: the connection is
// refused) is dialed again while the harness waits, and the call is
// answered once the upstream listens; the upstream sees it once. Past
// Config.UnreachableFor the harness is told, 502.
func TestRelayDialsAnUnreachableUpstreamAgain(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	r := serveRelay(t, relay.Config{Upstream: "http://" + addr})
	got := post(t, r, "/v1/chat/completions", `{"n":1}`)
	poll.Wait(t, 10*time.Second, "the call dialed again", func() bool {
		st := r.Status()
		return len(st.Open) == 1 && st.Open[0].Resends >= 2
	})
	noReply(t, got)
	// The upstream comes up on the address the relay dials.
	ln, err = net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", addr, err)
	}
	up := &upstream{got: make(chan string, 16)}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		up.mu.Lock()
		up.bodies = append(up.bodies, string(b))
		up.mu.Unlock()
		echo(w, req, b)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	g := wait(t, got)
	if g.err != nil || g.status != http.StatusOK || g.body != `{"echo":{"n":1}}` {
		t.Fatalf("reply %+v", g)
	}
	if n := up.count(); n != 1 {
		t.Fatalf("the upstream saw the call %d times, want once", n)
	}
	st := r.Status()
	if st.Calls.Delivered != 1 || st.Calls.Failed != 0 {
		t.Fatalf("counts %+v, want one call delivered", st.Calls)
	}

	// Past UnreachableFor, the harness is told.
	_ = srv.Close()
	r2 := serveRelay(t, relay.Config{Upstream: "http://" + addr, UnreachableFor: 600 * time.Millisecond})
	g = wait(t, post(t, r2, "/v1/chat/completions", `{}`))
	if g.status != http.StatusBadGateway || !strings.Contains(g.body, "unreachable") {
		t.Fatalf("reply %+v, want 502 naming the unreachable upstream", g)
	}
	if st := r2.Status(); st.Calls.Failed != 1 || st.Calls.Resent < 1 {
		t.Fatalf("counts %+v, want the call dialed again, then failed once", st.Calls)
	}
}
