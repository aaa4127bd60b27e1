package exec

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/agent"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/prompttask"
)

// Adapter is the agent's adapter (agent.Adapter) of a harness defined by
// a Spec: every launch, check and answer is the spec's, its placeholders
// filled from the launch.
type Adapter struct {
	// Spec is the harness. Required.
	Spec *Spec
	// ModelURL is the model server the harness calls (its base URL,
	// without /v1), unless the launch has the sandbox's relay.
	ModelURL string
	// Timeout bounds one launch (paused time not counted; 0 for none).
	Timeout time.Duration
	// NoPause makes the adapter one that does not pause, whatever the
	// spec says.
	NoPause bool
}

// state is the adapter's state in the bookmark.
type state struct {
	// Session is the session folder in the sandbox,
	// <SessionRoot>/<rollout>/<Fresh>.
	Session string `json:"session"`
	// Fresh counts the fresh starts.
	Fresh int `json:"fresh,omitempty"`
}

// The agent abilities the adapter has.
var (
	_ agent.Adapter       = (*Adapter)(nil)
	_ agent.TaskValidator = (*Adapter)(nil)
)

// Task is the part of a task payload the adapter reads
// (prompttask.Task); the rest is the owner's kind's. Its Name is the
// spec's {task}, its Prompt {prompt}.
type Task = prompttask.Task

// ErrTask is wrapped by ParseTask for a payload the adapter cannot run.
var ErrTask = prompttask.ErrTask

// ParseTask decodes and checks a task payload (prompttask.Parse).
func ParseTask(raw json.RawMessage) (Task, error) { return prompttask.Parse(raw) }

// Name implements agent.Adapter.
func (a *Adapter) Name() string { return "exec" }

// PausesAtCheckpoints implements agent.Adapter: the spec's pause, unless
// NoPause.
func (a *Adapter) PausesAtCheckpoints() bool { return a.Spec.Pause && !a.NoPause }

// ValidateTask implements agent.TaskValidator.
func (a *Adapter) ValidateTask(task json.RawMessage) error {
	_, err := ParseTask(task)
	return err
}

func parseState(raw json.RawMessage) (state, error) {
	var st state
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, fmt.Errorf("exec: adapter state %s: %w", raw, err)
	}
	if st.Session == "" {
		return st, fmt.Errorf("exec: adapter state %s: no session folder", raw)
	}
	return st, nil
}

// NewState implements agent.Adapter: the session folder
// <SessionRoot>/<rollout>/0.
func (a *Adapter) NewState(r agentapi.Request) (json.RawMessage, error) {
	if _, err := ParseTask(r.Task); err != nil {
		return nil, err
	}
	return json.Marshal(state{Session: path.Join(a.Spec.SessionRoot, r.RolloutID, "0")})
}

// values returns the placeholders' values for lc.
func (a *Adapter) values(lc agent.LaunchContext) (map[string]string, state, error) {
	t, err := ParseTask(lc.Task)
	if err != nil {
		return nil, state{}, err
	}
	st, err := parseState(lc.State)
	if err != nil {
		return nil, st, err
	}
	name := t.Name
	if name == "" {
		name = lc.Rollout
	}
	model := a.ModelURL
	if lc.ModelURL != "" {
		model = lc.ModelURL // the sandbox's model relay
	}
	root := lc.Session.Root
	if root == "/" {
		root = ""
	}
	in := lc.Session.InSandbox
	return map[string]string{
		PlaceholderPrompt:      t.Prompt,
		PlaceholderTask:        name,
		PlaceholderRollout:     lc.Rollout,
		PlaceholderAttempt:     strconv.Itoa(lc.Attempt),
		PlaceholderEpisode:     events.Episode{Rollout: lc.Rollout, Attempt: lc.Attempt}.String(),
		PlaceholderModelURL:    strings.TrimSuffix(model, "/"),
		PlaceholderSession:     in(st.Session),
		PlaceholderWorkdir:     in(lc.Session.Workdir),
		PlaceholderSandboxRoot: strings.TrimSuffix(root, "/"),
	}, st, nil
}

func expandAll(ts []Template, vals map[string]string) []string {
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = t.Expand(vals)
	}
	return out
}

