package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/collect/tasks"
	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/scripted"
)

// benchShape is the shape of BenchmarkCheckpoint64LiveRollouts.
type benchShape struct {
	rollouts, agents, rounds int
	// toolSeconds is how long each rollout's mid-tool runs: long enough
	// that every rollout is still in it after the last of the rounds (the
	// benchmark checks it), short enough to wait out at the end so that
	// every rollout finishes and closes its own sandbox.
	toolSeconds float64
}

// benchShapeOf returns the benchmark's shape: 64 rollouts through 10
// rounds, or under -short (make test) 4 through 2.
func benchShapeOf() benchShape {
	return tier.Pick(benchShape{rollouts: 64, agents: 2, rounds: 10, toolSeconds: 120},
		benchShape{rollouts: 4, agents: 2, rounds: 2, toolSeconds: 20})
}

// BenchmarkCheckpoint64LiveRollouts measures a checkpoint of 64 live
// rollouts end to end: the bridge in this process, an owner (overlay
// sandboxes) and two agents as stillpoint processes, 64 sandboxes each
// running sandboxd and the scripted harness, every harness in the middle
// of a tool call (under -short, make test: 4 rollouts, 2 rounds,
// benchShapeOf). It takes 10 checkpoints in a row and reports the p50 and
// p90 of prepare and commit (the bridge's CheckpointResult.PrepareMS and
// CommitMS), resume (the resume phase's stream time to the last resume
// ack, as the bridge's record says) and total (the prepare's stream time
// to the last resume ack); the table it prints adds the max, each member
// class's last ack and longest reported handling, and the owner's
// snapshots. The baseline, taken first in the same process and fleet, is
// as many checkpoints with nothing in flight (no sandboxes); the *-ratio
// metrics are live p50 over baseline p50.
//
// Each run takes its fixed rounds whatever b.N is: use -benchtime 1x. A
// run takes minutes, most of it waiting for the tools to end, and needs
// root (overlay sandboxes, cgroups).
func BenchmarkCheckpoint64LiveRollouts(b *testing.B) {
	shape := benchShapeOf()
	if b.N > 1 {
		b.Fatalf("each run takes a fixed %d checkpoints of a fresh fleet: run with -benchtime 1x", shape.rounds)
	}
	load := benchLoadavg()
	f := startBenchFleet(b, shape)
	ctx, cancel := context.WithTimeout(b.Context(), 15*time.Minute)
	defer cancel()

	base := make([]benchSample, 0, shape.rounds)
	for i := range shape.rounds {
		s, res := f.checkpoint(ctx, fmt.Sprintf("idle-%d", i+1))
		if len(res.Continued) != 0 || len(res.Members) != 1+shape.agents {
			b.Fatalf("idle checkpoint continued %v with members %v: the fleet is not idle", res.Continued, res.Members)
		}
		base = append(base, s)
	}
	f.release(ctx, 2)

	var outs []<-chan outcome
	dispatched := time.Now()
	for i := range shape.rollouts {
		outs = append(outs, f.dispatch(ctx, i, 0))
	}
	// The replies of three model calls: setup, one step, and the
	// computing call, whose tool (sleep shape.toolSeconds) every harness
	// now runs.
	f.waitCallsWithin(shape.rollouts, 3, 3*time.Minute)
	spread := time.Since(dispatched)

	live := make([]benchSample, 0, shape.rounds)
	liveStart := time.Now()
	for i := range shape.rounds {
		id := fmt.Sprintf("live-%d", i+1)
		s, res := f.checkpoint(ctx, id)
		if len(res.Continued) != shape.rollouts || len(res.Restarted) != 0 {
			b.Fatalf("%s continued %d, restarted %v; want all %d continued", id, len(res.Continued), res.Restarted, shape.rollouts)
		}
		if n := s.members; n != 1+shape.agents+shape.rollouts {
			b.Fatalf("%s had %d members, want the owner, %d agents and %d sandbox daemons", id, n, shape.agents, shape.rollouts)
		}
		f.checkMidTool(ctx, id)
		live = append(live, s)
		f.release(ctx, 2)
	}
	rounds := time.Since(liveStart)
	load += " to " + benchLoadavg()

	// Every rollout finishes on its own (its session closed, its sandbox
	// stopped by the owner) with the one launch it started, paused in
	// place by each checkpoint: the checkpoints caught what they claim.
	for i, ch := range outs {
		var o outcome
		select {
		case o = <-ch:
		case <-ctx.Done():
			b.Fatalf("%s did not return: %v", tasks.ID(i), ctx.Err())
		}
		if o.err != nil {
			b.Fatalf("%s: %v", tasks.ID(i), o.err)
		}
		var v scripted.Verdict
		if err := json.Unmarshal(o.res.Verdict, &v); err != nil || v.Reward != 1 {
			b.Fatalf("%s: verdict %s", tasks.ID(i), o.res.Verdict)
		}
		l := o.res.Launches
		if len(l) != 1 || l[0].Pauses != shape.rounds || l[0].Ended != agentapi.LaunchFinished {
			b.Fatalf("%s: launch log %+v, want one finished launch paused %d times", tasks.ID(i), l, shape.rounds)
		}
	}
	if r := f.ms.Repeats(); len(r) != 0 {
		b.Fatalf("repeated model calls: %v", r)
	}
	f.release(ctx, 0)

	benchReport(b, base, live, fmt.Sprintf("%d live rollouts, all in their %.0f s tool %.1f s after dispatch; %d checkpoints in %.1f s; load average %s",
		shape.rollouts, shape.toolSeconds, spread.Seconds(), shape.rounds, rounds.Seconds(), load))
}

