package bridge_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// TestMetrics: a bridge with a Set counts what it does and serves it on
// the API's /metrics without the token, beside /readyz: a committed
// checkpoint and one aborted on a blocker show their phase durations,
// outcomes by reason and acks by member kind and result.
func TestMetrics(t *testing.T) {
	env := jstest.Start(t)
	hs := fleet(t, env, 2, 1)
	set := metrics.New()
	b := startBridge(t, env, bridge.Config{Metrics: set})
	srv := httptest.NewServer(b.Handler(testToken))
	defer srv.Close()

	if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1"}); err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c1: %+v %v", res, err)
	}
	poll.Wait(t, 10*time.Second, "every member to reopen admission", func() bool { return allOpen(hs) })
	hs[1].Participant.Block(events.Episode{Rollout: "t1-r0"})
	if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c2", TimeoutMS: 1000}); err != nil || res.Status != bridgeapi.StatusFailed {
		t.Fatalf("c2: %+v %v", res, err)
	}

	var f metrics.Families
	poll.Wait(t, 15*time.Second, "the resume acks of both checkpoints to be timed", func() bool {
		var err error
		f, err = metrics.Scrape(t.Context(), srv.URL+metrics.PathMetrics)
		if err != nil {
			t.Fatal(err)
		}
		return f.Sum("stillpoint_phase_duration_seconds", map[string]string{"phase": "resume"}) >= 2
	})
	// A scrape reads the families one after the other, not at one
	// instant: the one that saw the second resume timed may have read the
	// acks before its gathering counted them. The bridge counts a resume's
	// acks before it times the resume, so a scrape begun after that one
	// sees them all.
	f, err := metrics.Scrape(t.Context(), srv.URL+metrics.PathMetrics)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		match map[string]string
		want  float64
	}{
		{"stillpoint_phase_duration_seconds", map[string]string{"phase": "prepare"}, 2},
		{"stillpoint_phase_duration_seconds", map[string]string{"phase": "commit"}, 1},
		{"stillpoint_outcomes_total", map[string]string{"outcome": "checkpoint.committed", "reason": "none"}, 1},
		{"stillpoint_outcomes_total", map[string]string{"outcome": "checkpoint.failed", "reason": "not_ready"}, 1},
		{"stillpoint_acks_total", map[string]string{"phase": "prepare", "result": "ok"}, 3},
		{"stillpoint_acks_total", map[string]string{"phase": "prepare", "result": "not_ready"}, 1},
		{"stillpoint_acks_total", map[string]string{"phase": "commit", "result": "ok"}, 2},
		{"stillpoint_acks_total", map[string]string{"phase": "resume", "result": "ok"}, 4},
	} {
		if got := f.Sum(c.name, c.match); got < c.want {
			t.Errorf("%s%v = %v, want at least %v", c.name, c.match, got, c.want)
		}
	}
	if f.Series("stillpoint_relay_held_calls_total") != 1 {
		t.Errorf("no relay held calls series")
	}

	resp, err := http.Get(srv.URL + metrics.PathReady)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("readyz: %s", resp.Status)
	}
}