// Command implements agent.Adapter: the spec's launch, or with lc.Resume
// its continue, placeholders filled. The environment is the spec's alone,
// with PATH DefaultPath unless the spec sets it.
func (a *Adapter) Command(lc agent.LaunchContext) (agent.Command, error) {
	vals, _, err := a.values(lc)
	if err != nil {
		return agent.Command{}, err
	}
	c := a.Spec.Launch
	if lc.Resume {
		if a.Spec.Continue == nil {
			return agent.Command{}, fmt.Errorf("exec: asked to continue a saved session, but the spec's continue is %q", Never)
		}
		c = *a.Spec.Continue
	}
	env := make([]string, 0, len(c.Env)+1)
	path := false
	for _, v := range c.Env {
		env = append(env, v.Name+"="+v.Value.Expand(vals))
		path = path || v.Name == "PATH"
	}
	if !path {
		env = append(env, "PATH="+DefaultPath)
	}
	return agent.Command{Argv: expandAll(c.Argv, vals), Env: env, Dir: a.Spec.Dir.Expand(vals), Timeout: a.Timeout, RelayEdits: c.RelayEdits}, nil
}

// ResumeDecision implements agent.Adapter: with continue "never", a start
// over in a fresh folder; otherwise the spec's check decides, by its exit
// status: 0 continues, 1 starts over in a fresh folder, anything else is
// an error with the check's output. Its last line of output is the
// decision's reason.
func (a *Adapter) ResumeDecision(ctx context.Context, lc agent.LaunchContext) (agent.Decision, error) {
	vals, st, err := a.values(lc)
	if err != nil {
		return agent.Decision{}, err
	}
	if a.Spec.Continue == nil {
		return a.startOver(lc, st, "the harness spec never continues a saved session"), nil
	}
	if len(a.Spec.Continue.RelayEdits) > 0 && !lc.Relay {
		return a.startOver(lc, st, fmt.Sprintf("no model relay to apply the continuation's relay edits %v", a.Spec.Continue.RelayEdits)), nil
	}
	argv := expandAll(a.Spec.Check, vals)
	res, err := lc.Exec(ctx, argv)
	if err != nil {
		return agent.Decision{}, fmt.Errorf("exec: check %s: %w", argv[0], err)
	}
	why := lastLine(res.Output)
	switch res.ExitCode {
	case 0:
		return agent.Decision{Continue: true, Reason: "check: " + why}, nil
	case 1:
		return a.startOver(lc, st, "check: "+why), nil
	}
	return agent.Decision{}, fmt.Errorf("exec: check %s exited %d (want 0 to continue, 1 to start over): %s", argv[0], res.ExitCode, tail(res.Output, 1000))
}

// startOver returns a decision to start over in folder n+1.
func (a *Adapter) startOver(lc agent.LaunchContext, st state, why string) agent.Decision {
	st.Fresh++
	st.Session = path.Join(a.Spec.SessionRoot, lc.Rollout, strconv.Itoa(st.Fresh))
	b, _ := json.Marshal(st)
	return agent.Decision{Reason: why, State: b}
}

// maxAnswer bounds an answer file: a command's receipt carries the last
// sandboxd.OutputTailBytes of its output, so a file that long may have
// been cut.
const maxAnswer = 4096

// answerWait bounds the read of an answer file.
const answerWait = 2 * time.Minute

// Answer implements agent.Adapter: a harness that exited non-zero failed;
// otherwise its answer is the last non-empty line of the
// launch's output (its stdout and stderr, as the daemon keeps them), or
// the spec's answer file in the session folder, read with cat in the
// sandbox, its trailing newlines removed. The answer is a JSON string.
func (a *Adapter) Answer(lc agent.LaunchContext, out agent.ExecResult) (json.RawMessage, error) {
	if out.ExitCode != 0 {
		return nil, fmt.Errorf("exec: the harness exited %d: %s", out.ExitCode, tail(out.Output, 1000))
	}
	if a.Spec.AnswerFile == "" {
		line := lastLine(out.Output)
		if line == "" {
			return nil, errors.New("exec: the harness printed nothing: no answer")
		}
		return json.Marshal(line)
	}
	st, err := parseState(lc.State)
	if err != nil {
		return nil, err
	}
	file := lc.Session.InSandbox(path.Join(st.Session, a.Spec.AnswerFile))
	ctx, cancel := context.WithTimeout(context.Background(), answerWait)
	defer cancel()
	res, err := lc.Exec(ctx, []string{"cat", "--", file})
	switch {
	case err != nil:
		return nil, fmt.Errorf("exec: reading the answer %s: %w", file, err)
	case res.ExitCode != 0:
		return nil, fmt.Errorf("exec: the harness's answer %s does not read (cat exited %d: %s); the end of its output: %s",
			file, res.ExitCode, strings.TrimSpace(res.Output), tail(out.Output, 400))
	case len(res.Output) >= maxAnswer:
		return nil, fmt.Errorf("exec: the answer %s has %d bytes or more: at most %d are read", file, maxAnswer, maxAnswer-1)
	}
	return json.Marshal(strings.TrimRight(res.Output, "\r\n"))
}

// lastLine returns the last non-empty line of s, trimmed.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
