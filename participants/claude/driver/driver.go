package driver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/stillpoint/stillpoint/internal/claudecode"
)

// Version is the Claude Code release the driver is made for: its flags,
// its stream-json events, its session file and its continuation are
// 2.1.332's.
const Version = "2.1.332"

// ContinuePrompt is the prompt that continues a saved session (Claude
// Code continues one only with a prompt); the model relay's edit
// claude-continue (sandboxd/relay, relay.ClaudeContinuePrompt) removes it,
// and NoResponse, the assistant message Claude adds before it, from every
// request.
const (
	ContinuePrompt = claudecode.ContinuePrompt
	NoResponse     = claudecode.NoResponse
)

// Tools are the built-in tools Claude Code offers the model (--tools) and
// runs without asking (--allowedTools).
var Tools = []string{"Bash", "Read", "Edit", "Write"}

// The session folder's layout: Home is HOME, ConfigDir CLAUDE_CONFIG_DIR
// (the session file, settings, shell snapshots), TmpDir TMPDIR (Claude's
// sockets and scratch files), PromptFile the prompt as run gave it.
const (
	ConfigDir  = "config"
	TmpDir     = "tmp"
	PromptFile = "prompt.txt"
)

// Config is what every driver command is given.
type Config struct {
	// Claude is the claude binary (as the sandbox's processes see it).
	Claude string
	// Home is the session folder: everything Claude Code writes is under
	// it.
	Home string
	// Workdir is the project directory, Claude's working directory.
	Workdir string
	// Session is the session's id (a UUID the adapter chose).
	Session string
	// Prompt is the first user message: run sends it; check requires the
	// saved session to start with it.
	Prompt string
	// ModelURL is the Messages API server's base URL (Claude calls
	// <ModelURL>/v1/messages); Headers go with every model call.
	ModelURL string
	Headers  map[string]string
	// ToolTimeout is the Bash tool's default and longest timeout, and
	// Claude's API and stream timeouts (0: an hour): Claude's timers run
	// on in a pause, so a timeout shorter than a pause would fail a paused
	// call the moment it continues.
	ToolTimeout time.Duration
}

// Validate checks c; needModel for run and continue.
func (c Config) Validate(needModel bool) error {
	var errs []error
	for name, v := range map[string]string{"--claude": c.Claude, "--home": c.Home, "--work": c.Workdir, "--session": c.Session} {
		if v == "" {
			errs = append(errs, fmt.Errorf("%s is required", name))
		} else if name != "--session" && !filepath.IsAbs(v) {
			errs = append(errs, fmt.Errorf("%s %q is not an absolute path", name, v))
		}
	}
	if needModel && c.ModelURL == "" {
		errs = append(errs, errors.New("--model-url is required"))
	}
	for k, v := range c.Headers {
		if strings.ContainsAny(k+v, "\r\n") {
			errs = append(errs, fmt.Errorf("header %q: no line breaks", k))
		}
	}
	return errors.Join(errs...)
}

