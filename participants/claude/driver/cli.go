package driver

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"
)

// Usage is the driver program's usage.
const Usage = `usage:
  claude-driver run      --claude BIN --home DIR --work DIR --session UUID --prompt P
                         --model-url URL [--header K=V]... [--tool-timeout D]
  claude-driver continue --claude BIN --home DIR --work DIR --session UUID
                         --model-url URL [--header K=V]... [--tool-timeout D]
  claude-driver check    --claude BIN --home DIR --work DIR --session UUID --prompt P

run: a new session of the task in the session folder DIR; continue: the saved
session, with no new user turn the model sees (the relay removes the
continuation's prompt); both print Claude's events and end with a summary line
(JSON, kind ` + SummaryKind + `). check: whether the saved session can be
continued, one JSON line. SIGINT or SIGTERM kills Claude at once.
`

// Exit codes of Main.
const (
	ExitOK          = 0   // done: the launch answered, or check decided
	ExitFailed      = 1   // the launch failed (its summary says why) or check could not run
	ExitUsage       = 2   // bad flags
	ExitInterrupted = 130 // ctx ended: Claude was killed
)

// headers is a repeated K=V flag.
type headers map[string]string

// String implements flag.Value.
func (h headers) String() string { return fmt.Sprint(map[string]string(h)) }

// Set implements flag.Value.
func (h headers) Set(v string) error {
	k, val, ok := strings.Cut(v, "=")
	if !ok || k == "" {
		return fmt.Errorf("%q is not K=V", v)
	}
	h[k] = val
	return nil
}

// Main runs the driver's command line: args are the arguments after the
// program name. ctx ending (the program's signals) interrupts it.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, Usage)
		return ExitUsage
	}
	cmd := args[0]
	switch cmd {
	case "run", "continue", "check":
	case "help", "-h", "--help":
		fmt.Fprint(stdout, Usage)
		return ExitOK
	default:
		fmt.Fprintf(stderr, "claude-driver: unknown command %q\n%s", cmd, Usage)
		return ExitUsage
	}
	var c Config
	c.Headers = map[string]string{}
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.Claude, "claude", "", "the claude binary")
	fs.StringVar(&c.Home, "home", "", "the session folder")
	fs.StringVar(&c.Workdir, "work", "", "the project directory")
	fs.StringVar(&c.Session, "session", "", "the session's id (a UUID)")
	fs.StringVar(&c.Prompt, "prompt", "", "the task's first user message")
	fs.StringVar(&c.ModelURL, "model-url", "", "the Messages API server's base URL")
	fs.Var(headers(c.Headers), "header", "a header K=V sent with every model call (repeated)")
	fs.DurationVar(&c.ToolTimeout, "tool-timeout", time.Hour, "the Bash tool's timeout and Claude's API timeouts")
	if err := fs.Parse(args[1:]); err != nil {
		return ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "claude-driver %s: unexpected arguments %q\n", cmd, fs.Args())
		return ExitUsage
	}
	if err := c.Validate(cmd != "check"); err != nil {
		fmt.Fprintf(stderr, "claude-driver %s: %v\n", cmd, err)
		return ExitUsage
	}
	if cmd == "check" {
		d, err := Check(c)
		if err != nil {
			fmt.Fprintf(stderr, "claude-driver check: %v\n", err)
			return ExitFailed
		}
		b, _ := json.Marshal(d)
		fmt.Fprintf(stdout, "%s\n", b)
		return ExitOK
	}
	launch := Run
	if cmd == "continue" {
		launch = Continue
	}
	sum, err := launch(ctx, c, stdout, stderr)
	if err != nil && ctx.Err() != nil {
		fmt.Fprintf(stderr, "claude-driver %s: %v\n", cmd, err)
		return ExitInterrupted
	}
	if err != nil {
		sum.addError(err.Error())
	}
	fmt.Fprintf(stdout, "%s\n", sum.Line())
	if sum.Err() != nil {
		return ExitFailed
	}
	return ExitOK
}
