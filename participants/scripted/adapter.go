package scripted

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/agent"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
)

// Adapter is the agent's adapter (agent.Adapter) of the scripted
// coding-agent harness (cmd/scripted-harness): the task is a Task, the
// session lives in a data folder in the sandbox, and the answer is the
// last line the harness prints.
type Adapter struct {
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

type scriptedState struct {
	DataDir string `json:"data_dir"`
	Fresh   int    `json:"fresh,omitempty"`
}

// The agent abilities the adapter has.
var (
	_ agent.Adapter       = (*Adapter)(nil)
	_ agent.TaskValidator = (*Adapter)(nil)
)

// Name implements agent.Adapter.
func (s *Adapter) Name() string { return "scripted" }

// PausesAtCheckpoints implements agent.Adapter.
func (s *Adapter) PausesAtCheckpoints() bool { return !s.NoPause }

func (s *Adapter) root() string {
	if s.DataRoot == "" {
		return "/var/lib/scripted-harness"
	}
	return s.DataRoot
}

// ValidateTask implements agent.TaskValidator.
func (s *Adapter) ValidateTask(task json.RawMessage) error {
	_, err := ParseTask(task)
	return err
}

// NewState implements agent.Adapter.
func (s *Adapter) NewState(r agentapi.Request) (json.RawMessage, error) {
	if _, err := ParseTask(r.Task); err != nil {
		return nil, err
	}
	return json.Marshal(scriptedState{DataDir: path.Join(s.root(), r.RolloutID, "0")})
}

// Command implements agent.Adapter.
func (s *Adapter) Command(lc agent.LaunchContext) (agent.Command, error) {
	t, err := ParseTask(lc.Task)
	if err != nil {
		return agent.Command{}, err
	}
	var st scriptedState
	if err := json.Unmarshal(lc.State, &st); err != nil || st.DataDir == "" {
		return agent.Command{}, fmt.Errorf("scripted state %s: no data_dir", lc.State)
	}
	in := lc.Session.InSandbox
	model := s.ModelURL
	if lc.ModelURL != "" {
		model = lc.ModelURL
	}
	argv := []string{in(s.Binary), "--model-url", model, "--task", t.Script, "--data", in(st.DataDir), "--work", in(lc.Session.Workdir)}
	if lc.Resume {
		argv = append(argv, "--continue")
	} else {
		argv = append(argv, "--prompt", t.Prompt)
	}
	argv = append(argv, "--episode", events.Episode{Rollout: lc.Rollout, Attempt: lc.Attempt}.String())
	return agent.Command{Argv: argv, Dir: in(lc.Session.Workdir), Timeout: s.Timeout}, nil
}

// ResumeDecision implements agent.Adapter: it asks the harness itself (its
// check command) whether the saved session starts with the task and holds
// a completed model response.
func (s *Adapter) ResumeDecision(ctx context.Context, lc agent.LaunchContext) (agent.Decision, error) {
	t, err := ParseTask(lc.Task)
	if err != nil {
		return agent.Decision{}, err
	}
	var st scriptedState
	if err := json.Unmarshal(lc.State, &st); err != nil || st.DataDir == "" {
		return agent.Decision{}, fmt.Errorf("scripted state %s: no data_dir", lc.State)
	}
	in := lc.Session.InSandbox
	res, err := lc.Exec(ctx, []string{in(s.Binary), "--check", "--task", t.Script, "--data", in(st.DataDir)})
	if err != nil {
		return agent.Decision{}, err
	}
	var d struct {
		Continue bool   `json:"continue"`
		Reason   string `json:"reason"`
	}
	lines := strings.Split(strings.TrimSpace(res.Output), "\n")
	if res.ExitCode != 0 || json.Unmarshal([]byte(lines[len(lines)-1]), &d) != nil {
		return agent.Decision{}, fmt.Errorf("scripted check exited %d: %s", res.ExitCode, res.Output)
	}
	if d.Continue {
		return agent.Decision{Continue: true, Reason: d.Reason}, nil
	}
	st.Fresh++
	st.DataDir = path.Join(s.root(), lc.Rollout, fmt.Sprint(st.Fresh))
	fresh, _ := json.Marshal(st)
	return agent.Decision{Reason: d.Reason, State: fresh}, nil
}

// Answer implements agent.Adapter: the last line of the output.
func (s *Adapter) Answer(_ agent.LaunchContext, out agent.ExecResult) (json.RawMessage, error) {
	lines := strings.Split(strings.TrimRight(out.Output, "\n"), "\n")
	return json.Marshal(lines[len(lines)-1])
}
