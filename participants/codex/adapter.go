package codex

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
	"github.com/stillpoint/stillpoint/participants/codex/driver"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
)

// DefaultDataRoot is where the adapter keeps session folders in a sandbox:
// <DataRoot>/<rollout>/<n>, a fresh n each time a relaunch starts over.
const DefaultDataRoot = "/var/lib/stillpoint-codex"

// Adapter is the agent's adapter (agent.Adapter) of Codex: every launch is
// the driver (cmd/codex-driver) in the sandbox, which runs Codex in a
// session folder of the rollout's, continues its saved session after a
// relaunch, and decides whether it can.
type Adapter struct {
	// ModelURL is the Responses API server Codex calls (its base URL,
	// without /v1).
	ModelURL string
	// Timeout bounds one launch (paused time not counted; 0 for none).
	Timeout time.Duration
	// NoPause makes the adapter one that does not pause: its launches are
	// stopped at a checkpoint and relaunched after it.
	NoPause bool
	// DataRoot is where session folders go in the sandbox (default
	// DefaultDataRoot).
	DataRoot string
	// BinDir is where Codex and the driver are in the sandbox (default
	// SandboxBinDir).
	BinDir string
}

// state is the adapter's state in the bookmark.
type state struct {
	// Home is the session folder in the sandbox.
	Home string `json:"home"`
	// Fresh counts the fresh starts: Home is <root>/<rollout>/<Fresh>.
	Fresh int `json:"fresh,omitempty"`
	// Thread is the saved session's id, once a resume decision read it.
	Thread string `json:"thread,omitempty"`
}

// The agent abilities the adapter has.
var (
	_ agent.Adapter       = (*Adapter)(nil)
	_ agent.TaskValidator = (*Adapter)(nil)
)

// Name implements agent.Adapter.
func (a *Adapter) Name() string { return "codex" }

// PausesAtCheckpoints implements agent.Adapter.
func (a *Adapter) PausesAtCheckpoints() bool { return !a.NoPause }

// ValidateTask implements agent.TaskValidator.
func (a *Adapter) ValidateTask(task json.RawMessage) error {
	_, err := ParseTask(task)
	return err
}

func (a *Adapter) root() string {
	if a.DataRoot == "" {
		return DefaultDataRoot
	}
	return a.DataRoot
}

func (a *Adapter) bin(lc agent.LaunchContext, name string) string {
	d := a.BinDir
	if d == "" {
		d = SandboxBinDir
	}
	return lc.Session.InSandbox(path.Join(d, name))
}

func parseState(raw json.RawMessage) (state, error) {
	var st state
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, fmt.Errorf("codex: adapter state %s: %w", raw, err)
	}
	if st.Home == "" {
		return st, fmt.Errorf("codex: adapter state %s: no home", raw)
	}
	return st, nil
}

// NewState implements agent.Adapter: the session folder
// <DataRoot>/<rollout>/0.
func (a *Adapter) NewState(r agentapi.Request) (json.RawMessage, error) {
	if _, err := ParseTask(r.Task); err != nil {
		return nil, err
	}
	return json.Marshal(state{Home: path.Join(a.root(), r.RolloutID, "0")})
}

// common returns the driver flags every command takes.
func (a *Adapter) common(lc agent.LaunchContext, st state) []string {
	in := lc.Session.InSandbox
	return []string{"--codex", a.bin(lc, CodexName), "--home", in(st.Home), "--work", in(lc.Session.Workdir)}
}

