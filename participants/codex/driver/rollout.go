package driver

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Rollout is what the driver reads of a Codex session's rollout file,
// CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<thread>.jsonl: one JSON
// object per line ({"timestamp","type","payload"}), the session's
// response items among them as Codex sent and got them.
type Rollout struct {
	// Path is the file; Thread the session's id.
	Path, Thread string
	// UserTexts are the texts of the user messages, in order: Codex's
	// <environment_context>, the prompt, and one empty text for each
	// continuation.
	UserTexts []string
	// Completed counts the model responses Codex completed: those it
	// recorded the usage of (a token_usage_record line, or a token_count
	// event with its info).
	Completed int
	// Answer is the text of the last assistant message when the session
	// ended with it, a completed response with no call after it: the
	// model answered, and continuing would only ask it again.
	Answer   string
	Answered bool
}

// EnvironmentContext is how Codex's environment message to the model
// starts: a user message that is not the user's.
const EnvironmentContext = "<environment_context>"

// Prompt returns the session's prompt: its first user message that is no
// environment context.
func (r Rollout) Prompt() (string, bool) {
	for _, t := range r.UserTexts {
		if !strings.HasPrefix(t, EnvironmentContext) {
			return t, true
		}
	}
	return "", false
}

// rolloutLine is one line of a rollout file.
type rolloutLine struct {
	Type    string          `json:"type"`
	Payload json.RawMessage `json:"payload"`
}

// rolloutItem is the part of a response item the driver reads.
type rolloutItem struct {
	Type    string `json:"type"`
	Role    string `json:"role"`
	Content []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"content"`
}

func (it rolloutItem) text() string {
	var b strings.Builder
	for _, c := range it.Content {
		if c.Type == "input_text" || c.Type == "output_text" {
			b.WriteString(c.Text)
		}
	}
	return b.String()
}

// ErrNoRollout is returned by FindRollout when the folder holds no rollout
// of the thread.
var ErrNoRollout = errors.New("codex-driver: no rollout")

// FindRollout returns the rollout file of thread under codexHome's
// sessions (any thread's, the newest, when thread is "").
func FindRollout(codexHome, thread string) (string, error) {
	var found []string
	err := filepath.WalkDir(filepath.Join(codexHome, "sessions"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return fs.SkipAll
			}
			return err
		}
		name := d.Name()
		if !d.IsDir() && strings.HasPrefix(name, "rollout-") && strings.HasSuffix(name, thread+".jsonl") {
			found = append(found, p)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	if len(found) == 0 {
		return "", fmt.Errorf("%w of thread %q in %s", ErrNoRollout, thread, codexHome)
	}
	slices.Sort(found) // the names start with the time
	return found[len(found)-1], nil
}

// ReadRollout reads a rollout file. A last line cut short (a crash mid
// write) is left out.
func ReadRollout(path string) (Rollout, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Rollout{}, err
	}
	r := Rollout{Path: path}
	base := strings.TrimSuffix(filepath.Base(path), ".jsonl")
	if len(base) >= 36 {
		r.Thread = base[len(base)-36:]
	}
	var lastAssistant string
	var sawAssistant, callSince, usage bool
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var l rolloutLine
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		switch l.Type {
		case "response_item":
			var it rolloutItem
			if json.Unmarshal(l.Payload, &it) != nil {
				continue
			}
			switch {
			case it.Type == "message" && it.Role == "user":
				r.UserTexts = append(r.UserTexts, it.text())
				sawAssistant, callSince, r.Answered = false, false, false
			case it.Type == "message" && it.Role == "assistant":
				lastAssistant, sawAssistant, callSince = it.text(), true, false
			case it.Type == "function_call" || it.Type == "custom_tool_call" || it.Type == "function_call_output":
				callSince, r.Answered = true, false
			}
		case "token_usage_record":
			r.Completed++
			r.Answered, r.Answer = sawAssistant && !callSince, lastAssistant
		case "event_msg":
			var e struct {
				Type             string          `json:"type"`
				Info             json.RawMessage `json:"info"`
				LastAgentMessage *string         `json:"last_agent_message"`
			}
			_ = json.Unmarshal(l.Payload, &e)
			switch {
			case e.Type == "token_count" && len(e.Info) > 0 && string(e.Info) != "null":
				usage = true
			case e.Type == "task_complete" && e.LastAgentMessage != nil && *e.LastAgentMessage != "":
				r.Answered, r.Answer = true, *e.LastAgentMessage
			}
		}
	}
	if err := sc.Err(); err != nil {
		return r, err
	}
	if r.Completed == 0 && usage {
		r.Completed = 1 // a usage seen without its record
	}
	if !r.Answered {
		r.Answer = ""
	}
	return r, nil
}

// Decision is check's answer: whether the saved session can be continued.
type Decision struct {
	Continue bool   `json:"continue"`
	Thread   string `json:"thread,omitempty"`
	Reason   string `json:"reason"`
}

// Decide is the resume decision on a saved session: continue it only if
// its prompt is the task's and it holds a completed model response.
func Decide(r Rollout, prompt string) Decision {
	d := Decision{Thread: r.Thread}
	switch p, ok := r.Prompt(); {
	case !ok:
		d.Reason = "the saved session has no prompt"
	case p != prompt:
		d.Reason = "the saved session's prompt is not the task's"
	case r.Completed == 0:
		d.Reason = "the saved session holds no completed model response"
	default:
		d.Continue = true
		d.Reason = fmt.Sprintf("the saved session %s holds %d completed model responses", r.Thread, r.Completed)
	}
	return d
}
