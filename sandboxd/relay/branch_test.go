package relay_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// sent is one request as an upstream got it.
type sent struct {
	branch, seed, body string
}

// labelUpstream answers as a chat completions, a Messages or a Responses
// server by path (a chat completion's text "ok"), and keeps each request's
// branch headers and body. With hang, it answers nothing until the
// request is cut.
func labelUpstream(t *testing.T, hang bool) (*httptest.Server, <-chan sent) {
	t.Helper()
	got := make(chan sent, 16)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- sent{branch: r.Header.Get(sandboxapi.BranchHeader), seed: r.Header.Get(sandboxapi.SeedHeader), body: string(b)}
		if hang {
			<-r.Context().Done()
			return
		}
		if trajectory.APIOf(r.URL.Path) != trajectory.APIChat {
			nativeAnswer(w, r, b)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"c","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	}))
	t.Cleanup(srv.Close)
	return srv, got
}

// seedOf returns the "seed" members of a JSON object body, as written.
func seedOf(t *testing.T, body string) string {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("upstream body %q: %v", body, err)
	}
	return string(m["seed"])
}

// With a branch label, every call goes upstream with the branch's headers;
// a chat completion and a Responses request that set no seed get the
// branch's, recorded as an edit, a Messages request the headers alone;
// each record names the label and the seed. A launch without a branch
// clears the label.
func TestBranchLabelsEachAPI(t *testing.T) {
	up, got := labelUpstream(t, false)
	r, rec := captureRelay(t, up.URL, filepath.Join(t.TempDir(), trajectory.FileName))
	if err := r.LabelBranch("e", "l", nil, &sandboxapi.BranchLabel{Label: "b2", Seed: 42}); err != nil {
		t.Fatal(err)
	}
	if st := r.Status(); st.Branch == nil || *st.Branch != (sandboxapi.BranchLabel{Label: "b2", Seed: 42}) {
		t.Errorf("status branch %+v", st.Branch)
	}
	_, resp, _ := nativeTurns(trajectory.APIResponses, false)
	_, msgs, _ := nativeTurns(trajectory.APIMessages, false)
	calls := []struct{ path, body, seed string }{
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "42"},
		{"/v1/responses", resp, "42"},
		{"/v1/messages", msgs, ""},
	}
	for _, c := range calls {
		if g := wait(t, post(t, r, c.path, c.body)); g.status != 200 {
			t.Fatalf("%s: %+v", c.path, g)
		}
		s := <-got
		if s.branch != "b2" || s.seed != "42" {
			t.Errorf("%s went upstream with headers %q %q", c.path, s.branch, s.seed)
		}
		if seed := seedOf(t, s.body); seed != c.seed {
			t.Errorf("%s went upstream with seed %q, want %q: %s", c.path, seed, c.seed, s.body)
		}
	}
	if err := r.Label("e", "l2", nil); err != nil {
		t.Fatal(err)
	}
	if g := wait(t, post(t, r, "/v1/chat/completions", calls[0].body)); g.status != 200 {
		t.Fatalf("%+v", g)
	}
	if s := <-got; s.branch != "" || s.seed != "" || seedOf(t, s.body) != "" {
		t.Errorf("a call of no branch went upstream as %+v", s)
	}

	recs := rec.Calls()
	if len(recs) != 4 {
		t.Fatalf("%d calls recorded", len(recs))
	}
	for i, c := range recs[:3] {
		if c.Branch != "b2" || c.Seed != 42 {
			t.Errorf("call %d recorded branch %q seed %d", i+1, c.Branch, c.Seed)
		}
		ed := c.Edits
		if calls[i].seed == "" {
			if ed != nil {
				t.Errorf("call %d (Messages) edits %+v", i+1, ed)
			}
			continue
		}
		if len(ed) != 1 || ed[0].Name != trajectory.BranchSeedEdit || len(ed[0].Added) != 1 || string(ed[0].Added[0]) != `{"seed":42}` {
			t.Errorf("call %d edits %+v", i+1, ed)
		}
		if !strings.Contains(string(c.Params), `"seed":42`) {
			t.Errorf("call %d params %s: not the request the model saw", i+1, c.Params)
		}
	}
	if c := recs[3]; c.Branch != "" || c.Seed != 0 || c.Edits != nil {
		t.Errorf("call of no branch recorded %q %d %+v", c.Branch, c.Seed, c.Edits)
	}
	b, _ := json.Marshal(recs[0].Call)
	if !strings.Contains(string(b), `"branch":"b2","seed":42`) {
		t.Errorf("record %s", b)
	}
}

