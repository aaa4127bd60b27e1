package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/stillpoint/stillpoint/internal/atomicfile"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// SessionFile is the session's file in the data folder.
const SessionFile = "session.json"

// Session is what the harness keeps on disk.
type Session struct {
	Task     string                `json:"task"`
	Messages []modelserver.Message `json:"messages"`
}

// Config configures a run.
type Config struct {
	// ModelURL is the server's base URL; Model its model name.
	ModelURL string
	Model    string
	// Task names the task (sent as modelserver.TaskHeader).
	Task string
	// Prompt is the user message of a new session.
	Prompt string
	// DataDir holds the session file.
	DataDir string
	// WorkDir is where tool commands run.
	WorkDir string
	// Episode is sent as modelserver.EpisodeHeader.
	Episode string
	// Continue continues the saved session without a user message.
	Continue bool
	// MaxTurns bounds the model calls of one run (default 32).
	MaxTurns int
	// Out receives the final answer.
	Out io.Writer
}

// sessionFile is the session file of dataDir.
func sessionFile(dataDir string) atomicfile.JSON[Session] {
	return atomicfile.JSON[Session]{Path: filepath.Join(dataDir, SessionFile)}
}

// Load reads a saved session; a missing file is (nil, nil).
func Load(dataDir string) (*Session, error) {
	s, err := sessionFile(dataDir).Read()
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("harness: %w", err)
	}
	return &s, nil
}

// Decision is the answer of Check: whether a relaunch can continue the
// saved session, and why.
type Decision struct {
	Continue bool   `json:"continue"`
	Reason   string `json:"reason"`
}

// Check decides whether the saved session in dataDir can be continued: it
// must be of task and start with its user turn, and hold a completed model
// response; otherwise the relaunch starts over.
func Check(dataDir, task string) Decision {
	s, err := Load(dataDir)
	switch {
	case err != nil:
		return Decision{Reason: "the saved session does not read: " + err.Error()}
	case s == nil:
		return Decision{Reason: "no saved session"}
	case s.Task != task || len(s.Messages) == 0 || s.Messages[0].Role != "user":
		return Decision{Reason: "the saved session does not start with the task"}
	}
	for _, m := range s.Messages {
		if m.Role == "assistant" {
			return Decision{Continue: true, Reason: fmt.Sprintf("the saved session holds %d messages with a model response", len(s.Messages))}
		}
	}
	return Decision{Reason: "the saved session holds no model response"}
}

type toolArgs struct {
	Command string `json:"command"`
}

// Run runs the agent loop until the model answers without tool calls.
func Run(ctx context.Context, cfg Config) error {
	if cfg.MaxTurns == 0 {
		cfg.MaxTurns = 32
	}
	if cfg.Out == nil {
		cfg.Out = io.Discard
	}
	s, err := Load(cfg.DataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
		return err
	}
	file := sessionFile(cfg.DataDir) // written durably at every turn
	switch {
	case cfg.Continue && s == nil:
		return errors.New("harness: --continue without a saved session")
	case cfg.Continue && s.Task != cfg.Task:
		return fmt.Errorf("harness: the saved session is of task %q, not %q", s.Task, cfg.Task)
	case !cfg.Continue:
		prompt, _ := json.Marshal(cfg.Prompt)
		s = &Session{Task: cfg.Task, Messages: []modelserver.Message{{Role: "user", Content: prompt}}}
		if err := file.Write(*s); err != nil {
			return err
		}
	}
	var savedAt time.Time // when this process saved the last reply
	for range cfg.MaxTurns {
		last := s.Messages[len(s.Messages)-1]
		if last.Role == "assistant" {
			calls := pendingCalls(s)
			if len(calls) == 0 {
				var text string
				_ = json.Unmarshal(last.Content, &text)
				fmt.Fprintln(cfg.Out, text)
				return nil
			}
			for _, tc := range calls {
				out, signalled := runTool(ctx, cfg.WorkDir, tc)
				if signalled && ctx.Err() == nil {
					// A stop signals the harness and every process of its
					// tree at about the same time, so the tool may be
					// seen dead before the harness sees its own signal.
					// A tool killed by a signal is taken as interrupted
					// if the harness is interrupted soon after.
					t := time.NewTimer(InterruptGrace)
					select {
					case <-ctx.Done():
					case <-t.C:
					}
					t.Stop()
				}
				if ctx.Err() != nil {
					// Interrupted: the tool did not complete, and its call
					// stays pending in the session, so that a continuation
					// runs it again.
					return fmt.Errorf("harness: interrupted in tool call %s: %w", tc.ID, ctx.Err())
				}
				content, _ := json.Marshal(out)
				s.Messages = append(s.Messages, modelserver.Message{Role: "tool", ToolCallID: tc.ID, Content: content})
				if err := file.Write(*s); err != nil {
					return err
				}
			}
			continue
		}
		reply, err := call(ctx, cfg, s.Messages, savedAt)
		if err != nil {
			return err
		}
		s.Messages = append(s.Messages, reply)
		if err := file.Write(*s); err != nil {
			return err
		}
		savedAt = time.Now()
	}
	return fmt.Errorf("harness: no answer after %d model calls", cfg.MaxTurns)
}

