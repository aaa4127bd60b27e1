package driver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/participants/opencode/driver"
)

func message(role string, parts ...driver.Part) driver.Message {
	var m driver.Message
	m.Info.Role, m.Parts = role, parts
	return m
}

func text(s string) driver.Part { return driver.Part{Type: "text", Text: s} }

func tool(status string) driver.Part {
	return driver.Part{Type: "tool", Tool: "bash", CallID: "c1", State: &driver.ToolState{Status: status}}
}

func done(m driver.Message, finish string) driver.Message {
	m.Info.Finish, m.Info.Time.Completed = finish, 2
	return m
}

// finished is m with its step's finish recorded but not yet its end
// (OpenCode records the two one after the other).
func finished(m driver.Message, finish string) driver.Message {
	m.Info.Finish = finish
	return m
}

// The resume decision: only a session of the project that starts with the
// prompt and holds a whole model reply continues.
func TestDecide(t *testing.T) {
	const prompt, work = "Fix calc.sh.\n", "/work"
	user := message("user", text(prompt))
	failed := done(message("assistant", text("")), "")
	failed.Info.Error = &driver.MessageError{Name: "APIError"}
	for _, c := range []struct {
		name string
		dir  string
		msgs []driver.Message
		want bool
	}{
		{"empty", work, nil, false},
		{"only the prompt", work, []driver.Message{user}, false},
		{"another project", "/elsewhere", []driver.Message{user, done(message("assistant", text("ok")), "stop")}, false},
		{"another prompt", work, []driver.Message{message("user", text("Something else.")), done(message("assistant", text("ok")), "stop")}, false},
		{"cut mid-stream", work, []driver.Message{user, message("assistant", driver.Part{Type: "step-start"}, text(""))}, false},
		{"a call still streaming", work, []driver.Message{user, message("assistant", tool("pending"))}, false},
		{"a failed step", work, []driver.Message{user, failed}, false},
		{"killed mid-tool", work, []driver.Message{user, message("assistant", text("Running."), tool("running"))}, true},
		{"a finished step", work, []driver.Message{user, done(message("assistant", tool("completed")), "tool-calls")}, true},
		{"an answer whose step has not ended", work, []driver.Message{user, finished(message("assistant", text("Fixed.")), "stop")}, true},
		{"an answer not marked finished", work, []driver.Message{user, message("assistant", driver.Part{Type: "step-start"}, text("Fixed."))}, true},
		{"the prompt without its newline", work, []driver.Message{message("user", text("Fix calc.sh.")), done(message("assistant", text("ok")), "stop")}, true},
	} {
		e := driver.Export{Info: driver.SessionInfo{ID: "ses_1", Directory: c.dir}, Messages: c.msgs}
		d := driver.Decide(e, prompt, work)
		if d.Continue != c.want || d.Reason == "" || d.Session != "ses_1" {
			t.Errorf("%s: %+v, want continue %v", c.name, d, c.want)
		}
	}
}

