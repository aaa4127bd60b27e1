package sandboxd

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/sandboxd/relay"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// BenchmarkRelay measures what the model relay (package sandboxd/relay)
// adds to one model call on loopback, and what its capture adds on top:
// each iteration makes the same call straight to a model server, through
// the relay, and through a relay that captures (token ids asked for,
// each call appended and fsync'd to a capture file in the benchmark's
// temporary directory), in turn, over kept-alive connections; the report
// gives the p50 and p99 of each and their differences. The model server
// answers at once: a 300-byte JSON reply, or a stream of 16 SSE events;
// asked for tokens, with 24 prompt ids, an id and a logprob per token.
//
//	go test -run '^$' -bench Relay -benchtime 2000x ./sandboxd/
func BenchmarkRelay(b *testing.B) {
	const prompt = `"prompt_token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24]`
	lp := `"logprobs":{"content":[{"token":"tok","logprob":-0.25,"bytes":[116,111,107],"top_logprobs":[]}]}`
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		tokens := strings.Contains(string(body), `"return_token_ids":true`)
		if !strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			extra, choice := "", ""
			if tokens {
				ids := strings.TrimSuffix(strings.Repeat("300,", 16), ",")
				lps := strings.TrimSuffix(strings.Repeat(`{"token":"x","logprob":-0.5,"bytes":[120],"top_logprobs":[]},`, 16), ",")
				extra, choice = prompt+",", `,"token_ids":[`+ids+`],"logprobs":{"content":[`+lps+`]}`
			}
			_, _ = io.WriteString(w, `{`+extra+`"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"`+
				strings.Repeat("x", 200)+`"},"finish_reason":"stop"`+choice+`}]}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fl := w.(http.Flusher)
		for i := range 16 {
			extra, choice := "", ""
			if tokens {
				choice = `,"token_ids":[300],` + lp
				if i == 0 {
					extra = prompt + ","
				}
			}
			finish := "null"
			if i == 15 {
				finish = `"stop"`
			}
			_, _ = io.WriteString(w, `data: {`+extra+`"choices":[{"index":0,"delta":{"content":"tok"},"finish_reason":`+finish+choice+`}]}`+"\n\n")
			fl.Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	}))
	defer model.Close()
	serve := func(rl *relay.Relay) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- rl.Serve(ctx, ln) }()
		b.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				b.Errorf("relay: %v", err)
			}
		})
		return "http://" + ln.Addr().String()
	}
	rl, err := relay.New(relay.Config{Upstream: model.URL, Logger: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	relayURL := serve(rl)
	rec, err := trajectory.OpenRecorder(filepath.Join(b.TempDir(), trajectory.FileName))
	if err != nil {
		b.Fatal(err)
	}
	defer rec.Close()
	cl, err := relay.New(relay.Config{Upstream: model.URL, Capture: rec, Tokens: true, Logger: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	if err := cl.Label("bench", "l1", nil); err != nil {
		b.Fatal(err)
	}
	captureURL := serve(cl)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4, DisableCompression: true}}
	defer client.CloseIdleConnections()
	msgs := `"messages":[{"role":"user","content":"` + strings.Repeat("y", 1000) + `"}]`
	call := func(base string, stream bool) time.Duration {
		body := `{"model":"m",` + msgs + fmt.Sprintf(`,"stream":%v}`, stream)
		start := time.Now()
		resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
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
			call(model.URL, stream) // warm the connections
			call(relayURL, stream)
			call(captureURL, stream)
			direct, relayed, captured := make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N), make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				direct = append(direct, call(model.URL, stream))
				relayed = append(relayed, call(relayURL, stream))
				captured = append(captured, call(captureURL, stream))
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
			b.ReportMetric(pct(captured, 0.5), "capture-p50-µs")
			b.ReportMetric(pct(captured, 0.5)-pct(relayed, 0.5), "capture-added-p50-µs")
			b.ReportMetric(pct(captured, 0.99)-pct(relayed, 0.99), "capture-added-p99-µs")
			b.ReportMetric(0, "ns/op")
		})
	}
	if st := rl.Status(); st.Calls.Failed != 0 || len(st.Open) != 0 {
		b.Fatalf("relay status after the benchmark: %+v", st)
	}
	if st := cl.Status(); st.Calls.Failed != 0 || len(st.Open) != 0 || st.Capture.Errors != 0 || int(st.Capture.Recorded) != st.Capture.Calls {
		b.Fatalf("capturing relay status after the benchmark: %+v %+v", st, st.Capture)
	}
	for _, c := range rec.Calls() {
		if !c.Tokens || len(c.CompletionIDs) != 16 || len(c.AllPromptIDs) != 24 {
			b.Fatalf("call %s captured without its tokens: %+v", c.ID, c.Call)
		}
	}
}
