package claude

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/agent"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/claude/driver"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
)

// DefaultDataRoot is where the adapter keeps session folders in a sandbox:
// <DataRoot>/<rollout>/<n>, a fresh n each time a relaunch starts over.
const DefaultDataRoot = "/var/lib/stillpoint-claude"

// Adapter is the agent's adapter (agent.Adapter) of Claude Code: every
// launch is the driver (cmd/claude-driver) in the sandbox, which runs
// Claude in a session folder of the rollout's, continues its saved
// session after a relaunch, and decides whether it can.
type Adapter struct {
	// ModelURL is the Messages API server Claude calls (its base URL,
	// without /v1).
	ModelURL string
	// Timeout bounds one launch (paused time not counted; 0 for none).
	Timeout time.Duration
	// ToolTimeout is the Bash tool's timeout and Claude's API and stream
	// timeouts (0: the driver's, an hour). Claude's timers run on through
	// a pause, so they must outlast any pause.
	ToolTimeout time.Duration
	// NoPause makes the adapter one that does not pause: its launches are
	// stopped at a checkpoint and relaunched after it.
	NoPause bool
	// DataRoot is where session folders go in the sandbox (default
	// DefaultDataRoot).
	DataRoot string
	// BinDir is where Claude and the driver are in the sandbox (default
	// SandboxBinDir).
	BinDir string
}

// state is the adapter's state in the bookmark.
type state struct {
	// Home is the session folder in the sandbox.
	Home string `json:"home"`
	// Fresh counts the fresh starts: Home is <root>/<rollout>/<Fresh>.
	Fresh int `json:"fresh,omitempty"`
	// Session is the session's id, chosen with the folder.
	Session string `json:"session"`
}

// The agent abilities the adapter has.
var (
	_ agent.Adapter       = (*Adapter)(nil)
	_ agent.TaskValidator = (*Adapter)(nil)
)

// Name implements agent.Adapter.
func (a *Adapter) Name() string { return "claude" }

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

// SessionID returns the session id of a rollout's n-th session folder: a
// UUID (version 4 in form) made from both, so that a folder's session is
// known before Claude writes anything.
func SessionID(rollout string, n int) string {
	s := sha256.Sum256(fmt.Appendf(nil, "stillpoint-claude/%s/%d", rollout, n))
	s[6] = s[6]&0x0f | 0x40
	s[8] = s[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", s[0:4], s[4:6], s[6:8], s[8:10], s[10:16])
}

func (a *Adapter) fresh(rollout string, n int) state {
	return state{Home: path.Join(a.root(), rollout, fmt.Sprint(n)), Fresh: n, Session: SessionID(rollout, n)}
}

func parseState(raw json.RawMessage) (state, error) {
	var st state
	if err := json.Unmarshal(raw, &st); err != nil {
		return st, fmt.Errorf("claude: adapter state %s: %w", raw, err)
	}
	if st.Home == "" || st.Session == "" {
		return st, fmt.Errorf("claude: adapter state %s: no home or session", raw)
	}
	return st, nil
}

// NewState implements agent.Adapter: the session folder
// <DataRoot>/<rollout>/0 and its session id.
func (a *Adapter) NewState(r agentapi.Request) (json.RawMessage, error) {
	if _, err := ParseTask(r.Task); err != nil {
		return nil, err
	}
	return json.Marshal(a.fresh(r.RolloutID, 0))
}

// common returns the driver flags every command takes.
func (a *Adapter) common(lc agent.LaunchContext, st state) []string {
	in := lc.Session.InSandbox
	return []string{"--claude", a.bin(lc, ClaudeName), "--home", in(st.Home), "--work", in(lc.Session.Workdir), "--session", st.Session}
}

// Command implements agent.Adapter: the driver's run (a new session of the
// task) or, with lc.Resume, its continue (the saved session), which names
// the relay edit that removes the continuation's prompt
// (relay.ClaudeContinueEdit) so that the model sees no new turn. The
// model server is told the task and the episode with every call.
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
	var edits []string
	if lc.Resume {
		argv[1], edits = "continue", []string{relay.ClaudeContinueEdit}
	}
	argv = append(argv, a.common(lc, st)...)
	if !lc.Resume {
		argv = append(argv, "--prompt", t.Prompt)
	}
	model := a.ModelURL
	if lc.ModelURL != "" {
		model = lc.ModelURL // the sandbox's model relay
	}
	argv = append(argv, "--model-url", model,
		"--header", modelserver.TaskHeader+"="+name, "--header", modelserver.EpisodeHeader+"="+episode)
	if a.ToolTimeout > 0 {
		argv = append(argv, "--tool-timeout", a.ToolTimeout.String())
	}
	in := lc.Session.InSandbox
	env := []string{"PATH=" + a.bin(lc, "") + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=" + in(st.Home), "TMPDIR=" + in(path.Join(st.Home, driver.TmpDir)), "LANG=C.UTF-8"}
	return agent.Command{Argv: argv, Env: env, Dir: in(lc.Session.Workdir), Timeout: a.Timeout, RelayEdits: edits}, nil
}

// ResumeDecision implements agent.Adapter: the driver's check reads the
// saved session file in the sandbox and continues it only if its first
// user turn is the task's prompt and it holds a completed model response.
// Otherwise, or with no model relay to remove the continuation's turn
// (lc.Relay), the relaunch starts over in a fresh session folder, with a
// session id of its own.
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
		fresh, _ := json.Marshal(a.fresh(lc.Rollout, st.Fresh+1))
		return agent.Decision{Reason: "no model relay to remove the continuation's turn (" + relay.ClaudeContinueEdit + ")", State: fresh}, nil
	}
	argv := append([]string{a.bin(lc, DriverName), "check"}, a.common(lc, st)...)
	argv = append(argv, "--prompt", t.Prompt)
	res, err := lc.Exec(ctx, argv)
	if err != nil {
		return agent.Decision{}, err
	}
	var d driver.Decision
	lines := strings.Split(strings.TrimSpace(res.Output), "\n")
	if res.ExitCode != 0 || json.Unmarshal([]byte(lines[len(lines)-1]), &d) != nil {
		return agent.Decision{}, fmt.Errorf("claude-driver check exited %d: %s", res.ExitCode, res.Output)
	}
	if d.Continue {
		return agent.Decision{Continue: true, Reason: d.Reason}, nil
	}
	fresh, _ := json.Marshal(a.fresh(lc.Rollout, st.Fresh+1))
	return agent.Decision{Reason: d.Reason, State: fresh}, nil
}

// Answer implements agent.Adapter: the answer of the driver's summary (the
// last line of the launch's output), or an error wrapping
// driver.ErrFailed when Claude's result was an error, it stopped short of
// an answer, or the saved user turns changed.
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