// The summary of a run's events: the steps, the last one's finish reason
// and text; a session error fails it, and so does a run that ends on a
// tool call or without text.
func TestSummaryOfEvents(t *testing.T) {
	lines := func(ls ...string) string { return strings.Join(ls, "\n") + "\n" }
	ev := func(typ string, part map[string]any) string {
		b, _ := json.Marshal(map[string]any{"type": typ, "sessionID": "ses_1", "part": part})
		return string(b)
	}
	start := ev("step_start", map[string]any{"type": "step-start"})
	finish := func(r string) string { return ev("step_finish", map[string]any{"type": "step-finish", "reason": r}) }
	toolErr := ev("tool_use", map[string]any{"type": "tool", "tool": "edit", "state": map[string]any{"status": "error", "error": "oldString not found"}})
	for _, c := range []struct {
		name, events string
		steps        int
		text, fails  string
	}{
		{"answered", lines(start, ev("text", map[string]any{"type": "text", "text": "Reading."}), finish("tool-calls"),
			start, toolErr, finish("tool-calls"), start, ev("text", map[string]any{"type": "text", "text": "Done."}), finish("stop")), 3, "Done.", ""},
		{"ended on a tool", lines(start, toolErr, finish("tool-calls")), 1, "", "oldString not found"},
		{"no text", lines(start, finish("stop")), 1, "", "no text"},
		{"a session error", lines(start, `{"type":"error","sessionID":"ses_1","error":{"name":"APIError","data":{"message":"Cannot connect to API"}}}`), 0, "", "Cannot connect to API"},
		{"nothing", "", 0, "", "no model step"},
	} {
		var out bytes.Buffer
		s, err := driver.SummariseForTest(strings.NewReader(c.events), &out)
		if err != nil || out.String() != c.events {
			t.Fatalf("%s: %v; copied %q", c.name, err, out.String())
		}
		if s.Steps != c.steps || s.Text != c.text || (c.events != "" && s.Session != "ses_1") {
			t.Errorf("%s: %+v", c.name, s)
		}
		if err := s.Err(); (c.fails == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), c.fails)) {
			t.Errorf("%s: Err() = %v, want one saying %q", c.name, err, c.fails)
		}
	}
}

// The summary is the last summary line of an output, whatever came before.
func TestReadSummary(t *testing.T) {
	out := `{"type":"step_start"}` + "\n" + `{"kind":"` + driver.SummaryKind + `","steps":1,"finish":"stop","text":"old"}` + "\n" +
		"noise\n" + `{"kind":"` + driver.SummaryKind + `","steps":2,"finish":"stop","text":"new"}` + "\n"
	s, err := driver.ReadSummary(out)
	if err != nil || s.Text != "new" || s.Err() != nil {
		t.Fatalf("%+v %v", s, err)
	}
	if _, err := driver.ReadSummary("opencode-driver: crashed\n"); err == nil {
		t.Fatal("an output without a summary reads")
	}
}

// The config points OpenCode's one provider at the model server, with the
// headers and without timeouts, and lets tools reach outside the project.
func TestConfigJSON(t *testing.T) {
	var c struct {
		Model      string            `json:"model"`
		Autoupdate bool              `json:"autoupdate"`
		Permission map[string]string `json:"permission"`
		Provider   map[string]struct {
			Options struct {
				BaseURL string            `json:"baseURL"`
				Headers map[string]string `json:"headers"`
				Timeout any               `json:"timeout"`
			} `json:"options"`
		} `json:"provider"`
	}
	if err := json.Unmarshal(driver.ConfigJSON("http://127.0.0.1:9/", map[string]string{"X-Stillpoint-Task": "t1"}), &c); err != nil {
		t.Fatal(err)
	}
	p := c.Provider[driver.Provider]
	if c.Model != driver.Provider+"/"+driver.Model || c.Autoupdate || c.Permission["external_directory"] != "allow" ||
		p.Options.BaseURL != "http://127.0.0.1:9/v1" || p.Options.Headers["X-Stillpoint-Task"] != "t1" || p.Options.Timeout != false {
		t.Fatalf("config %+v", c)
	}
}

// Environ keeps everything of OpenCode in the session folder and names the
// project as PWD.
func TestEnviron(t *testing.T) {
	env := strings.Join(driver.Environ("/h", "/work", "/bin", 0), " ")
	for _, want := range []string{"HOME=/h/home", "XDG_DATA_HOME=/h/data", "XDG_CONFIG_HOME=/h/config", "XDG_CACHE_HOME=/h/cache",
		"XDG_STATE_HOME=/h/state", "TMPDIR=/h/tmp", "PWD=/work", "PATH=/bin", "OPENCODE_DISABLE_AUTOUPDATE=1", "OPENCODE_DISABLE_MODELS_FETCH=1",
		"OPENCODE_DISABLE_SHARE=1", "OPENCODE_DISABLE_LSP_DOWNLOAD=1", "OPENCODE_DISABLE_FFF=1", "OPENCODE_EXPERIMENTAL_BASH_DEFAULT_TIMEOUT_MS=3600000"} {
		if !strings.Contains(env+" ", want+" ") {
			t.Errorf("Environ lacks %s: %s", want, env)
		}
	}
}

