package driver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// SummaryKind marks the summary line among the lines of a launch's output.
const SummaryKind = "stillpoint.claude.summary"

// maxText bounds a summary's text; maxLine the encoded line, so that it
// fits in the output tail a launch's receipt carries (4 KiB).
const (
	maxText = 2048
	maxLine = 3 << 10
)

// Summary is how a run or a continuation ended, read from Claude Code's
// result event (or, for a session that had already answered, from its
// session file). The driver prints it as the last line of its output.
type Summary struct {
	Kind string `json:"kind"`
	// Session is the session's id.
	Session string `json:"session,omitempty"`
	// Continued tells the summary is of a continuation.
	Continued bool `json:"continued,omitempty"`
	// Result tells a result event came (or the session had answered).
	Result bool `json:"result,omitempty"`
	// Turns is the result's num_turns; Stop its stop reason ("end_turn"
	// when the model answered).
	Turns int    `json:"turns,omitempty"`
	Stop  string `json:"stop,omitempty"`
	// Text is the answer (at most 2 KiB; Truncated tells it was cut).
	Text      string `json:"text,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
	// UserTurns counts the session's user turns at the end, less the
	// continuation's markers.
	UserTurns int `json:"user_turns,omitempty"`
	// Error says why the launch failed: the result was an error, the saved
	// user turns changed, or the driver's own failure.
	Error string `json:"error,omitempty"`
}

// ErrFailed is wrapped by Summary.Err: the launch did not end with an
// answer.
var ErrFailed = errors.New("claude-driver: the launch failed")

// Err returns nil for a launch that ended with an answer, else an error
// wrapping ErrFailed that says why.
func (s Summary) Err() error {
	switch {
	case s.Error != "":
		return fmt.Errorf("%w: %s", ErrFailed, s.Error)
	case !s.Result:
		return fmt.Errorf("%w: no result", ErrFailed)
	case s.Stop != "end_turn":
		return fmt.Errorf("%w: the session stopped with %q, not an answer", ErrFailed, s.Stop)
	case strings.TrimSpace(s.Text) == "":
		return fmt.Errorf("%w: the answer has no text", ErrFailed)
	}
	return nil
}

// event reads one stream-json event line: the result event sets the
// summary.
func (s *Summary) event(line []byte) {
	var e struct {
		Type      string `json:"type"`
		Subtype   string `json:"subtype"`
		IsError   bool   `json:"is_error"`
		Result    string `json:"result"`
		NumTurns  int    `json:"num_turns"`
		Stop      string `json:"stop_reason"`
		Terminal  string `json:"terminal_reason"`
		SessionID string `json:"session_id"`
		Errors    []any  `json:"errors"`
	}
	if !decode(line, &e) || e.Type != "result" {
		return
	}
	s.Result, s.Turns, s.Stop = true, e.NumTurns, e.Stop
	if e.SessionID != "" {
		s.Session = e.SessionID
	}
	s.setText(e.Result)
	if e.IsError || e.Subtype != "success" {
		msg := fmt.Sprintf("claude's result: %s (%s)", e.Subtype, e.Terminal)
		if e.Result != "" {
			msg += ": " + e.Result
		}
		if len(e.Errors) > 0 {
			msg += fmt.Sprintf(" %v", e.Errors)
		}
		s.addError(msg)
	}
}

func (s *Summary) addError(msg string) {
	if s.Error != "" {
		s.Error += "; "
	}
	s.Error += msg
}

func (s *Summary) setText(t string) {
	s.Text, s.Truncated = clip(t, maxText)
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

// Line returns the summary as the driver prints it: one line of JSON (no
// newline) of at most maxLine bytes, the text and the error cut to fit.
func (s Summary) Line() []byte {
	for {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		_ = enc.Encode(s)
		b := bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
		if len(b) <= maxLine || (s.Text == "" && s.Error == "") {
			return b
		}
		if len(s.Text) >= len(s.Error) {
			s.Text, _ = clip(s.Text, len(s.Text)/2)
			s.Truncated = true
		} else {
			s.Error, _ = clip(s.Error, len(s.Error)/2)
		}
	}
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
