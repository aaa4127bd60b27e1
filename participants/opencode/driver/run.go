package driver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// waitDelay bounds how long an OpenCode process's output may stay open
// after it was killed.
const waitDelay = 2 * time.Second

// command returns an OpenCode command in the session folder: its working
// directory the project, its environment c.environ() plus extra, killed
// (SIGKILL) when ctx ends. OpenCode keeps on through SIGINT (a tool it
// runs is interrupted, and it goes on with the next model call), so a
// stop must not wait for it: the driver's own SIGINT ends ctx.
func (c Config) command(ctx context.Context, extra []string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, c.OpenCode, args...)
	cmd.Dir = c.Workdir
	cmd.Env = append(c.environ(), extra...)
	cmd.WaitDelay = waitDelay
	return cmd
}

// Run runs the task in a new session: `opencode run --title <title>
// --format json` in the project directory, with the prompt as its
// standard input (a regular file, read to its end: a message argument
// would reach the model in quotes, and an open pipe would hang it). The
// events go to stdout as they come, and the session's id to the session
// folder's SessionFile as soon as an event names it. It returns the
// summary of the events; the error is for a run that did not happen or
// was interrupted (ctx ended).
func Run(ctx context.Context, c Config, stdout, stderr io.Writer) (Summary, error) {
	sum := Summary{Kind: SummaryKind}
	if err := c.Validate(true); err != nil {
		return sum, err
	}
	if strings.TrimSpace(c.Prompt) == "" {
		return sum, errors.New("--prompt is required")
	}
	if err := c.prepare(); err != nil {
		return sum, err
	}
	promptPath := filepath.Join(c.Home, PromptFile)
	if err := os.WriteFile(promptPath, []byte(c.Prompt), 0o644); err != nil {
		return sum, err
	}
	prompt, err := os.Open(promptPath)
	if err != nil {
		return sum, err
	}
	defer prompt.Close()
	title := c.Title
	if title == "" {
		title = Provider
	}
	cmd := c.command(ctx, nil, "run", "--title", title, "--format", "json")
	cmd.Stdin, cmd.Stderr = prompt, stderr
	events, err := cmd.StdoutPipe()
	if err != nil {
		return sum, err
	}
	if err := cmd.Start(); err != nil {
		return sum, fmt.Errorf("start %s: %w", c.OpenCode, err)
	}
	got, cerr := copyEvents(events, stdout, func(id string) {
		if err := c.sessionFile().Write(savedSession{ID: id, Title: c.Title}); err != nil {
			fmt.Fprintf(stderr, "opencode-driver: recording session %s: %v\n", id, err)
		}
	})
	werr := cmd.Wait()
	got.Kind = SummaryKind
	if ctx.Err() != nil {
		return got, fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	switch {
	case cerr != nil && got.Error == "":
		got.Error = "reading the events: " + cerr.Error()
	case werr != nil && got.Error == "":
		got.Error = "opencode run: " + exitText(werr)
	}
	return got, nil
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
