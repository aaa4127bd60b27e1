package relay_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/sandboxd/relay"
)

func claudeEdit(t *testing.T) relay.Edit {
	t.Helper()
	e, err := relay.LookupEdits([]string{relay.ClaudeContinueEdit})
	if err != nil || len(e) != 1 {
		t.Fatalf("the claude edit is not registered: %v", err)
	}
	return e[0]
}

// The messages of a Claude Code request: the task, the system entry, a
// tool call and its interrupted result.
const (
	claudeUser   = `{"role":"user","content":[{"type":"text","text":"<system-reminder>x</system-reminder>"},{"type":"text","text":"fix calc.sh"}]}`
	claudeSystem = `{"role":"system","content":"# Environment"}`
	claudeCall   = `{"role":"assistant","content":[{"type":"text","text":"Reading."},{"type":"tool_use","id":"toolu_1","name":"Read","input":{"file_path":"/w/calc.sh"}}]}`
	claudeResult = `{"role":"user","content":[{"type":"tool_result","content":"[Tool call interrupted: the session ended]","is_error":true,"tool_use_id":"toolu_1"}]}`
	claudeNoResp = `{"role":"assistant","content":[{"type":"text","text":"No response requested."}]}`
	claudeMarker = `{"role":"user","content":[{"type":"text","text":"[stillpoint: continue the saved session]","cache_control":{"type":"ephemeral"}}]}`
	claudeAnswer = `{"role":"assistant","content":[{"type":"text","text":"Fixed."}]}`
)

func claudeBody(msgs ...string) string {
	return `{"model":"claude-opus-5-5","messages":[` + strings.Join(msgs, ",") + `],"system":[{"type":"text","text":"You are Claude Code"}],"tools":[],"stream":true}`
}

// The continuation's synthetic assistant message and marker turn are
// removed, each time they occur, and nothing else: the rest of the body
// stays byte for byte, and the record lists what went.
func TestClaudeContinueRemovesExactlyItsAddition(t *testing.T) {
	e := claudeEdit(t)
	in := claudeBody(claudeUser, claudeSystem, claudeCall, claudeResult, claudeNoResp, claudeMarker)
	out, removed, err := e.Apply("/v1/messages?beta=true", []byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if want := claudeBody(claudeUser, claudeSystem, claudeCall, claudeResult); string(out) != want {
		t.Fatalf("edited body\n%s\nwant\n%s", out, want)
	}
	if len(removed) != 2 || string(removed[0]) != claudeNoResp || string(removed[1]) != claudeMarker {
		t.Fatalf("removed %s", removed)
	}
	// A second crash later in the session: both continuations go.
	in = claudeBody(claudeUser, claudeSystem, claudeNoResp, claudeMarker, claudeCall, claudeResult, claudeNoResp, claudeMarker)
	out, removed, _ = e.Apply("/v1/messages", []byte(in))
	if want := claudeBody(claudeUser, claudeSystem, claudeCall, claudeResult); string(out) != want || len(removed) != 4 {
		t.Fatalf("two continuations: %s (removed %d)", out, len(removed))
	}
	// A session that ended on the model's message: only the marker.
	out, removed, _ = e.Apply("/v1/messages", []byte(claudeBody(claudeUser, claudeSystem, claudeAnswer, claudeMarker)))
	if want := claudeBody(claudeUser, claudeSystem, claudeAnswer); string(out) != want || len(removed) != 1 {
		t.Fatalf("a marker alone: %s", out)
	}
	if !json.Valid(out) {
		t.Fatalf("invalid JSON: %s", out)
	}
}

// A request without the addition passes unchanged, and so does anything
// that only looks like it: the synthetic text not followed by the marker,
// the marker beside another block, a chat-completions request.
func TestClaudeContinueLeavesTheRest(t *testing.T) {
	e := claudeEdit(t)
	markerAndMore := `{"role":"user","content":[{"type":"text","text":"[stillpoint: continue the saved session]"},{"type":"text","text":"and more"}]}`
	for name, c := range map[string]struct{ path, body string }{
		"no continuation":       {"/v1/messages", claudeBody(claudeUser, claudeSystem, claudeCall, claudeResult)},
		"synthetic text alone":  {"/v1/messages", claudeBody(claudeUser, claudeNoResp, claudeUser)},
		"chat completions":      {"/v1/chat/completions", `{"messages":[{"role":"user","content":"[stillpoint: continue the saved session]"}]}`},
		"no messages":           {"/v1/messages", `{"model":"m"}`},
		"the marker as a reply": {"/v1/messages", claudeBody(claudeUser, `{"role":"assistant","content":"[stillpoint: continue the saved session]"}`)},
	} {
		out, removed, err := e.Apply(c.path, []byte(c.body))
		if err != nil || string(out) != c.body || len(removed) != 0 {
			t.Errorf("%s: %s removed %s (%v)", name, out, removed, err)
		}
	}
	if _, _, err := e.Apply("/v1/messages", []byte(`not json`)); err == nil {
		t.Error("a body that does not parse: no error")
	}
	// The marker beside another block cannot be removed exactly: an
	// error, so that the record says the request went unedited.
	markerAndResult := `{"role":"user","content":[{"type":"tool_result","content":"x","tool_use_id":"toolu_1"},{"type":"text","text":"[stillpoint: continue the saved session]"}]}`
	for _, m := range []string{markerAndMore, markerAndResult} {
		in := claudeBody(claudeUser, claudeCall, m)
		out, removed, err := e.Apply("/v1/messages", []byte(in))
		if err == nil || !strings.Contains(err.Error(), relay.ClaudeContinueEdit) || string(out) != in || len(removed) != 0 {
			t.Errorf("the marker with more: %s removed %s (%v)", out, removed, err)
		}
	}
}

// A base URL with a path prefix (ANTHROPIC_BASE_URL=http://relay/prefix)
// is edited as /v1/messages is.
func TestClaudeContinueUnderAPathPrefix(t *testing.T) {
	e := claudeEdit(t)
	in := claudeBody(claudeUser, claudeCall, claudeResult, claudeNoResp, claudeMarker)
	out, removed, err := e.Apply("/proxy/anthropic/v1/messages?beta=true", []byte(in))
	if want := claudeBody(claudeUser, claudeCall, claudeResult); err != nil || string(out) != want || len(removed) != 2 {
		t.Fatalf("%s removed %d (%v)", out, len(removed), err)
	}
}
