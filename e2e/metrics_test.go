package e2e

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/internal/tier"
)

// nodeRole is the node's part of a process's name (agent-a1, owner-o2).
var nodeRole = regexp.MustCompile(`-[ao][0-9]+$`)

// TestMetricsWhileADemoRuns runs `stillpoint demo` (every component its
// own process but the collector, the crash and the restore included) and
// scrapes the collector's, the bridge's, and every node's owner's and agent's
// /metrics, /healthz and /readyz while the collection runs, as Prometheus
// would. Once it ended, every family of docs/OPERATIONS.md was seen with
// samples on the process that owns it, and the ones this run must move
// (phases, outcomes, acks, pauses, snapshots, forks, results, both kinds
// of continuation) had counted something.
func TestMetricsWhileADemoRuns(t *testing.T) {
	tier.E2E(t)
	parallel(t, 1, 25*time.Second)
	b := buildBins(t)
	p := child.StartForTest(t, child.Spec{Name: "demo", Path: b.stillpoint, Dir: "..",
		Args: []string{"demo", "--dir", t.TempDir()}})
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	m, err := p.WaitOutput(ctx, regexp.MustCompile(`demo: metrics: (.+)`))
	if err != nil {
		t.Fatalf("the demo did not say where its metrics are: %v", err)
	}
	targets := map[string]string{} // process → its /metrics URL
	for _, tgt := range strings.Split(m[1], ", ") {
		name, url, ok := strings.Cut(tgt, " ")
		if !ok {
			t.Fatalf("target %q", tgt)
		}
		targets[name] = url
	}
	for _, n := range []string{"collector", "bridge", "owner-o1", "owner-o2", "agent-a1", "agent-a2"} {
		if targets[n] == "" {
			t.Fatalf("no metrics target for %s in %q", n, m[1])
		}
	}

	// Scrape every target every 200 ms until the demo ends. A process
	// killed and started again starts its counters over (as Prometheus
	// sees it too): what is kept is the most each series showed.
	var (
		mu      sync.Mutex
		most    = map[string]map[string]float64{} // role → "family{k=v,...}" or family → the highest sum seen
		healthy = map[string]bool{}
		ready   = map[string]bool{}
		scrapes = map[string]int{}
	)
	keep := func(role, key string, v float64) {
		if most[role] == nil {
			most[role] = map[string]float64{}
		}
		most[role][key] = max(most[role][key], v)
	}
	scrape := func(role, url string) {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		f, err := metrics.Scrape(sctx, url)
		if err != nil {
			return // not up yet, or between a kill and its restart
		}
		base := strings.TrimSuffix(url, metrics.PathMetrics)
		h, r := status(sctx, base+metrics.PathHealth), status(sctx, base+metrics.PathReady)
		mu.Lock()
		defer mu.Unlock()
		scrapes[role]++
		healthy[role] = healthy[role] || h == http.StatusOK
		ready[role] = ready[role] || r == http.StatusOK
		role = nodeRole.ReplaceAllString(role, "") // a node's agent and owner: agent, owner
		for name, fam := range f {
			if !strings.HasPrefix(name, metrics.Namespace+"_") {
				continue
			}
			keep(role, name+"#series", float64(len(fam.GetMetric())))
			keep(role, name, f.Sum(name, nil))
			var sum float64
			for _, s := range fam.GetMetric() {
				sum += s.GetHistogram().GetSampleSum()
			}
			keep(role, name+"#sum", sum)
			for _, s := range fam.GetMetric() {
				var kv []string
				for _, l := range s.GetLabel() {
					kv = append(kv, l.GetName()+"="+l.GetValue())
				}
				labels := map[string]string{}
				for _, l := range s.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				keep(role, name+"{"+strings.Join(kv, ",")+"}", f.Sum(name, labels))
			}
		}
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
scraping:
	for {
		select {
		case <-p.Exited():
			break scraping
		case <-ctx.Done():
			t.Fatalf("the demo did not end in time")
		case <-tick.C:
		}
		var wg sync.WaitGroup
		for role, url := range targets {
			wg.Go(func() { scrape(role, url) })
		}
		wg.Wait()
	}
	exit, err := p.Wait(ctx)
	if err != nil || !exit.Success() {
		t.Fatalf("demo: %v %v (its output is below)", exit, err)
	}
	if !strings.Contains(p.Output(), "invariants ok") {
		t.Fatalf("the demo's invariants did not hold (its output is below)")
	}

	mu.Lock()
	defer mu.Unlock()
	for role := range targets {
		if scrapes[role] == 0 || !healthy[role] || !ready[role] {
			t.Errorf("%s: %d scrapes, healthz ok %v, readyz ok %v", role, scrapes[role], healthy[role], ready[role])
		}
	}
	t.Logf("scrapes: %v", scrapes)
	// Every family has samples on the process that owns it.
	families := map[string][]string{
		"bridge": {"stillpoint_phase_duration_seconds", "stillpoint_outcomes_total", "stillpoint_acks_total", "stillpoint_relay_held_calls_total"},
		"agent": {"stillpoint_pauses_total", "stillpoint_pause_duration_seconds", "stillpoint_relaunch_fallbacks_total",
			"stillpoint_rebinds_total"},
		"owner":     {"stillpoint_snapshot_duration_seconds", "stillpoint_snapshot_bytes", "stillpoint_fork_duration_seconds", "stillpoint_fork_bytes"},
		"collector": {"stillpoint_rollout_results_total", "stillpoint_continuations_total"},
	}
	for role, fams := range families {
		for _, f := range fams {
			if most[role][f+"#series"] == 0 {
				t.Errorf("%s: family %s has no samples", role, f)
			}
		}
	}
	// What this run moves: three checkpoints committed through prepare,
	// commit and resume, a restore; launches paused in place; snapshots
	// at each commit, forks at the restore; every result, some continued
	// in place, some relaunched on a saved session.
	for _, c := range []struct{ role, series string }{
		{"bridge", "stillpoint_phase_duration_seconds{phase=prepare}"},
		{"bridge", "stillpoint_phase_duration_seconds{phase=commit}"},
		{"bridge", "stillpoint_phase_duration_seconds{phase=resume}"},
		{"bridge", "stillpoint_phase_duration_seconds{phase=restore}"},
		{"bridge", "stillpoint_outcomes_total{outcome=checkpoint.committed,reason=none}"},
		{"bridge", "stillpoint_outcomes_total{outcome=restore.completed,reason=none}"},
		{"bridge", "stillpoint_acks_total{kind=agent,phase=prepare,result=ok}"},
		{"bridge", "stillpoint_acks_total{kind=owner,phase=commit,result=ok}"},
		{"bridge", "stillpoint_acks_total{kind=sandbox,phase=prepare,result=ok}"},
		{"agent", "stillpoint_pauses_total"},
		{"agent", "stillpoint_pause_duration_seconds"},
		{"owner", "stillpoint_snapshot_duration_seconds"},
		{"owner", "stillpoint_snapshot_bytes"},
		{"owner", "stillpoint_fork_duration_seconds"},
		{"owner", "stillpoint_fork_bytes"},
		{"owner", "stillpoint_snapshot_bytes#sum"},
		{"owner", "stillpoint_fork_bytes#sum"},
		{"collector", "stillpoint_rollout_results_total{result=ok}"},
		{"collector", "stillpoint_continuations_total{how=in_place}"},
		{"collector", "stillpoint_continuations_total{how=relaunched}"},
	} {
		if most[c.role][c.series] == 0 {
			t.Errorf("%s: %s never counted anything", c.role, c.series)
		}
	}
	if t.Failed() {
		for role, kv := range most {
			t.Logf("%s: %v", role, kv)
		}
	}
}

// status is the HTTP status of a GET of url, 0 when it failed.
func status(ctx context.Context, url string) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