// Bad command lines are usage errors, before anything runs.
func TestMainUsage(t *testing.T) {
	for _, args := range [][]string{nil, {"fly"}, {"run", "--home", "rel"}, {"run", "--opencode", "/oc", "--home", "/h", "--work", "/w"}, {"check", "extra"}} {
		var out, errs bytes.Buffer
		if code := driver.Main(context.Background(), args, &out, &errs); code != driver.ExitUsage {
			t.Errorf("%q: exit %d, want %d: %s", args, code, driver.ExitUsage, errs.String())
		}
	}
}

// A session whose last step answered is not continued (no model call):
// only a last assistant step that finished with text and no error is an
// answer.
func TestAnswered(t *testing.T) {
	user := message("user", text("Fix it."))
	failed := done(message("assistant", text("partial")), "stop")
	failed.Info.Error = &driver.MessageError{Name: "MessageAbortedError"}
	for _, c := range []struct {
		name string
		msgs []driver.Message
		want bool
	}{
		{"answered", []driver.Message{user, done(message("assistant", tool("completed")), "tool-calls"), done(message("assistant", text("Fixed.")), "stop")}, true},
		{"on a tool call", []driver.Message{user, done(message("assistant", tool("completed")), "tool-calls")}, false},
		{"killed mid-tool", []driver.Message{user, message("assistant", tool("running"))}, false},
		{"a failed step", []driver.Message{user, failed}, false},
		{"continued, not yet answered", []driver.Message{user, done(message("assistant", text("Fixed.")), "stop"), message("user")}, false},
		{"answered, the step not yet ended", []driver.Message{user, finished(message("assistant", text("Fixed.")), "stop")}, true},
		{"answered, the step not marked finished", []driver.Message{user, message("assistant", driver.Part{Type: "step-start"}, text("Fixed."))}, true},
		{"cut at its length, not marked finished", []driver.Message{user, message("assistant", text("Fix"), driver.Part{Type: "step-finish", Reason: "length"})}, false},
		{"cut mid-stream", []driver.Message{user, message("assistant", driver.Part{Type: "step-start"}, text(""))}, false},
		{"text and a call, not marked finished", []driver.Message{user, message("assistant", text("Running."), tool("running"))}, false},
		{"text and a call still streaming", []driver.Message{user, message("assistant", text("Running."), tool("pending"))}, false},
	} {
		if got := driver.AnsweredForTest(c.msgs); got != c.want {
			t.Errorf("%s: answered %v, want %v", c.name, got, c.want)
		}
	}
}

// A session whose final reply OpenCode had stored whole but not yet
// marked finished when it was stopped (real exports of that state: the
// text part holds the whole text, the message no finish; in the second the
// step-finish part is stored too): the reply counts as a completed
// response, and the session as answered, with that text as the answer,
// so a continuation makes no model call.
func TestAReplyNotMarkedFinishedIsTheAnswer(t *testing.T) {
	for _, c := range []struct {
		file  string
		n     int
		steps int
		text  string
	}{
		{"final-reply-not-marked-finished.json", 5, 5, "Fixed add: test.sh passes."},
		{"only-reply-not-marked-finished.json", 1, 1, "All done: nothing to fix, zebra-quartz."},
	} {
		b, err := os.ReadFile(filepath.Join("testdata", c.file))
		if err != nil {
			t.Fatal(err)
		}
		var e driver.Export
		if err := json.Unmarshal(b, &e); err != nil {
			t.Fatal(err)
		}
		last := e.Messages[len(e.Messages)-1]
		if last.Info.Finish != "" || last.Info.Time.Completed != 0 || last.Info.Error != nil {
			t.Fatalf("%s: the last message is marked: %+v", c.file, last.Info)
		}
		d := driver.Decide(e, prompt, e.Info.Directory)
		if !d.Continue || !strings.Contains(d.Reason, fmt.Sprintf("holds %d completed model responses", c.n)) || !strings.Contains(d.Reason, "answer") {
			t.Errorf("%s: %+v, want a continuation of %d completed responses, the last an answer", c.file, d, c.n)
		}
		s, ok := driver.AnswerForTest(e.Messages)
		if !ok || s.Err() != nil || s.Text != c.text || s.Steps != c.steps || s.Finish != "stop" {
			t.Errorf("%s: answered %v: %+v (%v), want the answer %q after %d steps", c.file, ok, s, s.Err(), c.text, c.steps)
		}
	}
}