// benchSample is one checkpoint's times.
type benchSample struct {
	// prepare and commit are the bridge's; call is the Checkpoint call's
	// wall time (prepare publish to resume publish, from here).
	prepare, commit, call time.Duration
	// resume is the resume phase's stream time to its last ack's; total
	// the prepare phase's stream time to the last resume ack's.
	resume, total time.Duration
	// last is, per phase and member class (owner, agent, sandbox), the
	// time from the phase's publish to the class's last ack, and took
	// the longest handling time (TookMS) a member of the class reported.
	last, took map[string]time.Duration
	members    int
	commitAt   time.Time
	// snaps is what the owner's snapshots of the checkpoint say about
	// themselves (read from the provider's meta.json files).
	snaps benchSnapStats
}

// benchSnapStats sums up the owner's snapshots of one checkpoint. took is a
// snapshot's own time (freeze, copy of the upper layer, thaw); the span
// runs from the first snapshot's start to the last one's end, and start
// and tail place it in the commit phase: from the commit's publish to the
// first snapshot's start, and from the last snapshot's end to the owner's
// commit ack (indexing, records, manifest, ack).
type benchSnapStats struct {
	n                      int
	bytes                  int64
	tookP50, tookMax       time.Duration
	start, span, ownerTail time.Duration
}

func benchMS(n int64) time.Duration { return time.Duration(n) * time.Millisecond }

// checkpoint takes checkpoint id and waits until every member acked its
// resume, so that checkpoints do not overlap a previous resume.
func (f *benchFleet) checkpoint(ctx context.Context, id string) (benchSample, *bridgeapi.CheckpointResult) {
	f.t.Helper()
	start := time.Now()
	res, err := f.br.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: id})
	call := time.Since(start)
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		if res != nil && res.Failure != nil {
			f.t.Fatalf("checkpoint %s: %+v", id, *res.Failure)
		}
		f.t.Fatalf("checkpoint %s: %+v %v", id, res, err)
	}
	s := f.timesOf(ctx, id)
	s.prepare, s.commit, s.call = benchMS(res.PrepareMS), benchMS(res.CommitMS), call
	s.snaps = f.snapStatsOf(id, s)
	return s, res
}