// Command implements agent.Adapter: the driver's run (a new session of the
// task) or, with lc.Resume, its continue (the saved session, no new user
// turn), which names the relay edit relay.CodexEmptyTurn: the empty user
// message the continuation adds is taken out of every request before the
// model sees it. The model server is told the task and the episode with
// every call (the provider's http_headers in the generated config).
func (a *Adapter) Command(lc agent.LaunchContext) (agent.Command, error) {
	t, err := ParseTask(lc.Task)
	if err != nil {
		return agent.Command{}, err
	}
	st, err := parseState(lc.State)
	if err != nil {
		return agent.Command{}, err
	}
	name := t.Name
	if name == "" {
		name = lc.Rollout
	}
	episode := events.Episode{Rollout: lc.Rollout, Attempt: lc.Attempt}.String()
	argv := []string{a.bin(lc, DriverName), "run"}
	if lc.Resume {
		argv[1] = "continue"
	}
	argv = append(argv, a.common(lc, st)...)
	var edits []string
	if lc.Resume {
		if st.Thread != "" {
			argv = append(argv, "--session", st.Thread)
		}
		edits = []string{relay.CodexEmptyTurn}
	} else {
		argv = append(argv, "--prompt", t.Prompt)
	}
	model := a.ModelURL
	if lc.ModelURL != "" {
		model = lc.ModelURL // the sandbox's model relay
	}
	argv = append(argv, "--model-url", model,
		"--header", modelserver.TaskHeader+"="+name, "--header", modelserver.EpisodeHeader+"="+episode)
	env := driver.Environ(lc.Session.InSandbox(st.Home), a.bin(lc, "")+":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	return agent.Command{Argv: argv, Env: env, Dir: lc.Session.InSandbox(lc.Session.Workdir), Timeout: a.Timeout, RelayEdits: edits}, nil
}

// ResumeDecision implements agent.Adapter: the driver's check reads the
// saved session's rollout in the sandbox and continues it only if its
// prompt is the task's and it holds a completed model response; the
// thread id goes into the state. Otherwise, or with no model relay to
// remove the continuation's empty user message (lc.Relay), the relaunch
// starts over in a fresh session folder.
func (a *Adapter) ResumeDecision(ctx context.Context, lc agent.LaunchContext) (agent.Decision, error) {
	t, err := ParseTask(lc.Task)
	if err != nil {
		return agent.Decision{}, err
	}
	st, err := parseState(lc.State)
	if err != nil {
		return agent.Decision{}, err
	}
	if !lc.Relay {
		return a.startOver(lc, st, "no model relay to remove the continuation's empty user message ("+relay.CodexEmptyTurn+")"), nil
	}
	argv := append([]string{a.bin(lc, DriverName), "check"}, a.common(lc, st)...)
	argv = append(argv, "--prompt", t.Prompt)
	if st.Thread != "" {
		argv = append(argv, "--session", st.Thread)
	}
	res, err := lc.Exec(ctx, argv)
	if err != nil {
		return agent.Decision{}, err
	}
	var d driver.Decision
	lines := strings.Split(strings.TrimSpace(res.Output), "\n")
	if res.ExitCode != 0 || json.Unmarshal([]byte(lines[len(lines)-1]), &d) != nil {
		return agent.Decision{}, fmt.Errorf("codex-driver check exited %d: %s", res.ExitCode, res.Output)
	}
	if d.Continue {
		st.Thread = d.Thread
		b, _ := json.Marshal(st)
		return agent.Decision{Continue: true, Reason: d.Reason, State: b}, nil
	}
	return a.startOver(lc, st, d.Reason), nil
}

// startOver returns a decision to start over in a fresh folder <n+1>.
func (a *Adapter) startOver(lc agent.LaunchContext, st state, why string) agent.Decision {
	st.Fresh++
	st.Home, st.Thread = path.Join(a.root(), lc.Rollout, fmt.Sprint(st.Fresh)), ""
	fresh, _ := json.Marshal(st)
	return agent.Decision{Reason: why, State: fresh}
}

// Answer implements agent.Adapter: the last agent message of the driver's
// summary (the last line of the launch's output), or an error wrapping
// driver.ErrFailed when a turn failed, Codex exited badly, the saved user
// turns changed, or no message came.
func (a *Adapter) Answer(_ agent.LaunchContext, out agent.ExecResult) (json.RawMessage, error) {
	s, err := driver.ReadSummary(out.Output)
	if err != nil {
		return nil, fmt.Errorf("%w (exit %d): %s", err, out.ExitCode, tail(out.Output, 400))
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	return json.Marshal(s.Text)
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
