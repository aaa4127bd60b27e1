package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
)

// Scripted is the adapter of the scripted coding-agent harness
// (cmd/scripted-harness): the task is {"task": <script name>, "prompt":
// <first user message>}, the session lives in a data folder in the
// sandbox, and the answer is the last line the harness prints.
type Scripted struct {
	// Binary is the harness's path inside the sandbox.
	Binary string
	// ModelURL is the model server the harness calls.
	ModelURL string
	// Timeout bounds one launch (paused time not counted); 0 for none.
	Timeout time.Duration
	// NoPause makes the adapter one that does not pause: its launches are
	// stopped at a checkpoint and relaunched after it.
	NoPause bool
	// DataRoot is where session folders go in the sandbox (default
	// /var/lib/scripted-harness).
	DataRoot string
}

// ScriptedTask is the task payload of the scripted adapter.
type ScriptedTask struct {
	Task   string `json:"task"`
	Prompt string `json:"prompt"`
}

type scriptedState struct {
	DataDir string `json:"data_dir"`
	Fresh   int    `json:"fresh,omitempty"`
}

// Name implements Adapter.
func (s *Scripted) Name() string { return "scripted" }

// PausesAtCheckpoints implements Adapter.
func (s *Scripted) PausesAtCheckpoints() bool { return !s.NoPause }

func (s *Scripted) root() string {
	if s.DataRoot == "" {
		return "/var/lib/scripted-harness"
	}
	return s.DataRoot
}

func decodeTask(raw json.RawMessage) (ScriptedTask, error) {
	var t ScriptedTask
	if err := json.Unmarshal(raw, &t); err != nil {
		return t, fmt.Errorf("scripted task: %w", err)
	}
	if t.Task == "" || strings.ContainsAny(t.Task, "\x00\n") {
		return t, errors.New("scripted task: task must be a non-empty single-line name")
	}
	return t, nil
}

// ValidateTask implements TaskValidator.
func (s *Scripted) ValidateTask(task json.RawMessage) error {
	_, err := decodeTask(task)
	return err
}

// NewState implements Adapter.
func (s *Scripted) NewState(r agentapi.Request) (json.RawMessage, error) {
	if _, err := decodeTask(r.Task); err != nil {
		return nil, err
	}
	return json.Marshal(scriptedState{DataDir: path.Join(s.root(), r.RolloutID, "0")})
}

// Command implements Adapter.
func (s *Scripted) Command(lc LaunchContext) (Command, error) {
	t, err := decodeTask(lc.Task)
	if err != nil {
		return Command{}, err
	}
	var st scriptedState
	if err := json.Unmarshal(lc.State, &st); err != nil || st.DataDir == "" {
		return Command{}, fmt.Errorf("scripted state %s: no data_dir", lc.State)
	}
	in := lc.Session.InSandbox
	argv := []string{in(s.Binary), "--model-url", s.ModelURL, "--task", t.Task, "--data", in(st.DataDir), "--work", in(lc.Session.Workdir)}
	if lc.Resume {
		argv = append(argv, "--continue")
	} else {
		argv = append(argv, "--prompt", t.Prompt)
	}
	argv = append(argv, "--episode", events.Episode{Rollout: lc.Rollout, Attempt: lc.Attempt}.String())
	return Command{Argv: argv, Dir: in(lc.Session.Workdir), Timeout: s.Timeout}, nil
}

// ResumeDecision implements Adapter: it asks the harness itself (its
// check command) whether the saved session starts with the task and holds
// a completed model response.
func (s *Scripted) ResumeDecision(ctx context.Context, lc LaunchContext) (Decision, error) {
	t, err := decodeTask(lc.Task)
	if err != nil {
		return Decision{}, err
	}
	var st scriptedState
	if err := json.Unmarshal(lc.State, &st); err != nil || st.DataDir == "" {
		return Decision{}, fmt.Errorf("scripted state %s: no data_dir", lc.State)
	}
	in := lc.Session.InSandbox
	res, err := lc.Exec(ctx, []string{in(s.Binary), "--check", "--task", t.Task, "--data", in(st.DataDir)})
	if err != nil {
		return Decision{}, err
	}
	var d struct {
		Continue bool   `json:"continue"`
		Reason   string `json:"reason"`
	}
	lines := strings.Split(strings.TrimSpace(res.Output), "\n")
	if res.ExitCode != 0 || json.Unmarshal([]byte(lines[len(lines)-1]), &d) != nil {
		return Decision{}, fmt.Errorf("scripted check exited %d: %s", res.ExitCode, res.Output)
	}
	if d.Continue {
		return Decision{Continue: true, Reason: d.Reason}, nil
	}
	st.Fresh++
	st.DataDir = path.Join(s.root(), lc.Rollout, fmt.Sprint(st.Fresh))
	fresh, _ := json.Marshal(st)
	return Decision{Reason: d.Reason, State: fresh}, nil
}

// Answer implements Adapter: the last line of the output.
func (s *Scripted) Answer(_ LaunchContext, out ExecResult) (json.RawMessage, error) {
	lines := strings.Split(strings.TrimRight(out.Output, "\n"), "\n")
	return json.Marshal(lines[len(lines)-1])
}
