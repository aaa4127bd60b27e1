package prompttask

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Task is the part of a rollout's task payload an adapter reads:
//
//	{"task": "fix-add", "prompt": "Make test.sh pass.", ...}
type Task struct {
	// Name names the task to the model server (modelserver.TaskHeader):
	// the script a scripted model answers from. Optional: the rollout id
	// stands for it.
	Name string `json:"task,omitempty"`
	// Prompt is the first user message. Required, unless the payload is
	// a SWE-bench instance: its ProblemStatement is then the prompt.
	Prompt string `json:"prompt"`
	// ProblemStatement is a SWE-bench instance's issue (the swe kind's
	// payload), the prompt when Prompt is empty.
	ProblemStatement string `json:"problem_statement,omitempty"`
}

// ErrTask is wrapped by Parse for a payload an adapter cannot run.
var ErrTask = errors.New("bad task")

// Parse decodes and checks a task payload: the prompt is not blank and
// holds no NUL byte (no argv or environment can carry one), the name is a
// single line.
func Parse(raw json.RawMessage) (Task, error) {
	var t Task
	if err := json.Unmarshal(raw, &t); err != nil {
		return t, fmt.Errorf("%w: %w", ErrTask, err)
	}
	if strings.TrimSpace(t.Prompt) == "" {
		t.Prompt = t.ProblemStatement
	}
	if strings.TrimSpace(t.Prompt) == "" {
		return t, fmt.Errorf("%w: the prompt is empty", ErrTask)
	}
	if strings.ContainsRune(t.Prompt, 0) {
		return t, fmt.Errorf("%w: the prompt holds a NUL byte, which no argv or environment can carry", ErrTask)
	}
	if strings.ContainsAny(t.Name, "\x00\r\n") {
		return t, fmt.Errorf("%w: the task name must be a single line", ErrTask)
	}
	return t, nil
}
