package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Namespace prefixes every family of the project.
const Namespace = "stillpoint"

// ReasonNone is the reason label of an outcome that names none (a commit).
// The outcome label is the outcome event's noun ("checkpoint.committed",
// "checkpoint.failed", "restore.completed", ...); the reason a code: the
// first failing member's error code ("missing_ack", "deadline_exceeded",
// ...), "not_ready" for blockers, or "bridge" for a failure of the
// bridge's own.
const ReasonNone = "none"

// The results of stillpoint_acks_total: the ack said ok and ready, ok but
// not ready (a prepare with blockers), or failed.
const (
	AckOK       = "ok"
	AckNotReady = "not_ready"
	AckError    = "error"
)

// The reasons of stillpoint_relaunch_fallbacks_total: why an agent stopped
// a launch at a checkpoint, for a relaunch after it, instead of keeping it
// paused in place.
const (
	FallbackNoPause      = "adapter_no_pause"  // the adapter never pauses (--no-pause)
	FallbackNoAck        = "no_pause_ack"      // the sandbox did not ack the prepare by the deadline
	FallbackNotConfirmed = "pause_unconfirmed" // it acked, not ok or not ready
	FallbackStatus       = "status_failed"     // the launch's status after the pause could not be read
	FallbackNotStill     = "held_not_still"    // held without a relay: its files may change
	FallbackState        = "unexpected_state"  // the launch was in another state after the ack
)

// Fallbacks lists every FallbackXxx reason.
var Fallbacks = []string{FallbackNoPause, FallbackNoAck, FallbackNotConfirmed, FallbackStatus, FallbackNotStill, FallbackState}

// PauseModes are the pause modes of stillpoint_pauses_total (sandboxapi.Mode's names).
var PauseModes = []string{"freeze", "stop", "hold"}

// The hows of stillpoint_continuations_total: a result whose launch a
// checkpoint paused and that went on in place, or one that relaunched on a
// saved session.
const (
	ContinuedInPlace = "in_place"
	Relaunched       = "relaunched"
)

// The results of stillpoint_rollout_results_total.
const (
	ResultOK     = "ok"
	ResultFailed = "failed"
	// ResultInfraFailed: no result of the rollout, which the
	// infrastructure failed every attempt it was given.
	ResultInfraFailed = "infra_failed"
)

// Set is one process's metric families, on a registry of its own (with the
// Go runtime's and the process's collectors). Its methods are safe for
// concurrent use, and no-ops on a nil *Set.
type Set struct {
	reg *prometheus.Registry

	phaseDuration *prometheus.HistogramVec
	outcomes      *prometheus.CounterVec
	acks          *prometheus.CounterVec
	relayHeld     *prometheus.CounterVec

	pauses        *prometheus.CounterVec
	pauseDuration *prometheus.HistogramVec
	fallbacks     *prometheus.CounterVec
	rebinds       *prometheus.CounterVec

	snapshotDuration *prometheus.HistogramVec
	snapshotBytes    *prometheus.HistogramVec
	forkDuration     *prometheus.HistogramVec
	forkBytes        *prometheus.HistogramVec

	results       *prometheus.CounterVec
	continuations *prometheus.CounterVec
}

// Buckets of the histograms: phases and pauses from milliseconds to
// minutes; snapshots from a kilobyte to tens of gigabytes.
var (
	durationBuckets = prometheus.ExponentialBucketsRange(0.001, 300, 16)
	byteBuckets     = prometheus.ExponentialBuckets(1024, 4, 13)
)

// New returns a Set with every family registered and nothing observed.
func New() *Set {
	s := &Set{reg: prometheus.NewRegistry()}
	hist := func(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
		v := prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: buckets}, labels)
		s.reg.MustRegister(v)
		return v
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help}, labels)
		s.reg.MustRegister(v)
		return v
	}
	s.phaseDuration = hist("phase_duration_seconds", "Time from a phase's publish to the bridge's decision on its acks (resume: until every resume ack).", durationBuckets, "phase")
	s.outcomes = counter("outcomes_total", "Outcome events the bridge published, by outcome and reason code.", "outcome", "reason")
	s.acks = counter("acks_total", "Acks the bridge read, by phase, member kind and result.", "phase", "kind", "result")
	s.relayHeld = counter("relay_held_calls_total", "Model calls sandbox relays held during checkpoints, from the daemons' resume acks.")
	s.pauses = counter("pauses_total", "Launches an agent parked paused in place at a checkpoint, by pause mode.", "mode")
	s.pauseDuration = hist("pause_duration_seconds", "How long the sandbox daemon took to pause a launch, by mode.", durationBuckets, "mode")
	s.fallbacks = counter("relaunch_fallbacks_total", "Launches an agent stopped at a checkpoint for a relaunch instead of a pause, by reason.", "reason")
	s.rebinds = counter("rebinds_total", "Restored held launches an agent took over in place or abandoned, by outcome.", "outcome")
	s.snapshotDuration = hist("snapshot_duration_seconds", "Time the owner's provider took for one sandbox snapshot.", durationBuckets, "provider")
	s.snapshotBytes = hist("snapshot_bytes", "Bytes of file data one snapshot copied.", byteBuckets, "provider")
	s.forkDuration = hist("fork_duration_seconds", "Time the owner's provider took to fork one snapshot into a sandbox at a restore.", durationBuckets, "provider")
	s.forkBytes = hist("fork_bytes", "Bytes of the snapshot a fork started from (its size when taken; 0 when not known).", byteBuckets, "provider")
	s.results = counter("rollout_results_total", "Results the collector wrote, by result.", "result")
	s.continuations = counter("continuations_total", "Results whose launch went on in place after a checkpoint paused it, or relaunched on a saved session.", "how")
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return s
}

