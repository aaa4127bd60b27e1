package relay_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/sandboxd/relay"
)

// Whatever a harness sends, the relay answers it once: a body under the
// limit, JSON or not, goes upstream and comes back as the upstream
// answered, a larger one is a relay error with its code; every request is
// one call, recorded once, and none stays open.
func FuzzRelayRequest(f *testing.F) {
	for _, s := range []string{`{"model":"m","messages":[]}`, `{"stream":true}`, ``, `{`, `[1,2]`, `null`,
		strings.Repeat("a", 5000), "{\"x\":\"\xff\"}"} {
		f.Add(s, "/v1/chat/completions")
	}
	f.Add(`{}`, "/v1/models?x=1")
	f.Add(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"stream":true}`, "/v1/messages?beta=true")
	f.Add(`{"model":"m","input":[{"type":"message","role":"user","content":"x"}]}`, "/v1/responses")
	f.Add(`not json`, "/v1/responses")
	up := newUpstream(f, echo)
	drained := make(chan struct{})
	stopDrain := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			select {
			case <-up.got:
			case <-stopDrain:
				return
			}
		}
	}()
	rl, err := relay.New(relay.Config{Upstream: up.URL, MaxRequestBytes: 4096, Logger: zerolog.Nop()})
	if err != nil {
		f.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rl.Serve(ctx, ln) }()
	f.Cleanup(func() {
		cancel()
		<-done
		close(stopDrain)
		<-drained
	})
	base := "http://" + ln.Addr().String()
	f.Fuzz(func(t *testing.T, body, path string) {
		if !strings.HasPrefix(path, "/") || strings.ContainsAny(path, " \r\n#") {
			return
		}
		before := rl.Status().Calls.Total
		resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
		if err != nil {
			return // a path net/http itself refuses to send
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch {
		case len(body) > 4096:
			if resp.StatusCode != 413 {
				t.Fatalf("%d bytes: %d %s", len(body), resp.StatusCode, got)
			}
		default:
			if resp.StatusCode != 200 || !bytes.HasPrefix(got, []byte(`{"echo":`)) {
				t.Fatalf("JSON %q: %d %s", body, resp.StatusCode, got)
			}
		}
		st := rl.Status()
		if st.Calls.Total != before+1 || len(st.Open) != 0 {
			t.Fatalf("after one request: %+v", st)
		}
	})
}
