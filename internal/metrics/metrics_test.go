package metrics_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

func TestMain(m *testing.M) { leak.VerifyTestMain(m, jstest.LeakOptions()...) }

// A nil Set takes every observation and does nothing: components call
// their hooks unconditionally.
func TestNilSetIsOff(t *testing.T) {
	var s *metrics.Set
	s.InitBridge()
	s.InitAgent("x")
	s.InitCollector()
	s.PhaseDone("prepare", time.Second)
	s.Outcome("checkpoint.committed", "")
	s.Ack("prepare", "agent", metrics.AckOK)
	s.RelayHeld(3)
	s.Paused("freeze", time.Millisecond)
	s.Fallback(metrics.FallbackNoAck)
	s.Rebind("resumed_in_place")
	s.Snapshot("overlay", time.Second, 10)
	s.Fork("overlay", time.Second, 10)
	s.Result(metrics.ResultOK)
	s.Continued(metrics.Relaunched)
	if s.Registry() != nil {
		t.Fatal("a nil Set has a registry")
	}
}

// Two Sets in one process are independent: each has its own registry, and
// neither touches the default one.
func TestSetsDoNotCollide(t *testing.T) {
	a, b := metrics.New(), metrics.New()
	a.Outcome("checkpoint.failed", "deadline_exceeded")
	a.Outcome("checkpoint.failed", "deadline_exceeded")
	b.Outcome("checkpoint.committed", "")
	fa, fb := gather(t, a), gather(t, b)
	if v := value(fa, "stillpoint_outcomes_total", map[string]string{"outcome": "checkpoint.failed", "reason": "deadline_exceeded"}); v != 2 {
		t.Fatalf("a: failed/deadline_exceeded = %v, want 2", v)
	}
	if _, ok := fb["stillpoint_outcomes_total"]; !ok {
		t.Fatal("b has no outcomes")
	}
	if v := value(fb, "stillpoint_outcomes_total", map[string]string{"outcome": "checkpoint.committed", "reason": "none"}); v != 1 {
		t.Fatalf("b: committed/none = %v, want 1", v)
	}
	if v := value(fb, "stillpoint_outcomes_total", map[string]string{"outcome": "checkpoint.failed", "reason": "deadline_exceeded"}); v != 0 {
		t.Fatalf("b sees a's observation: %v", v)
	}
}