// Registry returns the Set's registry (for a test, or to add a collector).
func (s *Set) Registry() *prometheus.Registry {
	if s == nil {
		return nil
	}
	return s.reg
}

// InitBridge shows the bridge's families with zero samples before the
// first event: the relay's held calls.
func (s *Set) InitBridge() {
	if s == nil {
		return
	}
	s.relayHeld.WithLabelValues()
}

// InitAgent shows the agent's families of closed label sets with zero
// samples: pauses by mode, fallbacks by reason, and the rebind outcomes
// given.
func (s *Set) InitAgent(rebindOutcomes ...string) {
	if s == nil {
		return
	}
	for _, m := range PauseModes {
		s.pauses.WithLabelValues(m)
	}
	for _, r := range Fallbacks {
		s.fallbacks.WithLabelValues(r)
	}
	for _, o := range rebindOutcomes {
		s.rebinds.WithLabelValues(o)
	}
}

// InitCollector shows the collector's families with zero samples.
func (s *Set) InitCollector() {
	if s == nil {
		return
	}
	s.results.WithLabelValues(ResultOK)
	s.results.WithLabelValues(ResultFailed)
	s.results.WithLabelValues(ResultInfraFailed)
	s.continuations.WithLabelValues(ContinuedInPlace)
	s.continuations.WithLabelValues(Relaunched)
}

// PhaseDone observes how long phase took, from its publish to the
// bridge's decision.
func (s *Set) PhaseDone(phase string, d time.Duration) {
	if s == nil {
		return
	}
	s.phaseDuration.WithLabelValues(phase).Observe(d.Seconds())
}

// Outcome counts an outcome event; reason "" is ReasonNone.
func (s *Set) Outcome(outcome, reason string) {
	if s == nil {
		return
	}
	if reason == "" {
		reason = ReasonNone
	}
	s.outcomes.WithLabelValues(outcome, reason).Inc()
}

// Ack counts an ack read: its phase, the member's kind, AckOK, AckNotReady
// or AckError.
func (s *Set) Ack(phase, kind, result string) {
	if s == nil {
		return
	}
	s.acks.WithLabelValues(phase, kind, result).Inc()
}

// RelayHeld adds n model calls a sandbox's relay held during a checkpoint.
func (s *Set) RelayHeld(n int) {
	if s == nil || n <= 0 {
		return
	}
	s.relayHeld.WithLabelValues().Add(float64(n))
}

// Paused counts a launch parked paused in place, and how long its pause
// took (took < 0: not known, only counted).
func (s *Set) Paused(mode string, took time.Duration) {
	if s == nil {
		return
	}
	s.pauses.WithLabelValues(mode).Inc()
	if took >= 0 {
		s.pauseDuration.WithLabelValues(mode).Observe(took.Seconds())
	}
}

// Fallback counts a launch stopped for a relaunch at a checkpoint; reason
// is one of Fallbacks.
func (s *Set) Fallback(reason string) {
	if s == nil {
		return
	}
	s.fallbacks.WithLabelValues(reason).Inc()
}

// Rebind counts what became of a restored held launch (agentapi's
// Rebind outcomes).
func (s *Set) Rebind(outcome string) {
	if s == nil {
		return
	}
	s.rebinds.WithLabelValues(outcome).Inc()
}

// Snapshot observes one snapshot: how long it took and the bytes it
// copied.
func (s *Set) Snapshot(provider string, took time.Duration, bytes int64) {
	if s == nil {
		return
	}
	s.snapshotDuration.WithLabelValues(provider).Observe(took.Seconds())
	s.snapshotBytes.WithLabelValues(provider).Observe(float64(max(bytes, 0)))
}

// Fork observes one fork at a restore: how long it took and the size of
// the snapshot it started from.
func (s *Set) Fork(provider string, took time.Duration, bytes int64) {
	if s == nil {
		return
	}
	s.forkDuration.WithLabelValues(provider).Observe(took.Seconds())
	s.forkBytes.WithLabelValues(provider).Observe(float64(max(bytes, 0)))
}

// Result counts a result the collector wrote: ResultOK, ResultFailed or
// ResultInfraFailed.
func (s *Set) Result(result string) {
	if s == nil {
		return
	}
	s.results.WithLabelValues(result).Inc()
}

// Continued counts a result that continued: ContinuedInPlace or Relaunched.
func (s *Set) Continued(how string) {
	if s == nil {
		return
	}
	s.continuations.WithLabelValues(how).Inc()
}
