package driver_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/participants/claude/driver"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
)

// The driver's continuation prompt and Claude's synthetic message are the
// ones the relay's edit removes.
func TestTheRelayEditKnowsTheContinuation(t *testing.T) {
	if driver.ContinuePrompt != relay.ClaudeContinuePrompt || driver.NoResponse != relay.ClaudeNoResponse {
		t.Fatalf("driver %q %q, relay %q %q", driver.ContinuePrompt, driver.NoResponse, relay.ClaudeContinuePrompt, relay.ClaudeNoResponse)
	}
}

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// A session Claude Code 2.1.332 wrote: killed mid-tool, continued with the
// marker prompt, answered. Its user turns are the prompt alone (the
// marker and tool results are none), it holds a completed response, and
// it ends with the answer.
func TestTranscriptOfAContinuedSession(t *testing.T) {
	tr, err := driver.ParseTranscript(strings.NewReader(readTestdata(t, "continued.jsonl")))
	if err != nil {
		t.Fatal(err)
	}
	if got := tr.UserTurns(); !slices.Equal(got, []string{"sleep please"}) {
		t.Fatalf("user turns %q", got)
	}
	if !tr.Completed() {
		t.Fatal("no completed response")
	}
	if a, ok := tr.Answer(); !ok || a != "Done sleeping" {
		t.Fatalf("answer %q %v", a, ok)
	}
}

// A session cut short: at the tool call (killed mid-tool), at the
// interrupted result, at the synthetic message, at a partial line (killed
// mid-write), before any response. None has an answer; only those with a
// model response count as completed.
func TestTranscriptCutShort(t *testing.T) {
	lines := strings.SplitAfter(readTestdata(t, "continued.jsonl"), "\n")
	for _, c := range []struct {
		name      string
		n         int
		partial   bool
		completed bool
	}{
		{"the prompt only", 2, false, false},
		{"the text block of the first reply", 3, false, true},
		{"the tool call", 4, false, true},
		{"the interrupted result", 5, false, true},
		{"the synthetic message", 6, false, true},
		{"the marker turn", 7, false, true},
		{"half of the answer's line", 11, true, true},
	} {
		text := strings.Join(lines[:c.n], "")
		if c.partial {
			text = strings.Join(lines[:c.n-1], "") + lines[c.n-1][:len(lines[c.n-1])/2]
		}
		tr, err := driver.ParseTranscript(strings.NewReader(text))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if _, ok := tr.Answer(); ok {
			t.Errorf("%s: an answer", c.name)
		}
		if tr.Completed() != c.completed {
			t.Errorf("%s: completed %v", c.name, tr.Completed())
		}
		if got := tr.UserTurns(); !slices.Equal(got, []string{"sleep please"}) {
			t.Errorf("%s: user turns %q", c.name, got)
		}
	}
}

// The summary line fits the output tail and says why a launch failed.
func TestSummary(t *testing.T) {
	s := driver.Summary{Kind: driver.SummaryKind, Result: true, Stop: "end_turn", Text: strings.Repeat("é", 4000)}
	line := s.Line()
	if len(line) > 3<<10 {
		t.Fatalf("line of %d bytes", len(line))
	}
	got, err := driver.ReadSummary("event\n" + string(line) + "\n")
	if err != nil || !got.Truncated || got.Err() != nil {
		t.Fatalf("%+v %v", got, err)
	}
	for _, bad := range []driver.Summary{{Result: true, Stop: "tool_deferred", Text: "x"}, {Result: true, Stop: "end_turn"}, {Stop: "end_turn", Text: "x"}, {Result: true, Stop: "end_turn", Text: "x", Error: "no"}} {
		if bad.Err() == nil {
			t.Errorf("%+v: no error", bad)
		}
	}
}