// A request that sets its own seed keeps it; a body the relay cannot parse
// goes as it came, with the headers, and its record says why it got no
// seed.
func TestBranchOwnSeedAndUnparseable(t *testing.T) {
	up, got := labelUpstream(t, false)
	r, rec := captureRelay(t, up.URL, filepath.Join(t.TempDir(), trajectory.FileName))
	if err := r.LabelBranch("e", "l", nil, &sandboxapi.BranchLabel{Label: "b1", Seed: 5}); err != nil {
		t.Fatal(err)
	}
	own := `{"model":"m","seed":7,"messages":[{"role":"user","content":"hi"}]}`
	if g := wait(t, post(t, r, "/v1/chat/completions", own)); g.status != 200 {
		t.Fatalf("%+v", g)
	}
	if s := <-got; s.branch != "b1" || s.seed != "5" || seedOf(t, s.body) != "7" || strings.Count(s.body, `"seed"`) != 1 {
		t.Errorf("a request with its own seed went upstream as %+v", s)
	}
	for _, body := range []string{"not json {", `[1,2]`} {
		if g := wait(t, post(t, r, "/v1/responses", body)); g.err != nil || g.status == 0 {
			t.Fatalf("%q: %+v", body, g)
		}
		if s := <-got; s.body != body || s.branch != "b1" || s.seed != "5" {
			t.Errorf("%q went upstream as %+v", body, s)
		}
	}
	recs := rec.Calls()
	if len(recs) != 3 {
		t.Fatalf("%d calls recorded", len(recs))
	}
	if recs[0].Edits != nil || recs[0].Branch != "b1" {
		t.Errorf("own seed: edits %+v, branch %q", recs[0].Edits, recs[0].Branch)
	}
	for _, c := range recs[1:] {
		if len(c.Edits) != 1 || c.Edits[0].Name != trajectory.BranchSeedEdit || c.Edits[0].Error == "" || c.Branch != "b1" {
			t.Errorf("unparseable %s: edits %+v, branch %q", c.RawRequest, c.Edits, c.Branch)
		}
	}
	if err := r.LabelBranch("e", "l", nil, &sandboxapi.BranchLabel{Label: "b0"}); !errors.Is(err, sandboxapi.ErrBadBranch) {
		t.Errorf("label b0: %v", err)
	}
	if _, err := r.RepointBranch(up.URL, 1, &sandboxapi.BranchLabel{Label: "x1"}); !errors.Is(err, sandboxapi.ErrBadBranch) {
		t.Errorf("repoint x1: %v", err)
	}
	if st := r.Status(); st.Generation != 0 || st.Branch == nil || st.Branch.Label != "b1" {
		t.Errorf("a refused label changed the relay: %+v", st)
	}
}

