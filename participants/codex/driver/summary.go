package driver

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// SummaryKind marks the summary line among the lines of a launch's output.
const SummaryKind = "stillpoint.codex.summary"

// maxText bounds a summary's text, so that the line fits in the output
// tail a launch's receipt carries (4 KiB), six bytes of JSON a byte at
// worst.
const maxText = 512

// Summary is how a run or a continuation ended, read from Codex's --json
// events (or, for a session that had answered already, its rollout). The
// driver prints it as the last line of its output.
type Summary struct {
	Kind string `json:"kind"`
	// Thread is the session's id.
	Thread string `json:"thread,omitempty"`
	// Continued tells the summary is of a continuation; Answered that the
	// saved session had answered already, and Codex did not run.
	Continued bool `json:"continued,omitempty"`
	Answered  bool `json:"answered,omitempty"`
	// Turns counts turn.completed events.
	Turns int `json:"turns"`
	// Text is the last agent message: the answer (cut to maxText bytes,
	// Truncated then).
	Text      string `json:"text,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
	// UserTurns counts the session's user messages at the end (Codex's
	// environment message and the prompt; an empty one per continuation).
	UserTurns int `json:"user_turns,omitempty"`
	// Error says why the launch failed: turn.failed, Codex's exit, the
	// saved user turns changed, or the driver's own failure.
	Error string `json:"error,omitempty"`
}

// ErrFailed is wrapped by Summary.Err: the launch did not end with an
// answer.
var ErrFailed = errors.New("codex-driver: the launch failed")

// Err returns nil for a launch that ended with an answer, else an error
// wrapping ErrFailed that says why.
func (s Summary) Err() error {
	switch {
	case s.Error != "":
		return fmt.Errorf("%w: %s", ErrFailed, clip(s.Error, 1024))
	case s.Turns == 0 && !s.Answered:
		return fmt.Errorf("%w: no turn completed", ErrFailed)
	case strings.TrimSpace(s.Text) == "":
		return fmt.Errorf("%w: no agent message", ErrFailed)
	}
	return nil
}

// Line returns the summary as the driver prints it: one line of JSON.
func (s Summary) Line() []byte {
	s.Error = clip(s.Error, maxText)
	if t := clip(s.Text, maxText); t != s.Text {
		s.Text, s.Truncated = t, true
	}
	b, _ := json.Marshal(s)
	return b
}

// ReadSummary finds the summary line in a launch's output (the last one).
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

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// event is a line of `codex exec --json`.
type event struct {
	Type     string `json:"type"`
	ThreadID string `json:"thread_id"`
	Message  string `json:"message"`
	Item     struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"item"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// copyEvents copies Codex's events from r to w line by line, summarising
// them: thread.started names the thread (onThread is called with it), an
// agent_message item is the answer so far, turn.completed a turn done,
// turn.failed a failure; the last error event is kept for a Codex that
// exits without a turn.failed.
func copyEvents(r io.Reader, w io.Writer, onThread func(string)) (sum Summary, lastError string, err error) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, rerr := br.ReadBytes('\n')
		if len(line) > 0 {
			_, _ = w.Write(line)
			var e event
			if json.Unmarshal(line, &e) == nil {
				switch e.Type {
				case "thread.started":
					if sum.Thread == "" && e.ThreadID != "" {
						sum.Thread = e.ThreadID
						onThread(e.ThreadID)
					}
				case "item.completed":
					if e.Item.Type == "agent_message" {
						sum.Text = e.Item.Text
					}
				case "turn.completed":
					sum.Turns++
				case "turn.failed":
					msg := "turn.failed"
					if e.Error != nil {
						msg += ": " + e.Error.Message
					}
					sum.Error = msg
				case "error":
					lastError = e.Message
				}
			}
		}
		if errors.Is(rerr, io.EOF) {
			return sum, lastError, nil
		}
		if rerr != nil {
			return sum, lastError, rerr
		}
	}
}
