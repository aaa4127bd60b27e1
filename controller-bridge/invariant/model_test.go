package invariant

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// Invariant 4 on a harness a restore continued in place (a snapshot that
// kept its processes): the restored relay re-sends, in the old episode,
// the call the snapshot cut, though the world before the crash had its
// reply and went on. That is a call whose reply the crash lost, when the
// reply was saved after the restored checkpoint began; saved before, the
// snapshot held it, and the call is a repeat. A call sent again with no
// restore between is a repeat too.
func TestCallResentInPlaceAfterARestore(t *testing.T) {
	var tc modelserver.ToolCall
	tc.ID, tc.Type = "call-1", "function"
	tc.Function.Name, tc.Function.Arguments = "bash", `{"command":"true"}`
	script := modelserver.Script{"t1": {{ToolCalls: []modelserver.ToolCall{tc}}, {Content: "done"}}}
	user, _ := json.Marshal("go")
	x := []modelserver.Message{{Role: "user", Content: user}}
	x1 := append(x[:1:1], modelserver.Message{Role: "assistant", ToolCalls: json.RawMessage(`[{"id":"call-1"}]`)},
		modelserver.Message{Role: "tool", ToolCallID: "call-1", Content: json.RawMessage(`"ok"`)})
	send := func(t *testing.T, url string, msgs []modelserver.Message, saved time.Time) time.Time {
		t.Helper()
		b, _ := json.Marshal(modelserver.Request{Model: "m", Messages: msgs})
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(b))
		req.Header.Set(modelserver.TaskHeader, "t1")
		req.Header.Set(modelserver.EpisodeHeader, "t1")
		if !saved.IsZero() {
			req.Header.Set(modelserver.SavedHeader, saved.Format(time.RFC3339Nano))
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("model server: %s", resp.Status)
		}
		return time.Now()
	}
	entry := func(at time.Time, id string, d events.Data) timeline.Entry {
		return timeline.Entry{Time: at, CheckpointID: id, Data: d}
	}
	restored := func(at time.Time) timeline.Entry {
		return entry(at, "restore-e1", events.RestoreCompleted{Source: "c2", Restored: []string{"t1-a1"}})
	}
	for _, c := range []struct {
		name string
		// c2 begins before or after the first reply is saved; a restore of
		// t1 from c2, or none, comes before the call comes again.
		c2BeforeSaved, restore, ok bool
	}{
		{"reply saved after the restored checkpoint began", true, true, true},
		{"reply saved before the restored checkpoint began", false, true, false},
		{"no restore", true, false, false},
		// c2 carries t1 from c1, which began before the reply was saved:
		// the restore installs t1 from c1, whose records lack the reply.
		{"reply saved after the checkpoint the restore carried it from began", false, true, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := modelserver.New(script)
			srv := httptest.NewServer(s)
			defer srv.Close()
			var tl []timeline.Entry
			carry := c.ok && !c.c2BeforeSaved
			if carry {
				tl = append(tl, entry(time.Now(), "c1", nil))
			}
			c2 := entry(time.Now(), "c2", nil)
			if c.c2BeforeSaved {
				tl = append(tl, c2)
			}
			send(t, srv.URL, x, time.Time{})
			time.Sleep(5 * time.Millisecond)
			saved := time.Now()
			send(t, srv.URL, x1, saved) // the world before the crash saved x's reply and went on
			if !c.c2BeforeSaved {
				time.Sleep(5 * time.Millisecond)
				tl = append(tl, entry(time.Now(), "c2", nil))
			}
			if c.restore {
				time.Sleep(5 * time.Millisecond)
				if carry {
					tl = append(tl, entry(time.Now(), "restore-e1", events.Restore{Source: "c2", Scope: []events.Episode{{Rollout: "t1"}},
						Carried: []events.CarriedSource{{Source: "c1", Episodes: []events.Episode{{Rollout: "t1"}}}}}))
				}
				tl = append(tl, restored(time.Now()))
			}
			time.Sleep(5 * time.Millisecond)
			send(t, srv.URL, x, time.Time{}) // the restored relay re-sends the cut call
			got := model(s, tl, 0)
			if got.OK != c.ok {
				t.Errorf("ok %v, want %v: %s", got.OK, c.ok, got.Detail)
			}
			if c.restore && !strings.Contains(got.Detail, "re-sent in place by a restored process (1)") {
				t.Errorf("the re-send is not counted as one in place: %s", got.Detail)
			}
		})
	}
}

// reissues is a ledger of re-issued calls only.
type reissues []modelserver.Reissue

func (reissues) Ledger() []modelserver.Entry       { return nil }
func (reissues) RepeatList() []modelserver.Repeat  { return nil }
func (r reissues) Reissued() []modelserver.Reissue { return r }

// Invariant 4 on a call re-issued by a restored attempt: a call the
// restored checkpoint's own attempt had its reply to before that
// checkpoint began is a repeat; the same call of an older attempt, retired
// and started over (the restored attempt had not reached it again), is
// work done over, not a repeat (an agent killed, its rollouts started
// over, then the fleet restored).
func TestReissuedByARestoredAttempt(t *testing.T) {
	c2 := time.Date(2026, 12, 6, 14, 44, 3, 0, time.UTC)
	tl := []timeline.Entry{
		{Time: c2, CheckpointID: "c2"},
		{Time: c2.Add(2 * time.Second), CheckpointID: "restore-e1", Data: events.RestoreCompleted{Source: "c2", Restored: []string{"t1-a2"}}},
	}
	saved := c2.Add(-5 * time.Second)
	for _, c := range []struct {
		name, earlier string
		ok            bool
	}{
		{"of the attempt the checkpoint held", "t1-a1", false},
		{"of an attempt started over before it", "t1", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := model(reissues{{Task: "t1", Digest: "d", Earlier: c.earlier, Delivered: saved, Saved: saved, Later: "t1-a2"}}, tl, 0)
			if got.OK != c.ok {
				t.Errorf("ok %v, want %v: %s", got.OK, c.ok, got.Detail)
			}
		})
	}
}
