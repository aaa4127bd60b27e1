package sandboxd

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/sandboxd/relay"
)

// BenchmarkRelay measures what the model relay (package sandboxd/relay)
// adds to one model call on loopback: each iteration makes the same call
// once straight to a model server and once through the relay, alternating,
// both over kept-alive connections, and the report gives the p50 and p99
// of each and their difference. The model server answers at once: a
// 300-byte JSON reply, or a stream of 16 SSE events.
//
//	go test -run '^$' -bench Relay -benchtime 2000x ./sandboxd/
func BenchmarkRelay(b *testing.B) {
	event := `data: {"choices":[{"delta":{"content":"tok"}}]}` + "\n\n"
	reply := `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"` +
		strings.Repeat("x", 200) + `"},"finish_reason":"stop"}]}`
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Query().Get("stream") == "" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, reply)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for range 16 {
			_, _ = io.WriteString(w, event)
			fl.Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer model.Close()
	rl, err := relay.New(relay.Config{Upstream: model.URL, Logger: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rl.Serve(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("relay: %v", err)
		}
	}()
	relayURL := "http://" + ln.Addr().String()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
	defer client.CloseIdleConnections()
	body := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("y", 1000) + `"}]}`
	call := func(base, query string) time.Duration {
		start := time.Now()
		resp, err := client.Post(base+"/v1/chat/completions"+query, "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || n == 0 {
			b.Fatalf("call: %d, %d bytes, %v", resp.StatusCode, n, err)
		}
		return time.Since(start)
	}
	for _, stream := range []bool{false, true} {
		b.Run(fmt.Sprintf("stream=%v", stream), func(b *testing.B) {
			query := ""
			if stream {
				query = "?stream=1"
			}
			call(model.URL, query) // warm both connections
			call(relayURL, query)
			direct, relayed := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				direct = append(direct, call(model.URL, query))
				relayed = append(relayed, call(relayURL, query))
			}
			b.StopTimer()
			pct := func(d []time.Duration, p float64) float64 {
				s := slices.Clone(d)
				slices.Sort(s)
				return float64(s[min(len(s)-1, int(p*float64(len(s))))].Microseconds())
			}
			b.ReportMetric(pct(direct, 0.5), "direct-p50-µs")
			b.ReportMetric(pct(relayed, 0.5), "relay-p50-µs")
			b.ReportMetric(pct(relayed, 0.5)-pct(direct, 0.5), "added-p50-µs")
			b.ReportMetric(pct(relayed, 0.99)-pct(direct, 0.99), "added-p99-µs")
			b.ReportMetric(0, "ns/op")
		})
	}
	if st := rl.Status(); st.Calls.Failed != 0 || len(st.Open) != 0 {
		b.Fatalf("relay status after the benchmark: %+v", st)
	}
}