// snapStatsOf reads the meta.json of each of checkpoint id's snapshots in
// the owner's overlay store (best effort: a layout it does not know
// gives zeros).
func (f *benchFleet) snapStatsOf(id string, s benchSample) benchSnapStats {
	type meta struct {
		Size    int64         `json:"size"`
		Took    time.Duration `json:"took"`
		Created time.Time     `json:"created"`
	}
	paths, _ := filepath.Glob(filepath.Join(f.state, "owner", "provider", "snapshots", id+"-*", "meta.json"))
	var st benchSnapStats
	var took []time.Duration
	var first, last time.Time
	for _, p := range paths {
		b, err := os.ReadFile(p)
		var m meta
		if err != nil || json.Unmarshal(b, &m) != nil {
			continue
		}
		st.n++
		st.bytes += m.Size
		took = append(took, m.Took)
		if begin := m.Created.Add(-m.Took); first.IsZero() || begin.Before(first) {
			first = begin
		}
		if m.Created.After(last) {
			last = m.Created
		}
	}
	if st.n == 0 {
		return st
	}
	st.tookP50, st.tookMax = benchQuantile(took, 0.5), slices.Max(took)
	st.span = last.Sub(first)
	if !s.commitAt.IsZero() {
		st.start = first.Sub(s.commitAt)
		st.ownerTail = s.commitAt.Add(s.last["commit/owner"]).Sub(last)
	}
	return st
}

// timesOf reads checkpoint id's events back from the stream, waiting
// until every member of its resume has acked.
func (f *benchFleet) timesOf(ctx context.Context, id string) benchSample {
	f.t.Helper()
	var (
		s       benchSample
		missing []events.Member
		done    bool
	)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	// Each look reads the run's whole timeline: every 100 ms.
	err := poll.Until(wctx, poll.Every(100*time.Millisecond), func() (bool, error) {
		tl, err := timeline.Read(ctx, f.env.JS, f.run, id)
		if err != nil {
			return false, err
		}
		s, missing, done = benchSampleOf(tl)
		return done, nil
	})
	if err != nil {
		f.t.Fatalf("checkpoint %s: no record of its resume's acks after a minute: %v", id, err)
	}
	if len(missing) > 0 {
		f.t.Fatalf("checkpoint %s: the bridge heard no good resume ack from %v", id, missing)
	}
	return s
}

// benchSampleOf computes a checkpoint's times from its timeline once it
// holds the bridge's record of the resume's acks (done), and the members
// that record says did not answer. Resume acks travel on core NATS
// (PROTOCOL §3): the record (ResumeAcked) says who answered and how late
// the last one came.
func benchSampleOf(tl []timeline.Entry) (s benchSample, missing []events.Member, done bool) {
	s = benchSample{last: map[string]time.Duration{}, took: map[string]time.Duration{}}
	phases := map[events.Phase]timeline.Entry{}
	seqs := map[uint64]events.Phase{}
	for _, e := range tl {
		if p, ok := e.Data.(events.PhaseEvent); ok {
			phases[p.Phase()] = e
			seqs[p.Header().Seq] = p.Phase()
		}
	}
	res, ok := phases[events.PhaseResume]
	if !ok {
		return s, nil, false
	}
	var resumed *events.ResumeAcked
	for _, e := range tl {
		if rec, ok := e.Data.(events.ResumeAcked); ok && rec.Seq == res.Data.(events.PhaseEvent).Header().Seq {
			resumed = &rec
			continue
		}
		if rec, ok := e.Data.(events.PrepareAcked); ok {
			// The sandbox daemons' prepare acks travel on core NATS: the
			// bridge's record says how late the last one came.
			k := string(events.PhasePrepare) + "/" + string(events.KindSandbox)
			s.last[k] = max(s.last[k], time.Duration(rec.MaxMS*float64(time.Millisecond)))
			continue
		}
		a, ok := e.Data.(events.Ack)
		if !ok {
			continue
		}
		h := a.Header()
		p, ok := seqs[h.Seq]
		if !ok || p != a.Answers() {
			continue
		}
		class, _, _ := strings.Cut(string(h.Member), ".")
		k := string(p) + "/" + class
		s.last[k] = max(s.last[k], e.Time.Sub(phases[p].Time))
		s.took[k] = max(s.took[k], benchMS(h.TookMS))
	}
	if resumed == nil {
		return s, nil, false
	}
	s.members = resumed.Expected
	if c, ok := phases[events.PhaseCommit]; ok {
		s.commitAt = c.Time
	}
	last := time.Duration(resumed.MaxMS * float64(time.Millisecond))
	s.resume = last
	s.total = res.Time.Add(last).Sub(phases[events.PhasePrepare].Time)
	if resumed.Answered == resumed.Expected && resumed.ErrorCount == 0 {
		return s, nil, true
	}
	missing = resumed.Missing
	for _, e := range resumed.Errors {
		missing = append(missing, events.Member(fmt.Sprintf("%s (an error: %s)", e.Member, e.Code)))
	}
	if len(missing) == 0 {
		missing = []events.Member{events.Member(fmt.Sprintf("(%d missing, %d errors of %d)", resumed.MissingCount, resumed.ErrorCount, resumed.Expected))}
	}
	return s, missing, true
}