// A summary whose text and errors take many bytes once encoded (<, & and
// newlines do) still reads back from the last 4 KiB of a launch's output,
// the tail its receipt keeps, and the reader learns the text was cut; one
// that fits is printed whole.
func TestSummaryLineFitsTheReceiptTail(t *testing.T) {
	long := strings.Repeat("if a < b && c > d {\n\treturn \"\x01\"\n}\n", 80) // 2.6 KiB, 4.5 encoded
	var tools []string
	for i := range 4 {
		tools = append(tools, fmt.Sprintf("bash: %d %s", i, strings.Repeat("<&>", 66)))
	}
	for _, s := range []driver.Summary{
		{Kind: driver.SummaryKind, Session: "ses_1", Steps: 9, Finish: "stop", Text: long},
		{Kind: driver.SummaryKind, Session: "ses_1", Steps: 9, Finish: "tool-calls", Text: long, Error: long, ToolErrors: tools},
		{Kind: driver.SummaryKind, Session: "ses_1", Steps: 1, Finish: "stop", Text: "Fixed <calc.py> & tested."},
	} {
		out := strings.Repeat(`{"type":"text","part":{"text":"<&>"}}`+"\n", 200) + string(s.Line()) + "\n"
		tail := out[len(out)-4096:]
		got, err := driver.ReadSummary(tail)
		if err != nil {
			t.Fatalf("summary with a %d-byte text: %v (line of %d bytes)", len(s.Text), err, len(s.Line()))
		}
		if got.Steps != s.Steps || got.Finish != s.Finish || (got.Err() == nil) != (s.Err() == nil) {
			t.Errorf("read back %+v, want %+v", got, s)
		}
		if cut := got.Text != s.Text; got.Truncated != cut || !strings.HasPrefix(s.Text, got.Text) || cut != (s.Text == long) {
			t.Errorf("text of %d bytes (truncated %v), want the whole %d bytes or, when they do not fit, a prefix marked truncated", len(got.Text), got.Truncated, len(s.Text))
		}
		if s.Error != "" && (got.Error == "" || !strings.HasPrefix(s.Error, got.Error)) {
			t.Errorf("error %q, want a prefix of %q", got.Error, s.Error)
		}
	}
}

// A folder whose store does not list its sessions (OpenCode fails, or
// prints what does not decode: a store the crash left unreadable) is a
// decision to start over, not an error that would fail the rollout; a
// check whose context ended is an error.
func TestCheckStartsOverOnAStoreThatDoesNotList(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ name, script, reason string }{
		{"fails", "echo 'database disk image is malformed' >&2; exit 1", "do not list"},
		{"garbage", "echo '[{\"id\": '", "do not list"},
		{"empty", "echo '[]'", "no saved session"},
	} {
		oc := filepath.Join(dir, c.name, "opencode")
		if err := os.MkdirAll(filepath.Dir(oc), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(oc, []byte("#!/bin/sh\n"+c.script+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		cfg := driver.Config{OpenCode: oc, Home: filepath.Join(dir, c.name, "home"), Workdir: dir, Title: "r1", Prompt: "p"}
		d, err := driver.Check(t.Context(), cfg, io.Discard)
		if err != nil || d.Continue || !strings.Contains(d.Reason, c.reason) {
			t.Errorf("%s: decision %+v, %v; want to start over: %q", c.name, d, err, c.reason)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if _, err := driver.Check(ctx, cfg, io.Discard); err == nil {
			t.Errorf("%s: a check with its context ended decided", c.name)
		}
	}
}
