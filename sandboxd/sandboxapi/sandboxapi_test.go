package sandboxapi_test

import (
	"encoding/json"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// The enums travel as their protocol names and come back as themselves;
// a name that is not one is refused.
func TestEnumsTravelAsTheirNames(t *testing.T) {
	type enum interface {
		MarshalText() ([]byte, error)
	}
	cases := []struct {
		v    enum
		name string
		back func([]byte) (any, error)
	}{
		{sandboxapi.ModeFreeze, "freeze", func(b []byte) (any, error) { var v sandboxapi.Mode; return v, v.UnmarshalText(b) }},
		{sandboxapi.ModeDefault, "default", func(b []byte) (any, error) { var v sandboxapi.Mode; return v, v.UnmarshalText(b) }},
		{sandboxapi.StatePaused, "paused", func(b []byte) (any, error) { var v sandboxapi.State; return v, v.UnmarshalText(b) }},
		{sandboxapi.OutcomeInterrupted, "interrupted", func(b []byte) (any, error) { var v sandboxapi.Outcome; return v, v.UnmarshalText(b) }},
		{sandboxapi.StopDeadline, "deadline", func(b []byte) (any, error) { var v sandboxapi.StopReason; return v, v.UnmarshalText(b) }},
		{sandboxapi.CallReplied, "replied", func(b []byte) (any, error) { var v sandboxapi.CallState; return v, v.UnmarshalText(b) }},
		{sandboxapi.VerdictIdentityChanged, "identity_changed", func(b []byte) (any, error) { var v sandboxapi.Verdict; return v, v.UnmarshalText(b) }},
	}
	for _, c := range cases {
		b, err := c.v.MarshalText()
		if err != nil || string(b) != c.name {
			t.Errorf("MarshalText(%v) = %q, %v, want %q", c.v, b, err, c.name)
		}
	}
	rec := sandboxapi.Record{V: 1, ID: "l1", State: sandboxapi.StatePaused, Mode: sandboxapi.ModeStop,
		Supervisor: sandboxapi.Identity{PID: 7, Start: 99}, Created: time.Unix(5, 0).UTC(),
		Pauses:  sandboxapi.PauseStats{Count: 1, Seq: 1, Mode: sandboxapi.ModeStop},
		Receipt: &sandboxapi.Receipt{ID: "l1", Outcome: sandboxapi.OutcomeFinished, StopReason: sandboxapi.StopRequested}}
	b, err := json.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	var back sandboxapi.Record
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, rec) {
		t.Fatalf("record %s came back as %+v, %v", b, back, err)
	}
	for _, bad := range []string{`{"state":"asleep"}`, `{"mode":"sideways"}`, `{"receipt":{"outcome":"maybe"}}`, `{"receipt":{"stop_reason":"whim"}}`, `{"pauses":{"mode":"limbo"}}`} {
		if err := json.Unmarshal([]byte(bad), &back); err == nil {
			t.Errorf("%s decoded", bad)
		}
	}
	if _, err := sandboxapi.ParseMode("sideways"); !errors.Is(err, sandboxapi.ErrUnknownMode) {
		t.Errorf("ParseMode(sideways) = %v, want ErrUnknownMode", err)
	}
	if m, err := sandboxapi.ParseMode(""); err != nil || m != sandboxapi.ModeDefault {
		t.Errorf(`ParseMode("") = %v, %v, want ModeDefault`, m, err)
	}
}

func TestIdentityRoundTrip(t *testing.T) {
	id := sandboxapi.Identity{PID: 41, Start: 9912}
	back, err := sandboxapi.ParseIdentity(id.String())
	if err != nil || back != id || id.String() != "41:9912" {
		t.Fatalf("ParseIdentity(%q) = %v, %v", id.String(), back, err)
	}
	for _, bad := range []string{"", "41", "0:1", "-1:2", "a:b", "41:"} {
		if _, err := sandboxapi.ParseIdentity(bad); err == nil {
			t.Errorf("ParseIdentity(%q) accepted", bad)
		}
	}
}

// The answers of the restore endpoints come back as themselves.
func TestHeldAnswerRoundTrip(t *testing.T) {
	a := sandboxapi.HeldAnswer{Verdict: sandboxapi.VerdictNotHolding, Reason: "paused in pause 3, not 2",
		Identity: sandboxapi.Identity{PID: 7, Start: 1}, Record: &sandboxapi.Record{V: 1, ID: "l1", State: sandboxapi.StatePaused},
		Relay: sandboxapi.RelayStatus{Up: true, URL: "http://127.0.0.1:18480/v1", Generation: 2,
			Calls: sandboxapi.RelayCounts{Total: 3, InFlight: 1},
			Open:  []sandboxapi.CallStatus{{Seq: 3, Digest: "ab", Generation: 1, State: sandboxapi.CallForwarding, Stream: true}}},
		Wall: time.Unix(9, 0).UTC(), Uptime: 4.5}
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	var back sandboxapi.HeldAnswer
	if err := json.Unmarshal(b, &back); err != nil || !reflect.DeepEqual(back, a) {
		t.Fatalf("answer %s came back as %+v, %v", b, back, err)
	}
	for _, bad := range []string{`{"verdict":"maybe"}`, `{"relay":{"open":[{"state":"lost"}]}}`} {
		if err := json.Unmarshal([]byte(bad), &back); err == nil {
			t.Errorf("%s decoded", bad)
		}
	}
}

// A daemon's subject is its member's service subject; a run or sandbox id
// that is not one token is refused.
func TestServiceSubject(t *testing.T) {
	s, err := sandboxapi.ServiceSubject("run1", "sb1")
	if err != nil || s != "spsvc.run1.sandbox.sb1" {
		t.Fatalf("ServiceSubject(run1, sb1) = %q, %v", s, err)
	}
	for _, bad := range [][2]string{{"", "sb1"}, {"run1", ""}, {"run.1", "sb1"}, {"run1", "sb.1"}, {"run1", "sb*"}} {
		if s, err := sandboxapi.ServiceSubject(bad[0], bad[1]); err == nil {
			t.Errorf("ServiceSubject(%q, %q) = %q, want an error", bad[0], bad[1], s)
		}
	}
}
