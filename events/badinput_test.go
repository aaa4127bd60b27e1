package events

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// validMsg returns a fresh, valid message of the given sample type.
func validMsg(t *testing.T, typ Type) *nats.Msg {
	t.Helper()
	s := samples()[typ]
	m, err := Marshal(s.src, s.data)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestBadInputIsRefusedNamingTheField(t *testing.T) {
	cases := []struct {
		name   string
		typ    Type
		mutate func(m *nats.Msg)
		want   error
		field  string
	}{
		{"missing id", TypePrepare, func(m *nats.Msg) { delete(m.Header, "ce-id") }, ErrInvalid, "ce-id"},
		{"missing source", TypePrepare, func(m *nats.Msg) { delete(m.Header, "ce-source") }, ErrInvalid, "ce-source"},
		{"missing type", TypePrepare, func(m *nats.Msg) { delete(m.Header, "ce-type") }, ErrInvalid, "ce-type"},
		{"missing specversion", TypePrepare, func(m *nats.Msg) { delete(m.Header, "ce-specversion") }, ErrInvalid, "ce-specversion"},
		{"specversion 0.3", TypePrepare, func(m *nats.Msg) { m.Header["ce-specversion"] = []string{"0.3"} }, ErrUnknownVersion, "ce-specversion"},
		{"bad time", TypePrepare, func(m *nats.Msg) { m.Header["ce-time"] = []string{"yesterday"} }, ErrInvalid, "ce-time"},
		{"repeated header", TypePrepare, func(m *nats.Msg) { m.Header["Ce-Id"] = []string{"other"} }, ErrMalformed, "ce-id"},
		{"unknown type", TypePrepare, func(m *nats.Msg) { m.Header["ce-type"] = []string{"com.example.thing.v1"} }, ErrUnknownType, "ce-type"},
		{"unknown stillpoint noun", TypePrepare, func(m *nats.Msg) { m.Header["ce-type"] = []string{"dev.stillpoint.phase.explode.v1"} }, ErrUnknownType, "ce-type"},
		{"unknown version", TypePrepare, func(m *nats.Msg) { m.Header["ce-type"] = []string{"dev.stillpoint.phase.prepare.v2"} }, ErrUnknownVersion, "ce-type"},
		{"invalid UTF-8 header", TypePrepare, func(m *nats.Msg) { m.Header["ce-subject"] = []string{"ckpt%FF"} }, ErrMalformed, "ce-subject"},
		{"raw invalid UTF-8 header", TypePrepare, func(m *nats.Msg) { m.Header["ce-subject"] = []string{"ckpt\xff"} }, ErrMalformed, "ce-subject"},
		// A % that starts no escape is read as itself: ckpt%2 is not the checkpoint.
		{"% not an escape", TypePrepare, func(m *nats.Msg) { m.Header["ce-subject"] = []string{"ckpt%2"} }, ErrMismatch, "ce-subject"},
		{"oversized header", TypePrepare, func(m *nats.Msg) { m.Header["ce-note"] = []string{strings.Repeat("x", MaxHeaderValue+1)} }, ErrTooLarge, "ce-note"},
		{"bad extension name", TypePrepare, func(m *nats.Msg) { m.Header["ce-no_te"] = []string{"x"} }, ErrInvalid, "ce-no_te"},
		{"invalid UTF-8 data", TypePrepare, func(m *nats.Msg) { m.Data = append([]byte(`{"run":"\xff`), m.Data[8:]...) }, ErrMalformed, "data"},
		{"oversized data", TypePrepare, func(m *nats.Msg) { m.Data = make([]byte, MaxDataSize+1) }, ErrTooLarge, "data"},
		{"not JSON", TypePrepare, func(m *nats.Msg) { m.Data = []byte("prepare!") }, ErrMalformed, "data"},
		{"trailing JSON", TypePrepare, func(m *nats.Msg) { m.Data = append(m.Data, []byte(" {}")...) }, ErrMalformed, "data"},
		{"empty data", TypePrepare, func(m *nats.Msg) { m.Data = nil }, ErrInvalid, "data"},
		// Each reads back empty from the model (a URL of "#" prints as ""),
		// so the check that Parse leaves to Validate must still run.
		{"dataschema #", TypePrepare, func(m *nats.Msg) { m.Header["ce-dataschema"] = []string{"#"} }, ErrInvalid, "event"},
		{"source #", TypePrepare, func(m *nats.Msg) { m.Header["ce-source"] = []string{"%23"} }, ErrInvalid, "event"},
		{"wrong content type", TypePrepare, func(m *nats.Msg) { m.Header["ce-datacontenttype"] = []string{"text/plain"} }, ErrInvalid, "ce-datacontenttype"},
		{"path-like checkpoint id", TypePrepare, func(m *nats.Msg) {
			m.Data = []byte(strings.Replace(string(m.Data), `"ckpt-7"`, `"../../etc"`, 1))
		}, ErrInvalid, "data.checkpoint_id"},
		{"dotted run id", TypePrepare, func(m *nats.Msg) { m.Data = []byte(strings.Replace(string(m.Data), `"run1"`, `"run.1"`, 1)) }, ErrInvalid, "data.run"},
		{"wildcard member", TypePrepare, func(m *nats.Msg) {
			m.Data = []byte(strings.Replace(string(m.Data), `"agent.a0"`, `"agent.*"`, 1))
		}, ErrInvalid, "data.members[0]"},
		{"zero seq", TypePrepare, func(m *nats.Msg) { m.Data = []byte(strings.Replace(string(m.Data), `"seq":1`, `"seq":0`, 1)) }, ErrInvalid, "data.seq"},
		{"no deadline", TypePrepare, func(m *nats.Msg) {
			m.Data = []byte(strings.Replace(string(m.Data), `"deadline":"2026-11-29T08:00:30Z"`, `"deadline":"0001-01-01T00:00:00Z"`, 1))
		}, ErrInvalid, "data.deadline"},
		{"phase from a non-bridge", TypePrepare, func(m *nats.Msg) { m.Header["ce-source"] = []string{"/run1/agent.a0"} }, ErrMismatch, "ce-source"},
		{"source of another run", TypePrepare, func(m *nats.Msg) { m.Header["ce-source"] = []string{"/run2/bridge.main"} }, ErrMismatch, "ce-source"},
		{"source without member", TypePrepare, func(m *nats.Msg) { m.Header["ce-source"] = []string{"/run1"} }, ErrInvalid, "ce-source"},
		{"subject of another checkpoint", TypePrepare, func(m *nats.Msg) { m.Header["ce-subject"] = []string{"ckpt-8"} }, ErrMismatch, "ce-subject"},
		{"sprun disagrees", TypePrepare, func(m *nats.Msg) { m.Header["ce-sprun"] = []string{"run2"} }, ErrMismatch, "ce-sprun"},
		{"spseq disagrees", TypePrepare, func(m *nats.Msg) { m.Header["ce-spseq"] = []string{"9"} }, ErrMismatch, "ce-spseq"},
		{"spseq missing", TypePrepare, func(m *nats.Msg) { delete(m.Header, "ce-spseq") }, ErrInvalid, "ce-spseq"},
		{"spepoch disagrees", TypePrepare, func(m *nats.Msg) { m.Header["ce-spepoch"] = []string{"1"} }, ErrMismatch, "ce-spepoch"},
		{"spepoch not a number", TypePrepare, func(m *nats.Msg) { m.Header["ce-spepoch"] = []string{"two"} }, ErrInvalid, "ce-spepoch"},
		{"message on the wrong subject", TypePrepare, func(m *nats.Msg) { m.Subject = "sp.run1.phase.commit" }, ErrMismatch, "subject"},
		{"forged ack: another member's subject", TypePrepareAck, func(m *nats.Msg) { m.Subject = "sp.run1.ack.1.prepare.agent.a1" }, ErrMismatch, "subject"},
		{"forged ack: source is another member", TypePrepareAck, func(m *nats.Msg) { m.Header["ce-source"] = []string{"/run1/agent.a1"} }, ErrMismatch, "ce-source"},
		{"ack of a stale seq", TypePrepareAck, func(m *nats.Msg) { m.Subject = "sp.run1.ack.2.prepare.agent.a0" }, ErrMismatch, "subject"},
		{"ok ack with an error", TypeCommitAck, func(m *nats.Msg) {
			m.Data = []byte(strings.Replace(string(m.Data), `"ok":true`, `"ok":true,"error":{"code":"x"}`, 1))
		}, ErrInvalid, "data.error"},
		{"bad manifest digest", TypeCommitAck, func(m *nats.Msg) { m.Data = []byte(strings.Replace(string(m.Data), `"sha256":"e3`, `"sha256":"zz`, 1)) }, ErrInvalid, "data.manifest.sha256"},
		{"manifest names another object", TypeCommitAck, func(m *nats.Msg) {
			m.Data = []byte(strings.Replace(string(m.Data), `run1/ckpt-7/agent.a0.e3b0c44298fc1c14.jsonl`, `run1/ckpt-7/../x.jsonl`, 1))
		}, ErrMismatch, "data.manifest.object"},
		{"manifest of an unknown schema", TypeCommitAck, func(m *nats.Msg) { m.Data = []byte(strings.Replace(string(m.Data), `"schema":1`, `"schema":2`, 1)) }, ErrUnknownVersion, "data.manifest.schema"},
		{"too many blockers", TypePrepareAck, func(m *nats.Msg) {
			m.Data = []byte(strings.Replace(string(m.Data), `"blockers":["r3","r4"]`, `"blockers":[`+strings.Repeat(`"b",`, MaxBlockers)+`"b"]`, 1))
		}, ErrTooLarge, "data.blockers"},
		{"bad episode in scope", TypeCommit, func(m *nats.Msg) { m.Data = []byte(strings.Replace(string(m.Data), `"r2-a3"`, `"r2-a0"`, 1)) }, ErrInvalid, "data.scope"},
		{"bad rollout in forget", TypeForget, func(m *nats.Msg) { m.Data = []byte(strings.Replace(string(m.Data), `["r1"]`, `["a/b"]`, 1)) }, ErrInvalid, "data.rollouts[0]"},
		{"bad state", TypeResumeAck, func(m *nats.Msg) {
			m.Data = []byte(strings.Replace(string(m.Data), `"phase":"idle"`, `"phase":"sleepy"`, 1))
		}, ErrInvalid, "data.phase"},
		{"member event for someone else", TypeMemberJoined, func(m *nats.Msg) { m.Header["ce-source"] = []string{"/run1/sandbox.sb-2"} }, ErrMismatch, "ce-source"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := validMsg(t, c.typ)
			c.mutate(m)
			_, _, err := Unmarshal(m)
			if err == nil {
				t.Fatalf("accepted")
			}
			if !errors.Is(err, c.want) {
				t.Errorf("error %q is not %v", err, c.want)
			}
			if !strings.Contains(err.Error(), c.field) {
				t.Errorf("error %q does not name %s", err, c.field)
			}
		})
	}
}

