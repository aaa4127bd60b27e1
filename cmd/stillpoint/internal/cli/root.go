package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/stillpoint/stillpoint/cmd/stillpoint/demo"
	"github.com/stillpoint/stillpoint/internal/signals"
	"github.com/stillpoint/stillpoint/jetstream"
)

// ExitFailure is the exit status of a command that failed; ExitUsage of one
// that was called wrongly.
const (
	ExitFailure = 1
	ExitUsage   = 2
)

// globals are the flags every subcommand shares.
type globals struct {
	conn      jetstream.ConnConfig
	logLevel  string
	logFormat string
	stdout    io.Writer
	stderr    io.Writer
	// signals handles SIGINT and SIGTERM for the command (Main makes it):
	// a command that stops in a way of its own takes SIGTERM from it.
	signals *signals.Handler
}

// env returns the first non-empty environment variable of names.
func env(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// Main runs the command line with args and returns the exit status.
func Main(args []string, stdout, stderr io.Writer) int {
	// The first SIGINT or SIGTERM cancels the command; a second one exits
	// at once.
	ctx, sigs := signals.Notify(context.Background(), func(os.Signal) {
		fmt.Fprintln(stderr, "stillpoint: second signal, exiting now")
		os.Exit(130)
	})
	defer sigs.Stop()
	g := &globals{stdout: stdout, stderr: stderr, signals: sigs}
	root := newRoot(g)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintln(stderr, "stillpoint:", ee.err)
		}
		return ee.code
	}
	fmt.Fprintln(stderr, "stillpoint:", err)
	if strings.Contains(err.Error(), "unknown command") || strings.Contains(err.Error(), "flag") {
		return ExitUsage
	}
	return ExitFailure
}

// exitError carries a specific exit status out of a command.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}

func newRoot(g *globals) *cobra.Command {
	root := &cobra.Command{
		Use:   "stillpoint",
		Short: "Checkpoint and restore agentic-RL rollouts over NATS JetStream",
		Long: `Stillpoint takes a checkpoint of thousands of running agent rollouts at any
moment and continues every one of them after a crash: harness processes paused
and continued (or relaunched from their saved session), sandboxes snapshotted and
forked, no model call repeated. Checkpoint phases are CloudEvents on NATS
JetStream; the stream is the audit log.

Every command that talks to NATS takes the connection from --nats-url and the
credential flags, or from the environment: STILLPOINT_NATS_URL (or NATS_URL),
NATS_CREDS, NATS_NKEY, NATS_TOKEN.`,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.conn.URL, "nats-url", env("STILLPOINT_NATS_URL", "NATS_URL"),
		"NATS server URL(s), comma-separated for a cluster (env STILLPOINT_NATS_URL, NATS_URL)")
	pf.StringVar(&g.conn.CredsFile, "creds", env("NATS_CREDS"), "NATS user credentials file (env NATS_CREDS)")
	pf.StringVar(&g.conn.NKeyFile, "nkey", env("NATS_NKEY"), "NATS nkey seed file (env NATS_NKEY)")
	pf.StringVar(&g.conn.Token, "token", env("NATS_TOKEN"), "NATS auth token; prefer the env NATS_TOKEN, flags show in ps")
	pf.StringVar(&g.logLevel, "log-level", envOr("STILLPOINT_LOG_LEVEL", "info"), "log level: trace, debug, info, warn, error (env STILLPOINT_LOG_LEVEL)")
	pf.StringVar(&g.logFormat, "log-format", envOr("STILLPOINT_LOG_FORMAT", "auto"), "log format: auto (pretty on a terminal, JSON otherwise), json, pretty")
	root.AddCommand(newServerCmd(g), newCredsCmd(g), newVersionCmd(g), newBridgeCmd(g),
		newCheckpointCmd(g), newCommitHeldCmd(g), newRestoreCmd(g), newRetireCmd(g), newBranchCmd(g), newForgetCmd(g), newReleaseCmd(g), newStatusCmd(g), newTimelineCmd(g), newInspectCmd(g),
		newAgentCmd(g), newOwnerCmd(g), newCollectCmd(g), newTasksCmd(g), newModelServerCmd(g), newDemoCmd(g), newTrajectoryCmd(g), newAttackCmd(g))
	return root
}

// newDemoCmd is `stillpoint demo` (package demo) with its errors turned
// into exit statuses: a wrong call is a usage error, and failed invariants,
// which the demo printed, exit 1 without another word.
func newDemoCmd(g *globals) *cobra.Command {
	return demoExits(demo.Command(demo.Env{Stdout: g.stdout, Stderr: g.stderr, Conn: &g.conn}))
}

// demoExits turns the errors of the demo package's command into exit
// statuses.
func demoExits(cmd *cobra.Command) *cobra.Command {
	run := cmd.RunE
	cmd.RunE = func(c *cobra.Command, args []string) error {
		err := run(c, args)
		switch {
		case errors.Is(err, demo.ErrUsage):
			return &exitError{code: ExitUsage, err: err}
		case errors.Is(err, demo.ErrInvariants):
			return &exitError{code: ExitFailure}
		}
		return err
	}
	return cmd
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// logger builds the zerolog logger the flags ask for, writing to stderr.
func (g *globals) logger() (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(strings.ToLower(g.logLevel))
	if err != nil || g.logLevel == "" {
		return zerolog.Nop(), fmt.Errorf("--log-level %q: want trace, debug, info, warn or error", g.logLevel)
	}
	var w io.Writer = g.stderr
	pretty := false
	switch g.logFormat {
	case "json":
	case "pretty":
		pretty = true
	case "auto":
		if f, ok := g.stderr.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			pretty = true
		}
	default:
		return zerolog.Nop(), fmt.Errorf("--log-format %q: want auto, json or pretty", g.logFormat)
	}
	if pretty {
		w = zerolog.ConsoleWriter{Out: g.stderr, TimeFormat: time.TimeOnly}
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}
