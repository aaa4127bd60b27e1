package codex

import (
	"encoding/json"

	"github.com/stillpoint/stillpoint/participants/prompttask"
)

// Task is the part of a rollout's task payload the adapter reads
// (prompttask.Task).
type Task = prompttask.Task

// ErrTask is wrapped by ParseTask for a payload the adapter cannot run.
var ErrTask = prompttask.ErrTask

// ParseTask decodes and checks a task payload (prompttask.Parse).
func ParseTask(raw json.RawMessage) (Task, error) { return prompttask.Parse(raw) }
