package relay_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/sandboxd/relay"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// probeTurn is what the test edit removes: a last message that is exactly
// this user turn.
const probeTurn = `{"role":"user","content":"PROBE"}`

func init() {
	relay.Register(relay.Edit{Name: "test-drop-probe", Apply: dropProbe})
	relay.Register(relay.Edit{Name: "test-fails", Apply: func(string, []byte) ([]byte, []json.RawMessage, error) {
		return nil, nil, errors.New("cannot parse")
	}})
}

// dropProbe removes a chat completion's last message when it is probeTurn,
// and nothing else.
func dropProbe(path string, body []byte) ([]byte, []json.RawMessage, error) {
	if !strings.HasPrefix(path, "/v1/chat/completions") {
		return body, nil, nil
	}
	var req map[string]json.RawMessage
	if err := json.Unmarshal(body, &req); err != nil {
		return body, nil, err
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(req["messages"], &msgs); err != nil || len(msgs) == 0 {
		return body, nil, nil
	}
	last := msgs[len(msgs)-1]
	if string(last) != probeTurn {
		return body, nil, nil
	}
	req["messages"], _ = json.Marshal(msgs[:len(msgs)-1])
	out, err := json.Marshal(req)
	return out, []json.RawMessage{last}, err
}

// LookupEdits knows the registered edits and names every unknown one.
func TestEditsLookup(t *testing.T) {
	if _, err := relay.LookupEdits([]string{"test-drop-probe", "test-drop-probe"}); err != nil {
		t.Fatal(err)
	}
	_, err := relay.LookupEdits([]string{"nope", "test-drop-probe", "nada"})
	if !errors.Is(err, relay.ErrUnknownEdit) || !strings.Contains(err.Error(), `"nope", "nada"`) || !strings.Contains(err.Error(), "test-drop-probe") {
		t.Fatalf("unknown edits: %v", err)
	}
	m := newModel(t)
	r, _ := captureRelay(t, m.URL, filepath.Join(t.TempDir(), trajectory.FileName))
	if err := r.Label("e", "l", []string{"nope"}); !errors.Is(err, relay.ErrUnknownEdit) {
		t.Fatalf("Label with an unknown edit: %v", err)
	}
}

// A launch's edit takes its addition out of the request before the model
// sees it, on the first attempt and on the re-send of a cut call alike;
// the record is of the edited request and lists what was removed. A
// request without the addition passes byte for byte, and a failing edit
// leaves the request as it was and says why.
func TestEditsApplyToTheLaunchsRequests(t *testing.T) {
	gone := newUpstream(t, func(w http.ResponseWriter, r *http.Request, _ []byte) { <-r.Context().Done() })
	m := newUpstream(t, echo)
	r, rec := captureRelay(t, gone.URL, filepath.Join(t.TempDir(), trajectory.FileName))
	if err := r.Label("e", "l", []string{"test-drop-probe"}); err != nil {
		t.Fatal(err)
	}
	with := `{"model":"m","messages":[{"role":"user","content":"hi"},` + probeTurn + `]}`
	cut := post(t, r, "/v1/chat/completions", with)
	first := <-gone.got
	r.Hold()
	if _, err := r.Repoint(m.URL, 1); err != nil {
		t.Fatal(err)
	}
	r.Release()
	if g := wait(t, cut); g.status != 200 {
		t.Fatalf("after the re-point: %+v", g)
	}
	second := <-m.got
	if first != second || strings.Contains(first, "PROBE") {
		t.Fatalf("upstream got %s, then %s", first, second)
	}

	without := `{"model":"m", "messages":[{"role":"user","content":"PROBE"},{"role":"user","content":"hi"}]}`
	if g := wait(t, post(t, r, "/v1/chat/completions", without)); g.status != 200 {
		t.Fatalf("%+v", g)
	}
	if got := <-m.got; !strings.Contains(got, `"model":"m", "messages"`) {
		t.Errorf("a request without the addition changed: %s", got)
	}

	if err := r.Label("e", "l2", []string{"test-fails"}); err != nil {
		t.Fatal(err)
	}
	if g := wait(t, post(t, r, "/v1/chat/completions", with)); g.status != 200 {
		t.Fatalf("%+v", g)
	}
	if got := <-m.got; !strings.Contains(got, "PROBE") {
		t.Errorf("a failing edit changed the request: %s", got)
	}

	calls := rec.Calls()
	if len(calls) != 3 {
		t.Fatalf("%d calls recorded", len(calls))
	}
	ed := calls[0].Edits
	if len(ed) != 1 || ed[0].Name != "test-drop-probe" || len(ed[0].Removed) != 1 || string(ed[0].Removed[0]) != probeTurn {
		t.Errorf("call 1 edits %+v", ed)
	}
	if len(calls[0].Messages) != 1 || calls[0].Resends != 1 {
		t.Errorf("call 1 recorded %d messages, %d resends", len(calls[0].Messages), calls[0].Resends)
	}
	if calls[1].Edits != nil {
		t.Errorf("call 2 edits %+v", calls[1].Edits)
	}
	if ed := calls[2].Edits; len(ed) != 1 || ed[0].Name != "test-fails" || ed[0].Error != "cannot parse" || ed[0].Removed != nil {
		t.Errorf("call 3 edits %+v", ed)
	}
	// The record's line says it, and a reader reads it back.
	b, _ := json.Marshal(calls[0].Call)
	if !strings.Contains(string(b), `"edits":[{"name":"test-drop-probe","removed":[{"role":"user","content":"PROBE"}]}]`) {
		t.Errorf("record %s", b)
	}
}

// A label the capture rejects (no call id) still sets the launch's edits,
// and its calls are not captured under the launch before it.
func TestEditsOfARejectedLabel(t *testing.T) {
	m := newUpstream(t, echo)
	r, rec := captureRelay(t, m.URL, filepath.Join(t.TempDir(), trajectory.FileName))
	if err := r.Label("e", "l", nil); err != nil {
		t.Fatal(err)
	}
	if err := r.Label("e", "not an id!", []string{"test-drop-probe"}); !errors.Is(err, trajectory.ErrBadCall) {
		t.Fatalf("Label with a bad launch id: %v", err)
	}
	with := `{"model":"m","messages":[{"role":"user","content":"hi"},` + probeTurn + `]}`
	if g := wait(t, post(t, r, "/v1/chat/completions", with)); g.status != 200 {
		t.Fatalf("%+v", g)
	}
	if got := <-m.got; strings.Contains(got, "PROBE") {
		t.Errorf("the launch's edit was not applied: %s", got)
	}
	if calls := rec.Calls(); len(calls) != 0 {
		t.Errorf("recorded under the launch before: %s", calls[0].ID)
	}
	if st := r.Status().Capture; st == nil || st.Unlabeled != 1 || st.Launch != "" {
		t.Errorf("capture status %+v", st)
	}
}