func TestConstructorsValidate(t *testing.T) {
	p := Prepare{testPhase(1)}
	p.CheckpointID = "a.b"
	if _, err := New(testBridge, p); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "data.checkpoint_id") {
		t.Errorf("New with a dotted checkpoint id: %v", err)
	}
	if _, err := New("agent.a0", Prepare{testPhase(1)}); !errors.Is(err, ErrMismatch) {
		t.Errorf("New of a phase by an agent: %v", err)
	}
	if _, err := New("agent.a1", samples()[TypePrepareAck].data); !errors.Is(err, ErrMismatch) {
		t.Errorf("New of agent.a0's ack by agent.a1: %v", err)
	}
	f := Forget{PhaseHeader: testPhase(1)}
	if _, err := New(testBridge, f); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "data.rollouts") {
		t.Errorf("empty forget: %v", err)
	}
	big := Commit{PhaseHeader: testPhase(1)}
	for i := 0; i < 40000; i++ {
		big.Scope = append(big.Scope, Episode{Rollout: "rollout-with-a-long-name-" + strings.Repeat("x", 20), Attempt: i})
	}
	if _, err := New(testBridge, big); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "data") {
		t.Errorf("oversized commit: %v", err)
	}
	var a PrepareAck
	all := make([]string, 250)
	for i := range all {
		all[i] = "r"
	}
	a.SetBlockers(all)
	if len(a.Blockers) != MaxBlockers || a.BlockerCount != 250 {
		t.Errorf("SetBlockers kept %d of %d", len(a.Blockers), a.BlockerCount)
	}
}
