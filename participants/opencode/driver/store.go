package driver

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// Export is a saved OpenCode session as `opencode export <id>` prints it:
// the session and its messages, each with its parts.
type Export struct {
	Info     SessionInfo `json:"info"`
	Messages []Message   `json:"messages"`
}

// SessionInfo is the part of a session's record the driver reads (also
// the rows of `opencode session list --format json`).
type SessionInfo struct {
	ID        string `json:"id"`
	Title     string `json:"title"`
	Directory string `json:"directory"`
	// Updated is the session's last change, in ms (the listing's field).
	Updated int64 `json:"updated,omitempty"`
}

// Message is one message of a session with its parts, as the export and
// the server's GET /session/<id>/message give it.
type Message struct {
	Info  MessageInfo `json:"info"`
	Parts []Part      `json:"parts"`
}

// MessageInfo is a message's record.
type MessageInfo struct {
	ID   string `json:"id"`
	Role string `json:"role"`
	// Finish is an assistant message's finish reason: "tool-calls",
	// "stop", ...; empty while the step runs (or if it never ended).
	Finish string `json:"finish,omitempty"`
	Time   struct {
		Created   int64 `json:"created"`
		Completed int64 `json:"completed,omitempty"`
	} `json:"time"`
	// Error is an assistant message's error (an API error, an abort).
	Error *MessageError `json:"error,omitempty"`
}

// MessageError is how OpenCode records a failed step.
type MessageError struct {
	Name string `json:"name"`
	Data struct {
		Message string `json:"message"`
	} `json:"data"`
}

// String returns the error's name and message.
func (e *MessageError) String() string {
	if e.Data.Message != "" {
		return e.Name + ": " + e.Data.Message
	}
	return e.Name
}

// Part is one part of a message: text, a tool call, a step's start or
// finish, and others the driver does not read.
type Part struct {
	Type string `json:"type"`
	// Text is a text part's text (empty until the part is complete: a
	// reply cut mid-stream is stored empty).
	Text      string `json:"text,omitempty"`
	Synthetic bool   `json:"synthetic,omitempty"`
	// Tool and CallID name a tool part's tool and call; State is how far
	// it got.
	Tool   string     `json:"tool,omitempty"`
	CallID string     `json:"callID,omitempty"`
	State  *ToolState `json:"state,omitempty"`
	// Reason is a step-finish part's finish reason.
	Reason string `json:"reason,omitempty"`
}

// ToolState is a tool part's state: pending (its call still streaming),
// running, completed or error.
type ToolState struct {
	Status string          `json:"status"`
	Input  json.RawMessage `json:"input,omitempty"`
	Output string          `json:"output,omitempty"`
	Error  string          `json:"error,omitempty"`
}

// text returns the message's text: its text parts, joined.
func (m Message) text() string {
	var b strings.Builder
	for _, p := range m.Parts {
		if p.Type == "text" {
			b.WriteString(p.Text)
		}
	}
	return b.String()
}

// UserTurns returns the text of every user message that has some: the
// turns the model sees. (The empty user message a continuation adds has
// none.)
func UserTurns(msgs []Message) []string {
	var out []string
	for _, m := range msgs {
		if m.Info.Role != "user" {
			continue
		}
		if t := m.text(); t != "" {
			out = append(out, t)
		}
	}
	return out
}

// completedResponse tells whether an assistant message holds a whole reply
// of the model: its step finished, it is an answer not yet marked
// finished (unmarkedAnswer), or a tool call of it arrived whole (running,
// completed or failed: a step that a crash caught mid-tool).
func completedResponse(m Message) bool {
	if m.Info.Role != "assistant" || m.Info.Error != nil {
		return false
	}
	if m.Info.Finish != "" || unmarkedAnswer(m) {
		return true
	}
	for _, p := range m.Parts {
		if p.Type == "tool" && p.State != nil && p.State.Status != "pending" {
			return true
		}
	}
	return false
}

// unmarkedAnswer tells whether m is a reply of text alone that OpenCode
// stored but did not mark finished: no finish, no error, no tool call,
// and some text. OpenCode stores a text part's text only when the
// provider ends the text, which @ai-sdk/openai-compatible does once the
// reply's stream has ended (the deltas are not stored: a reply cut
// mid-stream is stored empty), and records the step's finish after that,
// with the step-finish part and then the message; a checkpoint that
// freezes it in between keeps a whole reply with no finish. (A reply a
// failed stream cut is stored with its partial text too, but with the
// step's error.)
func unmarkedAnswer(m Message) bool {
	if m.Info.Role != "assistant" || m.Info.Error != nil || m.Info.Finish != "" || strings.TrimSpace(m.text()) == "" {
		return false
	}
	for _, p := range m.Parts {
		if p.Type == "tool" {
			return false
		}
	}
	return true
}

// finish returns the finish reason of m's step: the message's, else, for
// an answer not marked finished, its step-finish part's, else "stop" (a
// reply of text alone).
func finish(m Message) string {
	if m.Info.Finish != "" || !unmarkedAnswer(m) {
		return m.Info.Finish
	}
	for _, p := range slices.Backward(m.Parts) {
		if p.Type == "step-finish" && p.Reason != "" {
			return p.Reason
		}
	}
	return "stop"
}

// Decision is whether a relaunch continues the saved session (the answer
// of the check command).
type Decision struct {
	Continue bool   `json:"continue"`
	Reason   string `json:"reason"`
	// Session is the saved session's id, when there is one.
	Session string `json:"session,omitempty"`
}

// Decide is the resume decision on a saved session: it continues only a
// session of workdir that starts with the task's prompt as its first user
// turn and holds a completed model response; otherwise the relaunch
// starts over in a fresh folder.
func Decide(e Export, prompt, workdir string) Decision {
	d := Decision{Session: e.Info.ID}
	switch {
	case len(e.Messages) == 0:
		d.Reason = "the saved session holds no message"
		return d
	case workdir != "" && e.Info.Directory != "" && e.Info.Directory != workdir:
		d.Reason = fmt.Sprintf("the saved session is of directory %s, not %s", e.Info.Directory, workdir)
		return d
	case e.Messages[0].Info.Role != "user" || strings.TrimSpace(e.Messages[0].text()) != strings.TrimSpace(prompt):
		d.Reason = "the saved session does not start with the task's prompt"
		return d
	}
	n := 0
	for _, m := range e.Messages {
		if completedResponse(m) {
			n++
		}
	}
	if n == 0 {
		d.Reason = "the saved session holds no completed model response"
		return d
	}
	d.Continue = true
	d.Reason = fmt.Sprintf("the saved session starts with the task and holds %d completed model responses in %d messages", n, len(e.Messages))
	if _, ok := answer(e.Messages); ok {
		d.Reason += "; the last is the answer"
	}
	return d
}
