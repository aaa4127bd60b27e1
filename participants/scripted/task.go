package scripted

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
)

// Task is the task payload of a scripted rollout, what the agent's adapter
// and the owner's kind both read:
//
//	{"task": "task-007", "prompt": "Compute ...", "check": {"command": ["sh", "-c", "cat out/answer.txt"], "expect": "49"}}
type Task struct {
	// Script names the model script the harness follows (its --task, the
	// model server's key). Required: a non-empty single line.
	Script string `json:"task"`
	// Prompt is the first user message.
	Prompt string `json:"prompt"`
	// Check is what the owner's grade runs. The owner's kind requires it
	// and pins it into the session data when the session is set up, so the
	// agent cannot change it afterwards; the adapter ignores it.
	Check *Check `json:"check,omitempty"`
	// Files are written into the working directory when the owner's kind
	// makes the sandbox, by path relative to it: a small repository for
	// the harness to work on (OpenCode's edit and write tools, the
	// scripted harness's commands).
	Files map[string]string `json:"files,omitempty"`
}

// Check is a grade's check: a command run in the session's sandbox and
// the output it must print.
type Check struct {
	// Command is the argv run in the sandbox's working directory.
	Command []string `json:"command"`
	// Expect is the output the command must print, compared field by
	// field (runs of white space are one separator).
	Expect string `json:"expect"`
}

// Verdict is a scripted task's grade, the verify result.
type Verdict struct {
	// Reward is 1 when the check printed what it expects, else 0.
	Reward float64 `json:"reward"`
	// Detail says what was missing.
	Detail string `json:"detail,omitempty"`
}

// Sentinel errors.
var (
	// ErrTask is wrapped by ParseTask for a payload that is not a Task.
	ErrTask = errors.New("scripted: bad task")
	// ErrNoCheck is returned (wrapped) by the owner's kind for a task
	// without a check, and by its grade for a session whose data holds
	// none.
	ErrNoCheck = errors.New("scripted: no check")
)

// ParseTask decodes and checks a task payload.
func ParseTask(raw json.RawMessage) (Task, error) {
	var t Task
	if err := json.Unmarshal(raw, &t); err != nil {
		return t, fmt.Errorf("%w: %w", ErrTask, err)
	}
	if t.Script == "" || strings.ContainsAny(t.Script, "\x00\n") {
		return t, fmt.Errorf("%w: task must be a non-empty single-line name", ErrTask)
	}
	if t.Check != nil && len(t.Check.Command) == 0 {
		return t, fmt.Errorf("%w: check.command is empty", ErrTask)
	}
	for p := range t.Files {
		if p == "" || path.IsAbs(p) || strings.ContainsRune(p, 0) || slices.Contains(strings.Split(p, "/"), "..") || path.Clean(p) == "." {
			return t, fmt.Errorf("%w: files: %q is not a path inside the working directory", ErrTask, p)
		}
	}
	return t, nil
}
