package relay_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/sandboxd/relay"
)

// codexEmpty is the user message `codex exec resume <id> ""` adds.
const codexEmpty = `{"type":"message","id":"msg_01a24ee6-eb12","role":"user","content":[{"type":"input_text","text":""}]}`

// codexBody is a Responses request as Codex sends one, its input items
// given.
func codexBody(items ...string) []byte {
	return []byte(`{"model":"m","stream":true,"input":[` + strings.Join(items, ",") + `],"tools":[],"store":false}`)
}

// The Codex edit removes every empty user message from a Responses
// request's input, keeping the rest of the body byte for byte, and leaves
// any other request as it is.
func TestCodexEmptyTurnEdit(t *testing.T) {
	edits, err := relay.LookupEdits([]string{relay.CodexEmptyTurn})
	if err != nil {
		t.Fatal(err)
	}
	apply := edits[0].Apply
	dev := `{"type":"message","role":"developer","content":[{"type":"input_text","text":"You are Codex."}]}`
	user := `{"type":"message","role":"user","content":[{"type":"input_text","text":"Fix calc.sh."}]}`
	call := `{"type":"function_call","name":"exec_command","arguments":"{\"cmd\":\"sleep 5\"}","call_id":"c1"}`
	aborted := `{"type":"function_call_output","call_id":"c1","output":"aborted"}`
	answer := `{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Done."}]}`

	// The continuation's request, and a later one carrying it in history.
	for _, tc := range []struct{ in, want []string }{
		{[]string{dev, user, call, aborted, codexEmpty}, []string{dev, user, call, aborted}},
		{[]string{dev, user, call, aborted, codexEmpty, answer, codexEmpty}, []string{dev, user, call, aborted, answer}},
	} {
		out, removed, err := apply("/v1/responses", codexBody(tc.in...))
		if err != nil {
			t.Fatal(err)
		}
		if want := codexBody(tc.want...); !bytes.Equal(out, want) {
			t.Fatalf("edited body\n%s\nwant\n%s", out, want)
		}
		if len(removed) != len(tc.in)-len(tc.want) || string(removed[0]) != codexEmpty {
			t.Fatalf("removed %s", removed)
		}
	}

	// Nothing to remove: the body passes unchanged.
	notEmpty := []string{
		`{"type":"message","role":"user","content":[{"type":"input_text","text":" "}]}`,
		`{"type":"message","role":"user","content":[{"type":"input_text","text":""},{"type":"input_image","image_url":"x"}]}`,
		`{"type":"message","role":"user","content":[]}`,
		`{"type":"message","role":"developer","content":[{"type":"input_text","text":""}]}`,
		`{"type":"message","role":"user","content":[{"type":"input_text","text":""}],"extra":1}`,
	}
	for _, body := range [][]byte{codexBody(dev, user, call, aborted), codexBody(append([]string{user}, notEmpty...)...),
		[]byte(`{"model":"m","input":""}`), []byte(`{"model":"m"}`)} {
		out, removed, err := apply("/v1/responses", body)
		if err != nil || len(removed) != 0 || !bytes.Equal(out, body) {
			t.Fatalf("%s: edited to %s, removed %s, %v", body, out, removed, err)
		}
	}
	chat := []byte(`{"messages":[{"role":"user","content":""}],"input":[` + codexEmpty + `]}`)
	if out, removed, _ := apply("/v1/chat/completions", chat); len(removed) != 0 || !bytes.Equal(out, chat) {
		t.Fatalf("a chat request was edited: %s", out)
	}
	if _, _, err := apply("/v1/responses", []byte(`not json`)); err == nil {
		t.Fatal("a body that is no JSON object gave no error")
	}
	var v any
	if out, _, _ := apply("/v1/responses?x=1", codexBody(user, codexEmpty)); json.Unmarshal(out, &v) != nil || bytes.Contains(out, []byte(`"text":""`)) {
		t.Fatalf("with a query: %s", out)
	}
}