// Environ returns Claude Code's environment in the session folder home:
// HOME, CLAUDE_CONFIG_DIR and TMPDIR in the folder; path as PATH; the
// model server with the headers; and the switches that keep it offline
// (CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: no telemetry, update check,
// model list or bootstrap call; DISABLE_AUTOUPDATER, DISABLE_TELEMETRY and
// DISABLE_ERROR_REPORTING besides) and its timers above any pause.
func Environ(home, path, modelURL string, headers map[string]string, timeout time.Duration) []string {
	if timeout <= 0 {
		timeout = time.Hour
	}
	ms := fmt.Sprint(timeout.Milliseconds())
	keys := make([]string, 0, len(headers))
	for k := range headers {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var hs []string
	for _, k := range keys {
		hs = append(hs, k+": "+headers[k])
	}
	return []string{
		"PATH=" + path,
		"HOME=" + home,
		"CLAUDE_CONFIG_DIR=" + filepath.Join(home, ConfigDir),
		"TMPDIR=" + filepath.Join(home, TmpDir),
		"LANG=C.UTF-8",
		"ANTHROPIC_BASE_URL=" + strings.TrimSuffix(modelURL, "/"),
		"ANTHROPIC_API_KEY=sk-stillpoint-offline",
		"ANTHROPIC_CUSTOM_HEADERS=" + strings.Join(hs, "\n"),
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1",
		"DISABLE_AUTOUPDATER=1",
		"DISABLE_TELEMETRY=1",
		"DISABLE_ERROR_REPORTING=1",
		"API_TIMEOUT_MS=" + ms,
		"CLAUDE_STREAM_IDLE_TIMEOUT_MS=" + ms,
		"CLAUDE_STREAM_FIRST_BYTE_TIMEOUT_MS=" + ms,
		"BASH_DEFAULT_TIMEOUT_MS=" + ms,
		"BASH_MAX_TIMEOUT_MS=" + ms,
	}
}

// prepare makes the session folder's directories.
func (c Config) prepare() error {
	for _, d := range []string{c.Home, filepath.Join(c.Home, ConfigDir), filepath.Join(c.Home, TmpDir)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	return nil
}

// waitDelay bounds how long Claude's output may stay open after it was
// killed.
const waitDelay = 2 * time.Second

// command returns `claude -p <args> --output-format stream-json --verbose
// --tools ... --allowedTools ...` in the project directory, killed when
// ctx ends.
func (c Config) command(ctx context.Context, args ...string) *exec.Cmd {
	tools := strings.Join(Tools, ",")
	argv := append([]string{"-p"}, args...)
	argv = append(argv, "--output-format", "stream-json", "--verbose", "--tools", tools, "--allowedTools", tools)
	cmd := exec.CommandContext(ctx, c.Claude, argv...)
	cmd.Dir = c.Workdir
	p, dir := os.Getenv("PATH"), filepath.Dir(c.Claude)
	if !slices.Contains(filepath.SplitList(p), dir) {
		p = dir + string(filepath.ListSeparator) + p
	}
	cmd.Env = Environ(c.Home, p, c.ModelURL, c.Headers, c.ToolTimeout)
	cmd.WaitDelay = waitDelay
	return cmd
}

// launch runs cmd with stdin, copies its events to stdout and returns
// the summary of its result event.
func launch(ctx context.Context, cmd *exec.Cmd, stdin io.Reader, stdout, stderr io.Writer, sum Summary) (Summary, error) {
	cmd.Stdin, cmd.Stderr = stdin, stderr
	events, err := cmd.StdoutPipe()
	if err != nil {
		return sum, err
	}
	if err := cmd.Start(); err != nil {
		return sum, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	cerr := copyEvents(events, stdout, &sum)
	werr := cmd.Wait()
	if ctx.Err() != nil {
		return sum, fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	switch {
	case cerr != nil && sum.Error == "":
		sum.Error = "reading the events: " + cerr.Error()
	case werr != nil && sum.Error == "":
		sum.Error = "claude: " + exitText(werr)
	case !sum.Result && sum.Error == "":
		sum.Error = "claude ended with no result event"
	}
	return sum, nil
}

// copyEvents copies Claude's stream-json events to w, line by line, and
// reads the result event into sum.
func copyEvents(r io.Reader, w io.Writer, sum *Summary) error {
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			_, _ = w.Write(line)
			sum.event(line)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Run runs the task in a new session: `claude -p --session-id <id>` in the
// project directory, with the prompt as its standard input (a regular
// file, read to its end: an argument would be taken for a flag if it
// began with a dash). The events go to stdout as they come. It returns
// the summary of the result event; the error is for a run that did not
// happen or was interrupted (ctx ended).
func Run(ctx context.Context, c Config, stdout, stderr io.Writer) (Summary, error) {
	sum := Summary{Kind: SummaryKind, Session: c.Session}
	if err := c.Validate(true); err != nil {
		return sum, err
	}
	if strings.TrimSpace(c.Prompt) == "" {
		return sum, errors.New("--prompt is required")
	}
	if err := c.prepare(); err != nil {
		return sum, err
	}
	p := filepath.Join(c.Home, PromptFile)
	if err := os.WriteFile(p, []byte(c.Prompt), 0o644); err != nil {
		return sum, err
	}
	f, err := os.Open(p)
	if err != nil {
		return sum, err
	}
	defer f.Close()
	sum, err = launch(ctx, c.command(ctx, "--session-id", c.Session), f, stdout, stderr, sum)
	if err == nil {
		sum.countTurns(c)
	}
	return sum, err
}

// Continue continues the saved session with no new user turn the model
// sees: `claude -p ContinuePrompt --resume <id>`, the one way Claude Code
// continues a session no hook deferred. Claude adds the prompt (and, when
// the session ended on a user message or a tool result, the assistant
// message NoResponse before it) to every later request; the launch names
// the relay edit that removes exactly those (the adapter's RelayEdits). A
// tool call the crash interrupted comes back to the model as Claude's
// "[Tool call interrupted…" result. The user turns (less the marker) must
// be exactly the ones before, or the summary says they changed. A session
// that already ends with the model's answer is not continued: that answer
// is the summary, and no model call is made.
func Continue(ctx context.Context, c Config, stdout, stderr io.Writer) (Summary, error) {
	sum := Summary{Kind: SummaryKind, Session: c.Session, Continued: true}
	if err := c.Validate(true); err != nil {
		return sum, err
	}
	if err := c.prepare(); err != nil {
		return sum, err
	}
	cfg := filepath.Join(c.Home, ConfigDir)
	before, err := ReadSession(cfg, c.Session)
	if err != nil {
		return sum, err
	}
	if text, ok := before.Answer(); ok {
		sum.Stop, sum.Result = "end_turn", true
		sum.setText(text)
		sum.UserTurns = len(before.UserTurns())
		return sum, nil
	}
	sum, err = launch(ctx, c.command(ctx, "--resume", c.Session, ContinuePrompt), nil, stdout, stderr, sum)
	if err != nil {
		return sum, err
	}
	after, rerr := ReadSession(cfg, c.Session)
	if rerr != nil {
		sum.addError("reading the session after: " + rerr.Error())
		return sum, nil
	}
	b, a := before.UserTurns(), after.UserTurns()
	sum.UserTurns = len(a)
	if !slices.Equal(b, a) {
		sum.addError(fmt.Sprintf("the saved user turns changed: %d before, %d after", len(b), len(a)))
	}
	return sum, nil
}

// countTurns sets sum.UserTurns from the session file.
func (s *Summary) countTurns(c Config) {
	if t, err := ReadSession(filepath.Join(c.Home, ConfigDir), c.Session); err == nil {
		s.UserTurns = len(t.UserTurns())
	}
}

// Decision is check's answer.
type Decision struct {
	Continue bool   `json:"continue"`
	Session  string `json:"session,omitempty"`
	Reason   string `json:"reason"`
}

// Check is the resume decision, read from the saved session file: it is
// continued only if its first user turn is the task's prompt and it holds
// a completed model response. A folder with no session file is a decision
// to start over; the error is for a check that could not run.
func Check(c Config) (Decision, error) {
	if err := c.Validate(false); err != nil {
		return Decision{}, err
	}
	t, err := ReadSession(filepath.Join(c.Home, ConfigDir), c.Session)
	switch {
	case errors.Is(err, ErrNoSession):
		return Decision{Reason: "no saved session"}, nil
	case err != nil:
		return Decision{Session: c.Session, Reason: "the saved session does not read: " + err.Error()}, nil
	}
	turns := t.UserTurns()
	switch {
	case len(turns) == 0:
		return Decision{Session: c.Session, Reason: "the saved session has no user turn"}, nil
	case turns[0] != c.Prompt:
		return Decision{Session: c.Session, Reason: "the saved session's first user turn is not the task's prompt"}, nil
	case !t.Completed():
		return Decision{Session: c.Session, Reason: "the saved session holds no completed model response"}, nil
	}
	return Decision{Continue: true, Session: c.Session, Reason: "the saved session starts with the task's prompt and holds a completed model response"}, nil
}

// exitText says how a command ended.
func exitText(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "killed by " + ws.Signal().String()
		}
		return fmt.Sprintf("exit status %d", ee.ExitCode())
	}
	return err.Error()
}

// decode is json.Unmarshal that ignores errors, for event lines.
func decode(line []byte, v any) bool { return json.Unmarshal(line, v) == nil }
