package driver

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"unicode/utf8"
)

// SummaryKind marks the summary line among the lines of a launch's output.
const SummaryKind = "stillpoint.opencode.summary"

// maxText bounds a summary's text before it is encoded.
const maxText = 2048

// maxLine bounds the encoded summary line (Summary.Line), so that the
// whole line fits in the output tail a launch's receipt carries (4 KiB),
// after the end of the line before it. JSON may take six bytes for one of
// the text (\u0000), so bounding the text alone does not bound the line.
const maxLine = 3 << 10

// Summary is how a run or a continuation ended, read from OpenCode's own
// record of it (the --format json events, or the session's messages). The
// driver prints it as the last line of its output.
type Summary struct {
	Kind string `json:"kind"`
	// Session is the session's id.
	Session string `json:"session,omitempty"`
	// Continued tells the summary is of a continuation.
	Continued bool `json:"continued,omitempty"`
	// Steps counts the model steps of this launch.
	Steps int `json:"steps"`
	// Finish is the last step's finish reason ("stop" when the model
	// answered without a tool call).
	Finish string `json:"finish,omitempty"`
	// Text is the last step's text: the answer (at most 2 KiB; Truncated
	// tells it was cut).
	Text      string `json:"text,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
	// ToolErrors are the tool calls that failed (the model saw the error),
	// the first few.
	ToolErrors []string `json:"tool_errors,omitempty"`
	// UserTurns counts the session's user turns with content at the end;
	// a continuation checks they are the ones it started with.
	UserTurns int `json:"user_turns,omitempty"`
	// Error says why the launch failed: an error OpenCode reported, the
	// saved user turns changed, or the driver's own failure.
	Error string `json:"error,omitempty"`
}

// ErrFailed is wrapped by Summary.Err: the launch did not end with an
// answer.
var ErrFailed = errors.New("opencode-driver: the launch failed")

// Err returns nil for a launch that ended with an answer (its last step
// finished with "stop" and some text, and nothing failed), else an error
// wrapping ErrFailed that says why.
func (s Summary) Err() error {
	switch {
	case s.Error != "":
		return fmt.Errorf("%w: %s", ErrFailed, s.Error)
	case s.Steps == 0:
		return fmt.Errorf("%w: no model step ended", ErrFailed)
	case s.Finish != "stop":
		msg := fmt.Sprintf("the last step ended with %q, not an answer", s.Finish)
		if len(s.ToolErrors) > 0 {
			msg += "; tool errors: " + strings.Join(s.ToolErrors, "; ")
		}
		return fmt.Errorf("%w: %s", ErrFailed, msg)
	case strings.TrimSpace(s.Text) == "":
		return fmt.Errorf("%w: the last step has no text", ErrFailed)
	}
	return nil
}

// Line returns the summary as the driver prints it: one line of JSON (no
// newline) of at most maxLine bytes. What does not fit is cut, the
// longest of the text, the error and the tool errors first, the text
// marked Truncated.
func (s Summary) Line() []byte {
	s.ToolErrors = slices.Clone(s.ToolErrors) // cut below, not the caller's
	for {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(s) // a Summary has only strings, ints and bools
		b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
		if len(b) <= maxLine {
			return b
		}
		longest, n := (*string)(nil), 0
		for _, f := range append([]*string{&s.Text, &s.Error, &s.Session, &s.Finish}, pointers(s.ToolErrors)...) {
			if len(*f) > n {
				longest, n = f, len(*f)
			}
		}
		if longest == nil || n == 0 {
			return b // cannot happen: the fixed fields take far less
		}
		*longest, _ = clip(*longest, n/2)
		if longest == &s.Text {
			s.Truncated = true
		}
	}
}

// pointers returns pointers to ss's elements.
func pointers(ss []string) []*string {
	out := make([]*string, len(ss))
	for i := range ss {
		out[i] = &ss[i]
	}
	return out
}

// ReadSummary finds the summary line in a launch's output (the last one,
// as the driver prints it last).
func ReadSummary(out string) (Summary, error) {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		var s Summary
		if json.Unmarshal([]byte(lines[i]), &s) == nil && s.Kind == SummaryKind {
			return s, nil
		}
	}
	return Summary{}, fmt.Errorf("%w: the output holds no summary line", ErrFailed)
}

func clip(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n], true
}

func (s *Summary) toolError(tool, msg string) {
	if len(s.ToolErrors) < 4 {
		msg, _ = clip(msg, 200)
		s.ToolErrors = append(s.ToolErrors, tool+": "+msg)
	}
}

func (s *Summary) setText(t string) {
	s.Text, s.Truncated = clip(t, maxText)
}

// event is a line of `opencode run --format json`.
type event struct {
	Type      string        `json:"type"`
	SessionID string        `json:"sessionID"`
	Part      Part          `json:"part"`
	Error     *MessageError `json:"error,omitempty"`
}

// summariser reads `opencode run --format json` events into a Summary:
// step_start opens a step, text is a finished text part, tool_use a tool
// call that completed or failed, step_finish closes the step with its
// reason, error is a session error.
type summariser struct {
	s    Summary
	text strings.Builder // the current step's text
}

func (r *summariser) event(line []byte) (session string) {
	var e event
	if json.Unmarshal(line, &e) != nil {
		return ""
	}
	if r.s.Session == "" {
		r.s.Session = e.SessionID
	}
	switch e.Type {
	case "step_start":
		r.text.Reset()
	case "text":
		r.text.WriteString(e.Part.Text)
	case "tool_use":
		if e.Part.State != nil && e.Part.State.Status == "error" {
			r.s.toolError(e.Part.Tool, e.Part.State.Error)
		}
	case "step_finish":
		r.s.Steps++
		r.s.Finish = e.Part.Reason
		r.s.setText(r.text.String())
	case "error":
		msg := "an error"
		if e.Error != nil {
			msg = e.Error.String()
		}
		if r.s.Error != "" {
			msg = r.s.Error + "; " + msg
		}
		r.s.Error = msg
	}
	return e.SessionID
}

// copyEvents copies OpenCode's events from r to w line by line, summarising
// them; onSession is called with the session id once it is known.
func copyEvents(r io.Reader, w io.Writer, onSession func(string)) (Summary, error) {
	var sum summariser
	br := bufio.NewReaderSize(r, 64<<10)
	known := false
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			_, _ = w.Write(line)
			if id := sum.event(line); id != "" && !known {
				known = true
				onSession(id)
			}
		}
		if errors.Is(err, io.EOF) {
			return sum.s, nil
		}
		if err != nil {
			return sum.s, err
		}
	}
}

// summarise reads what a continuation did from the messages it added (or
// what the saved steps did, for a session that already answered): its
// steps, the last one's finish and text, tool errors, and the first error
// of a step. An answer not marked finished counts as a step (finish).
func summarise(msgs []Message) Summary {
	var s Summary
	for _, m := range msgs {
		if m.Info.Role != "assistant" {
			continue
		}
		if m.Info.Error != nil && s.Error == "" {
			s.Error = m.Info.Error.String()
		}
		for _, p := range m.Parts {
			if p.Type == "tool" && p.State != nil && p.State.Status == "error" {
				s.toolError(p.Tool, p.State.Error)
			}
		}
		if f := finish(m); f != "" {
			s.Steps++
			s.Finish = f
			s.setText(m.text())
		}
	}
	return s
}