// A call a snapshot cut is sent again after a re-point that sets a branch
// with the branch's label: its headers and seed, none the label before it
// left (a branch of a branch), and the record is of what the upstream
// answered.
func TestBranchResentCallAfterRepoint(t *testing.T) {
	for _, before := range []*sandboxapi.BranchLabel{nil, {Label: "b2", Seed: 5}} {
		t.Run(fmt.Sprintf("before=%v", before != nil), func(t *testing.T) {
			gone, cutGot := labelUpstream(t, true)
			fresh, got := labelUpstream(t, false)
			r, rec := captureRelay(t, gone.URL, filepath.Join(t.TempDir(), trajectory.FileName))
			for _, path := range []string{"/v1/chat/completions", "/v1/responses"} {
				if err := r.LabelBranch("e", "l", nil, before); err != nil {
					t.Fatal(err)
				}
				body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
				if path == "/v1/responses" {
					_, body, _ = nativeTurns(trajectory.APIResponses, false)
				}
				cut := post(t, r, path, body)
				first := <-cutGot
				if wantSeed := map[bool]string{true: "5", false: ""}[before != nil]; first.seed != wantSeed || seedOf(t, first.body) != wantSeed {
					t.Fatalf("first attempt %+v, want seed %q", first, wantSeed)
				}
				r.Hold()
				st := r.Status()
				if _, err := r.RepointBranch(fresh.URL, st.Generation+1, &sandboxapi.BranchLabel{Label: "b3", Seed: 6}); err != nil {
					t.Fatal(err)
				}
				r.Release()
				if g := wait(t, cut); g.status != 200 {
					t.Fatalf("after the re-point: %+v", g)
				}
				s := <-got
				if s.branch != "b3" || s.seed != "6" || seedOf(t, s.body) != "6" || strings.Count(s.body, `"seed"`) != 1 {
					t.Errorf("%s re-sent as %+v", path, s)
				}
				// The label stays for the calls after.
				if g := wait(t, post(t, r, path, body)); g.status != 200 {
					t.Fatalf("%+v", g)
				}
				if s := <-got; s.branch != "b3" || seedOf(t, s.body) != "6" {
					t.Errorf("%s after the re-point went as %+v", path, s)
				}
				// A re-point without a branch leaves the label.
				if _, err := r.Repoint(gone.URL, st.Generation+2); err != nil {
					t.Fatal(err)
				}
			}
			recs := rec.Calls()
			if len(recs) != 4 {
				t.Fatalf("%d calls recorded", len(recs))
			}
			for _, i := range []int{0, 2} {
				c := recs[i]
				if c.Resends != 1 || c.Branch != "b3" || c.Seed != 6 || len(c.Edits) != 1 || string(c.Edits[0].Added[0]) != `{"seed":6}` {
					t.Errorf("re-sent call %s: resends %d branch %q seed %d edits %+v", c.ID, c.Resends, c.Branch, c.Seed, c.Edits)
				}
				if !strings.Contains(string(c.Params), `"seed":6`) || strings.Contains(string(c.Params), `"seed":5`) {
					t.Errorf("re-sent call %s params %s", c.ID, c.Params)
				}
			}
		})
	}
}

// A fork that continues in place runs the parent's launch: a re-point
// that names the branch's episode records the call it sends again, and
// every call after, under that episode, with IDs of its own (no sibling's
// or parent's ID); a label whose episode is no capture key is refused and
// changes nothing.
func TestBranchRepointRecordsUnderTheBranchEpisode(t *testing.T) {
	gone, cutGot := labelUpstream(t, true)
	fresh, got := labelUpstream(t, false)
	r, rec := captureRelay(t, gone.URL, filepath.Join(t.TempDir(), trajectory.FileName))
	if err := r.LabelBranch("e", "l", nil, nil); err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	cut := post(t, r, "/v1/chat/completions", body)
	<-cutGot
	r.Hold()
	gen := r.Status().Generation
	bad := &sandboxapi.BranchLabel{Label: "b3", Seed: 6, Episode: "../x"}
	if _, err := r.RepointBranch(fresh.URL, gen+1, bad); !errors.Is(err, sandboxapi.ErrBadBranch) {
		t.Fatalf("a re-point whose branch names a path-like episode: %v, want ErrBadBranch", err)
	}
	if _, err := r.RepointBranch(fresh.URL, gen+1, &sandboxapi.BranchLabel{Label: "b3", Seed: 6, Episode: "e.b3-a1"}); err != nil {
		t.Fatal(err)
	}
	r.Release()
	if g := wait(t, cut); g.status != 200 {
		t.Fatalf("the cut call after the re-point: %+v", g)
	}
	<-got
	if g := wait(t, post(t, r, "/v1/chat/completions", body)); g.status != 200 {
		t.Fatalf("%+v", g)
	}
	<-got
	recs := rec.Calls()
	if len(recs) != 2 {
		t.Fatalf("%d calls recorded, want 2", len(recs))
	}
	for i, c := range recs {
		if want := fmt.Sprintf("e.b3-a1.l.%d", i+1); c.ID != want || c.Episode != "e.b3-a1" || c.Branch != "b3" {
			t.Errorf("call %d recorded as %s (episode %s, branch %s), want %s of e.b3-a1, b3", i+1, c.ID, c.Episode, c.Branch, want)
		}
	}
	if st := r.Status(); st.Capture == nil || st.Capture.Episode != "e.b3-a1" {
		t.Errorf("the capture's label after the re-point: %+v", st.Capture)
	}
}
