package claude

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Task is the part of a rollout's task payload the adapter reads (the
// same shape as OpenCode's); the rest, what the owner's kind builds the
// sandbox from and grades with, it leaves alone:
//
//	{"task": "fix-add", "prompt": "Make test.sh pass.", ...}
type Task struct {
	// Name names the task to the model server (modelserver.TaskHeader):
	// the script a scripted model answers from. Optional: the rollout id
	// stands for it.
	Name string `json:"task,omitempty"`
	// Prompt is the first user message. Required.
	Prompt string `json:"prompt"`
}

// ErrTask is wrapped by ParseTask for a payload the adapter cannot run.
var ErrTask = errors.New("claude: bad task")

// ParseTask decodes and checks a task payload.
func ParseTask(raw json.RawMessage) (Task, error) {
	var t Task
	if err := json.Unmarshal(raw, &t); err != nil {
		return t, fmt.Errorf("%w: %w", ErrTask, err)
	}
	if strings.TrimSpace(t.Prompt) == "" {
		return t, fmt.Errorf("%w: the prompt is empty", ErrTask)
	}
	if strings.ContainsAny(t.Name, "\x00\r\n") {
		return t, fmt.Errorf("%w: the task name must be a single line", ErrTask)
	}
	return t, nil
}
