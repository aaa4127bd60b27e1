package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// waitDelay bounds how long Codex's output may stay open after it was
// killed.
const waitDelay = 2 * time.Second

// execFlags are the flags of every `codex exec`: JSON events on stdout,
// no approvals and no sandbox of Codex's own (the sandbox is
// Stillpoint's), no git repository needed, and the config checked.
var execFlags = []string{"--json", "--dangerously-bypass-approvals-and-sandbox", "--skip-git-repo-check", "--strict-config"}

// command returns a `codex exec` in the session folder: the project its
// working directory, stdin /dev/null (Codex reads a stdin that is not a
// terminal to its end, and an open pipe would hang it), killed (SIGKILL)
// when ctx ends.
func (c Config) command(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, c.Codex, append([]string{"exec"}, args...)...)
	cmd.Dir = c.Workdir
	cmd.Env = c.environ()
	cmd.WaitDelay = waitDelay
	return cmd
}

// savedSession is SessionFile's content.
type savedSession struct {
	Thread string `json:"thread"`
}

func (c Config) sessionPath() string { return filepath.Join(c.Home, SessionFile) }

// thread returns the session's thread: c.Session, else the one run
// recorded, else "".
func (c Config) thread() string {
	if c.Session != "" {
		return c.Session
	}
	var s savedSession
	if b, err := os.ReadFile(c.sessionPath()); err == nil && json.Unmarshal(b, &s) == nil {
		return s.Thread
	}
	return ""
}

func (c Config) recordThread(id string) error {
	b, _ := json.Marshal(savedSession{Thread: id})
	tmp := c.sessionPath() + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, c.sessionPath())
}

// rollout reads the folder's rollout of the session's thread (the newest
// of any thread when none is known).
func (c Config) rollout() (Rollout, error) {
	p, err := FindRollout(filepath.Join(c.Home, Dirs.Codex), c.thread())
	if err != nil {
		return Rollout{}, err
	}
	return ReadRollout(p)
}

// launch runs codex exec with args, its events copied to stdout and
// summarised; the error is for a launch that did not happen or was
// interrupted.
func (c Config) launch(ctx context.Context, stdout, stderr io.Writer, args ...string) (Summary, error) {
	cmd := c.command(ctx, args...)
	cmd.Stderr = stderr
	events, err := cmd.StdoutPipe()
	if err != nil {
		return Summary{Kind: SummaryKind}, err
	}
	if err := cmd.Start(); err != nil {
		return Summary{Kind: SummaryKind}, fmt.Errorf("start %s: %w", c.Codex, err)
	}
	sum, lastError, cerr := copyEvents(events, stdout, func(id string) {
		if err := c.recordThread(id); err != nil {
			fmt.Fprintf(stderr, "codex-driver: recording thread %s: %v\n", id, err)
		}
	})
	werr := cmd.Wait()
	sum.Kind = SummaryKind
	if ctx.Err() != nil {
		return sum, fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	switch {
	case cerr != nil && sum.Error == "":
		sum.Error = "reading the events: " + cerr.Error()
	case werr != nil && sum.Error == "":
		sum.Error = "codex exec: " + exitText(werr)
		if lastError != "" {
			sum.Error += ": " + lastError
		}
	}
	return sum, nil
}

// Run runs the task in a new session: `codex exec <flags> -C WORK PROMPT`.
// The thread id goes to the folder's SessionFile as soon as
// thread.started names it.
func Run(ctx context.Context, c Config, stdout, stderr io.Writer) (Summary, error) {
	if err := c.Validate(true); err != nil {
		return Summary{Kind: SummaryKind}, err
	}
	if strings.TrimSpace(c.Prompt) == "" {
		return Summary{Kind: SummaryKind}, errors.New("--prompt is required")
	}
	if err := c.prepare(); err != nil {
		return Summary{Kind: SummaryKind}, err
	}
	sum, err := c.launch(ctx, stdout, stderr, append(slices.Clone(execFlags), "-C", c.Workdir, "--", c.Prompt)...)
	if err == nil {
		if r, rerr := c.rollout(); rerr == nil {
			sum.UserTurns = len(r.UserTexts)
		}
	}
	return sum, err
}

// Continue continues the saved session with no new turn of the user's:
// `codex exec <flags> resume <thread> ""`, the least Codex takes (an
// empty user message, which the relay edit CodexEmptyTurn removes before
// the model sees it). The rollout's user messages are read before and
// after: they must be the ones before and the one empty message, else the
// summary says the saved user turns changed. A session that had answered
// already is not continued: that answer is the summary.
func Continue(ctx context.Context, c Config, stdout, stderr io.Writer) (Summary, error) {
	sum := Summary{Kind: SummaryKind, Continued: true}
	if err := c.Validate(true); err != nil {
		return sum, err
	}
	if err := c.prepare(); err != nil {
		return sum, err
	}
	before, err := c.rollout()
	if err != nil {
		return sum, err
	}
	sum.Thread, sum.UserTurns = before.Thread, len(before.UserTexts)
	if before.Answered {
		sum.Answered, sum.Text = true, before.Answer
		return sum, nil
	}
	got, err := c.launch(ctx, stdout, stderr, append(slices.Clone(execFlags), "resume", before.Thread, "")...)
	got.Continued = true
	if err != nil {
		return got, err
	}
	after, err := ReadRollout(before.Path)
	if err != nil {
		return got, err
	}
	got.UserTurns = len(after.UserTexts)
	if want := append(slices.Clone(before.UserTexts), ""); !slices.Equal(after.UserTexts, want) && got.Error == "" {
		got.Error = fmt.Sprintf("the saved user turns changed: %d before, %d after (%q)", len(before.UserTexts), len(after.UserTexts), clip(strings.Join(after.UserTexts[min(len(before.UserTexts), len(after.UserTexts)):], " | "), 200))
	}
	return got, nil
}

// Check is the resume decision, read from the folder's rollout (Decide).
// A folder with no rollout, or one that does not read, is a decision to
// start over; the error is for a check that could not run.
func Check(_ context.Context, c Config) (Decision, error) {
	if err := c.Validate(false); err != nil {
		return Decision{}, err
	}
	r, err := c.rollout()
	switch {
	case errors.Is(err, ErrNoRollout):
		return Decision{Reason: "no saved session"}, nil
	case err != nil:
		return Decision{Reason: "the saved session does not read: " + err.Error()}, nil
	}
	return Decide(r, c.Prompt), nil
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