// pendingCalls returns the tool calls of the last assistant message that
// have no tool result yet.
func pendingCalls(s *Session) []modelserver.ToolCall {
	last := s.Messages[len(s.Messages)-1]
	var calls []modelserver.ToolCall
	_ = json.Unmarshal(last.ToolCalls, &calls)
	return calls
}

// InterruptGrace is how long the harness waits, after a tool is killed by
// a signal, for an interruption of its own before it keeps the tool's
// result.
const InterruptGrace = time.Second

// runTool runs one tool call and returns its output, and whether the tool
// was killed by a signal.
func runTool(ctx context.Context, dir string, tc modelserver.ToolCall) (string, bool) {
	var a toolArgs
	if err := json.Unmarshal([]byte(tc.Function.Arguments), &a); err != nil || tc.Function.Name != "bash" {
		return fmt.Sprintf("error: unknown tool %q or bad arguments", tc.Function.Name), false
	}
	cmd := exec.CommandContext(ctx, "/bin/sh", "-c", a.Command)
	cmd.Dir = dir
	// The tool runs in its own process group, which an interruption kills
	// whole: a shell's children would otherwise hold its output open.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		var ee *exec.ExitError
		signalled := false
		if errors.As(err, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok {
				// A shell reports a child killed by a signal as 128+n.
				signalled = ws.Signaled() || ws.ExitStatus() > 128
			}
		}
		return fmt.Sprintf("%s\nexit: %v", out, err), signalled
	}
	return string(out), false
}

// CallTries is how many times a model call that got no answer on its
// connection is sent in all.
const CallTries = 4

func call(ctx context.Context, cfg Config, msgs []modelserver.Message, savedAt time.Time) (modelserver.Message, error) {
	b, _ := json.Marshal(modelserver.Request{Model: cfg.Model, Messages: msgs})
	cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	var resp *http.Response
	try := 0
	err := poll.Until(cctx, poll.Backoff(200*time.Millisecond, 800*time.Millisecond), func() (bool, error) {
		try++
		req, err := http.NewRequestWithContext(cctx, http.MethodPost, cfg.ModelURL+"/v1/chat/completions", bytes.NewReader(b))
		if err != nil {
			return false, err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(modelserver.TaskHeader, cfg.Task)
		if cfg.Episode != "" {
			req.Header.Set(modelserver.EpisodeHeader, cfg.Episode)
		}
		if !savedAt.IsZero() {
			req.Header.Set(modelserver.SavedHeader, savedAt.UTC().Format(time.RFC3339Nano))
		}
		resp, err = http.DefaultClient.Do(req)
		if err == nil {
			return true, nil
		}
		// No answer began: the connection was refused, reset or closed
		// before the reply. A harness frozen by a checkpoint between
		// opening its connection and writing the request finds it closed
		// by the server's header timeout when it thaws (or a kept-alive
		// one closed as idle); the server read no request, so it is sent
		// again, as model SDKs send a call that failed on its connection.
		if try == CallTries || cctx.Err() != nil {
			return false, fmt.Errorf("harness: model call (try %d of %d): %w", try, CallTries, err)
		}
		fmt.Fprintf(os.Stderr, "harness: model call failed on its connection (try %d of %d), sending it again: %v\n", try, CallTries, err)
		return false, nil
	})
	if err != nil {
		return modelserver.Message{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return modelserver.Message{}, fmt.Errorf("harness: model answered %d: %s", resp.StatusCode, body)
	}
	var out struct {
		Choices []struct {
			Message struct {
				Content   string                 `json:"content"`
				ToolCalls []modelserver.ToolCall `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || len(out.Choices) == 0 {
		return modelserver.Message{}, fmt.Errorf("harness: model answer does not decode: %v", err)
	}
	m := out.Choices[0].Message
	content, _ := json.Marshal(m.Content)
	msg := modelserver.Message{Role: "assistant", Content: content}
	if len(m.ToolCalls) > 0 {
		msg.ToolCalls, _ = json.Marshal(m.ToolCalls)
	}
	return msg, nil
}
