package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/stillpoint/stillpoint/controller-bridge/client"
	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/internal/signals"
)

type collectFlags struct {
	run          string
	tasks        string
	output       string
	dispatchLog  string
	trajectories string
	agents       string
	bridgeURL    string
	tokenFile    string
	concurrency  int
	every        time.Duration
	keep         int
	noProgress   bool
	metricsAddr  string
}

func newCollectCmd(g *globals) *cobra.Command {
	var f collectFlags
	cmd := &cobra.Command{
		Use:   "collect",
		Short: "Collect rollouts through the agents, checkpointing, and survive any crash",
		Long: `Read tasks (JSONL: {"rollout_id": ..., "task": {...}}), send them as rollouts
to the run's agents over the bus with bounded concurrency, and write every result
exactly once to --output (JSONL, with each rollout's launch log). A dispatch log
(--output + ".dispatch") is synced before each dispatch.

Checkpoints go through the bridge (--bridge-url): every --checkpoint-every, on
SIGUSR1 (checkpoint and go on), and on SIGTERM (checkpoint with stop, then exit
75). After each commit all but the newest --keep checkpoints are released; at the
end --keep 0 releases everything.

Run again with the same run and output, it continues: with a fresh fleet it
restores LATEST (continued rollouts resume from their bookmarks; everything else
that was dispatched but is unfinished is retired and starts over one attempt
later); with the fleet it left (only the collector died) it asks again for the
attempts in flight. Rollouts already in the output are not run again. It also
recovers when it sees the agents and the owner restart under it.`,
		Example: `  stillpoint collect --run train-7 --tasks tasks.jsonl --output results.jsonl --agents a1,a2 \
      --bridge-url http://127.0.0.1:7070 --checkpoint-every 30s`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runCollect(cmd.Context(), g, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.run, "run", env("STILLPOINT_RUN"), "run id (env STILLPOINT_RUN)")
	fl.StringVar(&f.tasks, "tasks", "", "tasks file, JSONL (required)")
	fl.StringVar(&f.output, "output", "", "results file, JSONL (required)")
	fl.StringVar(&f.trajectories, "trajectories", "", "write each result's trajectory (its model calls, checked) into this directory as <rollout>.jsonl")
	fl.StringVar(&f.dispatchLog, "dispatch-log", "", "dispatch log (default --output + \".dispatch\")")
	fl.StringVar(&f.agents, "agents", "a1", "agent names, comma-separated")
	fl.StringVar(&f.bridgeURL, "bridge-url", envOr("STILLPOINT_BRIDGE_URL", "http://127.0.0.1:7070"), "bridge API (env STILLPOINT_BRIDGE_URL)")
	fl.StringVar(&f.tokenFile, "token-file", "", "file holding the bridge API token (else env STILLPOINT_BRIDGE_TOKEN)")
	fl.IntVar(&f.concurrency, "concurrency", 64, "rollouts in flight at once")
	fl.DurationVar(&f.every, "checkpoint-every", 0, "take a checkpoint this often (0: only on SIGUSR1 and SIGTERM)")
	fl.IntVar(&f.keep, "keep", 2, "committed checkpoints to keep; at the end, 0 releases everything")
	fl.BoolVar(&f.noProgress, "no-progress", false, "no live progress line, even on a terminal")
	metricsAddrFlag(fl, &f.metricsAddr)
	return cmd
}

func runCollect(ctx context.Context, g *globals, f collectFlags) error {
	log, err := g.logger()
	if err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	if f.tasks == "" || f.output == "" {
		return &exitError{code: ExitUsage, err: errors.New("--tasks and --output are required")}
	}
	tasks, err := collect.ReadTasks(f.tasks)
	if err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	token, err := bridgeToken(f.tokenFile)
	if err != nil || token == "" {
		return &exitError{code: ExitUsage, err: errors.Join(err, errors.New("the bridge API needs its token: --token-file or STILLPOINT_BRIDGE_TOKEN"))}
	}
	ctl, err := client.New(f.bridgeURL, token)
	if err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	bus, js, closeBus, err := openBus(ctx, g, "stillpoint-collect-"+f.run, 1)
	if err != nil {
		return err
	}
	defer closeBus()
	var progress *os.File
	if fd, ok := g.stderr.(*os.File); ok && !f.noProgress && isatty.IsTerminal(fd.Fd()) {
		progress = fd
		log = log.Level(max(log.GetLevel(), zerolog.WarnLevel)) // the live line says the rest
	}
	cfg := collect.Config{Run: f.run, Tasks: tasks, Output: f.output, DispatchLog: f.dispatchLog, Trajectories: f.trajectories, Agents: splitList(f.agents),
		Conn: connOf(js), JS: js, Bus: bus, Controller: ctl, Concurrency: f.concurrency, CheckpointEvery: f.every, Keep: f.keep,
		Logger: log}
	if progress != nil {
		cfg.Progress = progress
	}
	if f.metricsAddr != "" {
		cfg.Metrics = metrics.New()
	}
	c, err := collect.New(cfg)
	if err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	stopMetrics, err := startMetrics(ctx, g, f.metricsAddr, "collector of run "+f.run, cfg.Metrics,
		metrics.All(metrics.Connected(connOf(js)), metrics.StreamAnswers(bus.Stream)))
	if err != nil {
		return err
	}
	defer func() { _ = stopMetrics() }()
	defer signals.On(syscall.SIGUSR1, c.CheckpointNow)()
	defer g.signals.OnTerm(c.Stop)()
	sum, err := c.Run(ctx)
	collect.WriteSummary(g.stdout, sum)
	switch {
	case errors.Is(err, collect.ErrStopped):
		fmt.Fprintf(g.stdout, "stillpoint: stopped after a committed checkpoint; run the same command again to continue\n")
		return &exitError{code: collect.ExitStopped}
	case err != nil:
		return err
	}
	return nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