// checkMidTool checks that the agents exported every rollout at its
// harness bookmark with resume set: paused in place, mid-tool.
func (f *benchFleet) checkMidTool(ctx context.Context, checkpoint string) {
	f.t.Helper()
	n := 0
	for _, a := range f.agents {
		_, recs, err := member.ReadRecords(ctx, f.env.Bus, f.run, checkpoint, events.Member("agent."+a), nil)
		if err != nil {
			f.t.Fatalf("records of agent.%s in %s: %v", a, checkpoint, err)
		}
		for _, r := range recs {
			bm, err := agentapi.DecodeBookmark(r.Data)
			if err != nil {
				f.t.Fatalf("record %s: %v", r.Key, err)
			}
			if bm.Next != agentapi.StageLaunch || !bm.Resume || len(bm.Launches) != 1 {
				f.t.Fatalf("%s: %s exported at %s resume %v launches %+v: not paused mid-tool", checkpoint, r.Key, bm.Next, bm.Resume, bm.Launches)
			}
			n++
		}
	}
	if n != f.shape.rollouts {
		f.t.Fatalf("%s: %d rollouts exported, want %d", checkpoint, n, f.shape.rollouts)
	}
}

// release keeps the newest keep checkpoints (none: the final release).
func (f *benchFleet) release(ctx context.Context, keep int) {
	f.t.Helper()
	if r, err := f.br.Release(ctx, bridgeapi.ReleaseRequest{KeepLatest: keep}); err != nil || r.Status != bridgeapi.StatusCompleted {
		f.t.Fatalf("release keeping %d: %+v %v", keep, r, err)
	}
}

// benchQuantile returns the q-quantile of ds by nearest rank (of 10: p50 is
// the 5th, p90 the 9th).
func benchQuantile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[max(int(math.Ceil(q*float64(len(s))))-1, 0)]
}

// benchLoadavg returns the 1-minute load average, the machine's other work.
func benchLoadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

