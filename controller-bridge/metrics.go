package bridge

import (
	"context"
	"net/http"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/metrics"
)

// Ready is the bridge's readiness (GET /readyz): connected to NATS and
// the run's stream answering. The bridge keeps no consumer between
// operations; each opens its own on the stream it checks.
func (b *Bridge) Ready(ctx context.Context) error {
	return metrics.All(metrics.Connected(b.cfg.Conn), metrics.StreamAnswers(b.cfg.Bus.Stream))(ctx)
}

// mountMetrics adds /metrics (when Config.Metrics is set) and /readyz to
// the API's mux; neither needs the bearer token, like /healthz.
func (b *Bridge) mountMetrics(mux *http.ServeMux) {
	if b.cfg.Metrics != nil {
		metrics.MountMetrics(mux, b.cfg.Metrics)
	}
	mux.HandleFunc("GET "+metrics.PathReady, metrics.ReadyHandler(b.Ready))
}

// countAck counts an ack read, and the model calls a sandbox's relay held
// when it is a daemon's resume ack.
func (b *Bridge) countAck(a events.Ack) {
	m := b.cfg.Metrics
	if m == nil {
		return
	}
	h := a.Header()
	res := metrics.AckOK
	switch a := a.(type) {
	case events.PrepareAck:
		if h.OK && !a.Ready {
			res = metrics.AckNotReady
		}
	case events.ResumeAck:
		if a.Pause != nil {
			m.RelayHeld(a.Pause.HeldCalls)
		}
	}
	if !h.OK {
		res = metrics.AckError
	}
	m.Ack(string(a.Answers()), string(h.Member.Kind()), res)
}

// countOutcome counts an outcome published.
func (b *Bridge) countOutcome(o events.Data) {
	b.cfg.Metrics.Outcome(o.Type().Noun(), outcomeReason(o))
}

// outcomeReason is the bounded reason code of an outcome: the first
// member's error code, "not_ready" for blockers, "bridge" for a failure
// with neither; ReasonNone for a success.
func outcomeReason(o events.Data) string {
	var errs []events.MemberError
	switch o := o.(type) {
	case events.CheckpointFailed:
		if len(o.Blockers) > 0 {
			return metrics.AckNotReady
		}
		errs = o.Errors
	case events.RestoreFailed:
		errs = o.Errors
	case events.ReleaseFailed:
		errs = o.Errors
	default:
		return metrics.ReasonNone
	}
	if len(errs) == 0 {
		return "bridge"
	}
	return reasonCode(errs[0].Code)
}

// reasonCode keeps the label's values bounded: a code of PROTOCOL §4, else
// "other".
func reasonCode(c string) string {
	switch c {
	case events.CodeMissingAck, events.CodeStaleCheckpoint, events.CodeCheckpointConflict, events.CodeInvalidPhase,
		events.CodeStaleAttempt, events.CodeDeadlineExceeded, events.CodeRestartInScope, events.CodeExportFailed,
		events.CodeInstallFailed, events.CodeSuperseded, events.CodeRestarted, events.CodeInternal:
		return c
	}
	return "other"
}

// phaseClock times the phases one driving publishes, from the publish to
// the end of their gathering.
type phaseClock map[events.Phase]time.Time

func (c phaseClock) published(p events.Phase, at time.Time) { c[p] = at }

func (c phaseClock) stopped(m *metrics.Set, p events.Phase, at time.Time) {
	if t, ok := c[p]; ok {
		m.PhaseDone(string(p), at.Sub(t))
		delete(c, p)
	}
}