// Every observation lands in its family with its labels; the Init calls
// show the closed label sets at zero.
func TestObservations(t *testing.T) {
	s := metrics.New()
	s.InitBridge()
	s.InitAgent("resumed_in_place", "relay_gone")
	s.InitCollector()
	s.PhaseDone("prepare", 1500*time.Millisecond)
	s.Ack("prepare", "sandbox", metrics.AckNotReady)
	s.RelayHeld(2)
	s.RelayHeld(0)
	s.Paused("freeze", 20*time.Millisecond)
	s.Paused("stop", -1)
	s.Fallback(metrics.FallbackNoAck)
	s.Rebind("relay_gone")
	s.Snapshot("overlay", 2*time.Second, 4096)
	s.Fork("overlay", time.Second, 4096)
	s.Result(metrics.ResultOK)
	s.Continued(metrics.ContinuedInPlace)
	f := gather(t, s)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"stillpoint_acks_total", map[string]string{"phase": "prepare", "kind": "sandbox", "result": "not_ready"}, 1},
		{"stillpoint_relay_held_calls_total", nil, 2},
		{"stillpoint_pauses_total", map[string]string{"mode": "freeze"}, 1},
		{"stillpoint_pauses_total", map[string]string{"mode": "stop"}, 1},
		{"stillpoint_pauses_total", map[string]string{"mode": "hold"}, 0},
		{"stillpoint_relaunch_fallbacks_total", map[string]string{"reason": metrics.FallbackNoAck}, 1},
		{"stillpoint_relaunch_fallbacks_total", map[string]string{"reason": metrics.FallbackNoPause}, 0},
		{"stillpoint_rebinds_total", map[string]string{"outcome": "relay_gone"}, 1},
		{"stillpoint_rebinds_total", map[string]string{"outcome": "resumed_in_place"}, 0},
		{"stillpoint_rollout_results_total", map[string]string{"result": "ok"}, 1},
		{"stillpoint_rollout_results_total", map[string]string{"result": "failed"}, 0},
		{"stillpoint_continuations_total", map[string]string{"how": "in_place"}, 1},
		{"stillpoint_continuations_total", map[string]string{"how": "relaunched"}, 0},
		// Histograms: the sample count.
		{"stillpoint_phase_duration_seconds", map[string]string{"phase": "prepare"}, 1},
		{"stillpoint_pause_duration_seconds", map[string]string{"mode": "freeze"}, 1},
		{"stillpoint_snapshot_duration_seconds", map[string]string{"provider": "overlay"}, 1},
		{"stillpoint_snapshot_bytes", map[string]string{"provider": "overlay"}, 1},
		{"stillpoint_fork_duration_seconds", map[string]string{"provider": "overlay"}, 1},
		{"stillpoint_fork_bytes", map[string]string{"provider": "overlay"}, 1},
	} {
		if got := value(f, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if v := value(f, "stillpoint_pause_duration_seconds", map[string]string{"mode": "stop"}); v != 0 {
		t.Errorf("a pause of unknown length was observed: %v", v)
	}
	if probs, err := testutil.GatherAndLint(s.Registry()); err != nil || len(probs) > 0 {
		t.Errorf("lint: %v %v", probs, err)
	}
}

// The server answers /metrics in the text format, /healthz always, and
// /readyz with 503 until the connection to a real server is up and the
// consumer it names exists, then 200.
func TestHandlerAndProbes(t *testing.T) {
	env := jstest.Start(t)
	s := metrics.New()
	s.Outcome("checkpoint.committed", "")
	const name = "probe-consumer"
	ready := metrics.All(metrics.Connected(env.Conn), metrics.StreamAnswers(env.Bus.Stream), metrics.ConsumerLive(env.Bus.Stream, name))

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	served := make(chan error, 1)
	go func() { served <- metrics.Serve(ctx, ln, metrics.Handler(s, ready)) }()
	defer func() {
		cancel()
		if err := <-served; err != nil {
			t.Errorf("Serve: %v", err)
		}
	}()
	base := "http://" + ln.Addr().String()

	if code, _ := get(t, base+metrics.PathHealth); code != http.StatusOK {
		t.Fatalf("healthz: %d", code)
	}
	code, body := get(t, base+metrics.PathReady)
	if code != http.StatusServiceUnavailable || !strings.Contains(body, name) {
		t.Fatalf("readyz without the consumer: %d %q, want 503 naming it", code, body)
	}
	if _, err := env.Bus.Stream.CreateConsumer(t.Context(), natsjs.ConsumerConfig{Durable: name, AckPolicy: natsjs.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, base+metrics.PathReady); code != http.StatusOK {
		t.Fatalf("readyz with the consumer: %d %q", code, body)
	}
	code, body = get(t, base+metrics.PathMetrics)
	if code != http.StatusOK {
		t.Fatalf("metrics: %d", code)
	}
	fams, err := parse(strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if v := value(fams, "stillpoint_outcomes_total", map[string]string{"outcome": "checkpoint.committed", "reason": "none"}); v != 1 {
		t.Fatalf("scraped committed = %v, want 1", v)
	}
	if _, ok := fams["go_goroutines"]; !ok {
		t.Fatal("no Go runtime metrics")
	}

	// A closed connection is not ready.
	env.Conn.Close()
	if code, body := get(t, base+metrics.PathReady); code != http.StatusServiceUnavailable || !strings.Contains(body, "NATS") {
		t.Fatalf("readyz after close: %d %q", code, body)
	}
	if err := metrics.Closed("joined", make(chan struct{}))(t.Context()); !errors.Is(err, metrics.ErrNotReady) {
		t.Fatalf("Closed on an open channel: %v", err)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func gather(t *testing.T, s *metrics.Set) map[string]*dto.MetricFamily {
	t.Helper()
	fs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]*dto.MetricFamily{}
	for _, f := range fs {
		out[f.GetName()] = f
	}
	return out
}

func parse(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(r)
}

// value is a counter's value, or a histogram's sample count, of the
// series with exactly these labels; 0 when there is none.
func value(fams map[string]*dto.MetricFamily, name string, labels map[string]string) float64 {
	f, ok := fams[name]
	if !ok {
		return 0
	}
next:
	for _, m := range f.GetMetric() {
		if len(m.GetLabel()) != len(labels) {
			continue
		}
		for _, l := range m.GetLabel() {
			if labels[l.GetName()] != l.GetValue() {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue()
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount())
		case m.Gauge != nil:
			return m.GetGauge().GetValue()
		}
	}
	return 0
}