func benchMSF(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// benchReport reports the p50s, p90s and ratios as metrics and prints
// the whole picture: p50/p90/max per phase, live and baseline, and where the time
// of each phase went per member class.
func benchReport(b *testing.B, base, live []benchSample, head string) {
	col := func(ss []benchSample, f func(benchSample) time.Duration) []time.Duration {
		out := make([]time.Duration, len(ss))
		for i, s := range ss {
			out[i] = f(s)
		}
		return out
	}
	type row struct {
		name string
		get  func(benchSample) time.Duration
	}
	rows := []row{
		{"prepare", func(s benchSample) time.Duration { return s.prepare }},
		{"commit", func(s benchSample) time.Duration { return s.commit }},
		{"resume", func(s benchSample) time.Duration { return s.resume }},
		{"total", func(s benchSample) time.Duration { return s.total }},
		{"call", func(s benchSample) time.Duration { return s.call }},
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%s\nms, p50 / p90 / max\n", head)
	fmt.Fprintf(&sb, "%-8s %-24s %-24s %s\n", "phase", "live", "baseline (idle)", "ratio p50")
	for _, r := range rows {
		l, bl := col(live, r.get), col(base, r.get)
		lp, bp := benchQuantile(l, 0.5), benchQuantile(bl, 0.5)
		ratio := math.NaN()
		if bp > 0 {
			ratio = float64(lp) / float64(bp)
		}
		fmt.Fprintf(&sb, "%-8s %-24s %-24s %.1f\n", r.name,
			fmt.Sprintf("%.0f / %.0f / %.0f", benchMSF(lp), benchMSF(benchQuantile(l, 0.9)), benchMSF(slices.Max(l))),
			fmt.Sprintf("%.0f / %.0f / %.0f", benchMSF(bp), benchMSF(benchQuantile(bl, 0.9)), benchMSF(slices.Max(bl))), ratio)
		if r.name == "call" {
			continue
		}
		b.ReportMetric(benchMSF(lp), r.name+"-p50-ms")
		b.ReportMetric(benchMSF(benchQuantile(l, 0.9)), r.name+"-p90-ms")
		b.ReportMetric(benchMSF(bp), "base-"+r.name+"-p50-ms")
		if bp > 0 {
			b.ReportMetric(ratio, r.name+"-ratio")
		}
	}
	fmt.Fprintf(&sb, "where the time went (live, p50 over the checkpoints): phase publish to the class's last ack; longest took_ms in the class\n")
	for _, p := range []events.Phase{events.PhasePrepare, events.PhaseCommit} {
		for _, class := range []string{"owner", "agent", "sandbox"} {
			k := string(p) + "/" + class
			fmt.Fprintf(&sb, "  %-16s last ack %6.0f   took %6.0f\n", k,
				benchMSF(benchQuantile(col(live, func(s benchSample) time.Duration { return s.last[k] }), 0.5)),
				benchMSF(benchQuantile(col(live, func(s benchSample) time.Duration { return s.took[k] }), 0.5)))
		}
	}
	fmt.Fprintf(&sb, "each live checkpoint, ms: prepare commit resume total | last ack of prepare: sandbox agent | of commit: owner (took) sandbox agent\n")
	fmt.Fprintf(&sb, "  | owner's snapshots: count, MB, took p50/max; commit publish to first snapshot start, span of all, last snapshot end to owner ack\n")
	for i, s := range live {
		n := s.snaps
		fmt.Fprintf(&sb, "  live-%-2d %5.0f %5.0f %5.0f %5.0f | %5.0f %5.0f | %5.0f (%5.0f) %5.0f %5.0f | %2d %5.0f %4.0f/%4.0f %4.0f %5.0f %4.0f\n", i+1,
			benchMSF(s.prepare), benchMSF(s.commit), benchMSF(s.resume), benchMSF(s.total),
			benchMSF(s.last["prepare/sandbox"]), benchMSF(s.last["prepare/agent"]),
			benchMSF(s.last["commit/owner"]), benchMSF(s.took["commit/owner"]), benchMSF(s.last["commit/sandbox"]), benchMSF(s.last["commit/agent"]),
			n.n, float64(n.bytes)/1e6, benchMSF(n.tookP50), benchMSF(n.tookMax), benchMSF(n.start), benchMSF(n.span), benchMSF(n.ownerTail))
	}
	// The testing package keeps 10 lines of a benchmark's log: the table
	// goes to stdout.
	fmt.Printf("\n--- %s\n%s", b.Name(), sb.String())
	// One op is a whole run (a fleet and twice its rounds of checkpoints):
	// ns/op would mislead.
	b.ReportMetric(0, "ns/op")
}

// benchFleet is the e2e fleet (startFleet) with the benchmark's own
// readings.
type benchFleet struct {
	*fleet
	shape benchShape
}

func startBenchFleet(tb testing.TB, sh benchShape) *benchFleet {
	tb.Helper()
	return &benchFleet{startFleet(tb, fleetOptions{n: sh.rollouts, agents: sh.agents, concurrency: sh.rollouts, toolSeconds: sh.toolSeconds, steps: 1}), sh}
}
