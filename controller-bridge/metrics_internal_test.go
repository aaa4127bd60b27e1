package bridge

import (
	"testing"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/metrics"
)

// A sandbox daemon's resume ack adds the calls its relay held; acks are
// counted by phase, kind and result; outcome reasons are codes from a
// closed set, never the free text.
func TestCountAckAndOutcomeReason(t *testing.T) {
	b := &Bridge{cfg: Config{Metrics: metrics.New()}}
	b.cfg.Metrics.InitBridge()
	hdr := func(m events.Member, ok bool) events.AckHeader {
		h := events.AckHeader{Member: m, OK: ok}
		if !ok {
			h.Fail(events.CodeExportFailed, "disk full")
		}
		return h
	}
	b.countAck(events.ResumeAck{AckHeader: hdr("sandbox.s1", true), Pause: &events.PauseReport{Mode: "hold", HeldCalls: 3}})
	b.countAck(events.ResumeAck{AckHeader: hdr("sandbox.s2", true)})
	b.countAck(events.PrepareAck{AckHeader: hdr("agent.a1", true), Ready: false})
	b.countAck(events.CommitAck{AckHeader: hdr("owner.o1", false)})
	f, err := b.cfg.Metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name  string
		match map[string]string
		want  float64
	}{
		{"stillpoint_relay_held_calls_total", nil, 3},
		{"stillpoint_acks_total", map[string]string{"phase": "resume", "kind": "sandbox", "result": "ok"}, 2},
		{"stillpoint_acks_total", map[string]string{"phase": "prepare", "kind": "agent", "result": "not_ready"}, 1},
		{"stillpoint_acks_total", map[string]string{"phase": "commit", "kind": "owner", "result": "error"}, 1},
	} {
		if got := f.Sum(c.name, c.match); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.match, got, c.want)
		}
	}

	for _, c := range []struct {
		o    events.Data
		want string
	}{
		{events.CheckpointCommitted{}, metrics.ReasonNone},
		{events.CheckpointFailed{Reason: "free text", Blockers: map[events.Member][]string{"agent.a1": {"r1"}}}, "not_ready"},
		{events.CheckpointFailed{Reason: "free text", Errors: []events.MemberError{{Member: "owner.o1", Code: events.CodeMissingAck}}}, events.CodeMissingAck},
		{events.CheckpointFailed{Reason: "free text", Errors: []events.MemberError{{Member: "owner.o1", Code: "made_up"}}}, "other"},
		{events.CheckpointFailed{Reason: "the bridge could not publish"}, "bridge"},
		{events.RestoreFailed{Errors: []events.MemberError{{Member: "owner.o1", Code: events.CodeInstallFailed}}}, events.CodeInstallFailed},
	} {
		if got := outcomeReason(c.o); got != c.want {
			t.Errorf("outcomeReason(%T %+v) = %q, want %q", c.o, c.o, got, c.want)
		}
	}
}
