package driver

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// What the driver reads of Claude Code's session file:
// $CLAUDE_CONFIG_DIR/projects/<the working directory, munged>/<id>.jsonl,
// one JSON record a line, appended to as the session goes. The records
// of type "user" and "assistant" are the conversation (an assistant reply
// is one record per content block, each with the reply's message id and,
// once the reply is whole, its stop reason); the others (attachments,
// request shapes, queue operations) are Claude's own bookkeeping.

// Record is one conversation record of a session file.
type Record struct {
	Type        string `json:"type"`
	UUID        string `json:"uuid"`
	IsSidechain bool   `json:"isSidechain"`
	IsMeta      bool   `json:"isMeta"`
	Message     struct {
		ID         string          `json:"id"`
		Role       string          `json:"role"`
		Model      string          `json:"model"`
		Content    json.RawMessage `json:"content"`
		StopReason string          `json:"stop_reason"`
	} `json:"message"`
}

// block is a content block of a record's message.
type block struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// blocks returns the content of r's message as blocks (a string is one
// text block).
func (r Record) blocks() []block {
	var s string
	if json.Unmarshal(r.Message.Content, &s) == nil {
		return []block{{Type: "text", Text: s}}
	}
	var bs []block
	_ = json.Unmarshal(r.Message.Content, &bs)
	return bs
}

// text returns the text blocks of r's message joined.
func (r Record) text() string {
	var b strings.Builder
	for _, x := range r.blocks() {
		if x.Type == "text" {
			b.WriteString(x.Text)
		}
	}
	return b.String()
}

// userTurn tells a user record with content a user typed or a CLI added:
// any block but a tool result.
func (r Record) userTurn() bool {
	if r.Type != "user" || r.IsMeta {
		return false
	}
	for _, b := range r.blocks() {
		if b.Type != "tool_result" {
			return true
		}
	}
	return false
}

// synthetic tells the assistant message Claude Code makes itself when it
// continues a session with a prompt: no model response.
func (r Record) synthetic() bool {
	return r.Type == "assistant" && (r.Message.Model == "<synthetic>" || r.text() == NoResponse)
}

// Transcript is a session file's conversation records, in order (the
// main thread's: subagents' sidechain records left out).
type Transcript []Record

// ErrNoSession is returned by ReadSession for a session with no file.
var ErrNoSession = errors.New("claude-driver: no saved session")

// SessionPath returns the session file of id under the config directory,
// or ErrNoSession.
func SessionPath(configDir, id string) (string, error) {
	m, _ := filepath.Glob(filepath.Join(configDir, "projects", "*", id+".jsonl"))
	if len(m) == 0 {
		return "", fmt.Errorf("%w: %s in %s", ErrNoSession, id, filepath.Join(configDir, "projects"))
	}
	return m[0], nil
}

// ReadSession reads the session id of the config directory.
func ReadSession(configDir, id string) (Transcript, error) {
	p, err := SessionPath(configDir, id)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ParseTranscript(f)
}

// ParseTranscript reads a session file's conversation records. A line
// that does not parse (the last one, cut by a crash mid-write) is
// skipped, as Claude Code skips it when it resumes.
func ParseTranscript(r io.Reader) (Transcript, error) {
	var t Transcript
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var rec Record
			if json.Unmarshal(line, &rec) == nil && (rec.Type == "user" || rec.Type == "assistant") && !rec.IsSidechain {
				t = append(t, rec)
			}
		}
		if errors.Is(err, io.EOF) {
			return t, nil
		}
		if err != nil {
			return t, err
		}
	}
}

// UserTurns returns the text of the user turns (userTurn), in order,
// less the continuation's marker turns (ContinuePrompt),
// which the model never sees.
func (t Transcript) UserTurns() []string {
	var out []string
	for _, r := range t {
		if r.userTurn() && r.text() != ContinuePrompt {
			out = append(out, r.text())
		}
	}
	return out
}

// Completed tells whether the session holds a completed model response:
// an assistant record, not synthetic, with a stop reason.
func (t Transcript) Completed() bool {
	for _, r := range t {
		if r.Type == "assistant" && !r.synthetic() && r.Message.StopReason != "" {
			return true
		}
	}
	return false
}

// Answer returns the model's answer when the session ends with it: the
// last records are a reply that ended its turn (stop reason end_turn)
// with no tool call, and the text of its blocks. A session that ends
// otherwise (a user turn, a tool call, a tool result) has none.
func (t Transcript) Answer() (string, bool) {
	if len(t) == 0 {
		return "", false
	}
	last := t[len(t)-1]
	if last.Type != "assistant" || last.synthetic() || last.Message.StopReason != "end_turn" {
		return "", false
	}
	var parts []string
	for i := len(t) - 1; i >= 0 && t[i].Type == "assistant" && t[i].Message.ID == last.Message.ID; i-- {
		for _, b := range t[i].blocks() {
			if b.Type == "tool_use" {
				return "", false
			}
		}
		parts = append([]string{t[i].text()}, parts...)
	}
	return strings.Join(parts, ""), true
}
