package chaos

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/stillpoint/stillpoint/cmd/stillpoint/demo"
	"github.com/stillpoint/stillpoint/controller-bridge/client"
	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/controller-bridge/invariant"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/atomicfile"
	"github.com/stillpoint/stillpoint/jetstream"
)

// FaultCollector kills (SIGKILL) the round's collector, which then runs as
// a process of its own (`chaos collect`), at a phase, and starts
// it again on the same results and dispatch log: the rerun asks the bridge
// and the agents and goes on.
const FaultCollector = "collector"

// collectorFlags are those of `chaos collect`.
type collectorFlags struct {
	run, tasks, output, agents, bridgeURL string
	every, grace                          time.Duration
}

// collectorCommand returns `chaos collect`: one round's collector as a
// process of its own, for FaultCollector and FaultPreempt. It prints its
// summary last, on one line (collectorSummaryRE). On SIGTERM (with
// Env.HandleTerm) it stops after a checkpoint with stop, and returns
// collect.ErrStopped.
func collectorCommand(env Env) *cobra.Command {
	var f collectorFlags
	cmd := &cobra.Command{
		Use:    "collect",
		Short:  "Run one chaos round's collector (chaos starts it, kills it for the collector fault, stops it for preempt)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE:   func(cmd *cobra.Command, _ []string) error { return runCollector(cmd.Context(), env, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.run, "run", "", "run id")
	fl.StringVar(&f.tasks, "tasks", "", "tasks file, JSONL")
	fl.StringVar(&f.output, "output", "", "results file, JSONL (its dispatch log beside it)")
	fl.StringVar(&f.agents, "agents", "", "agent names, comma-separated")
	fl.StringVar(&f.bridgeURL, "bridge-url", "", "the bridge's API (its token in STILLPOINT_BRIDGE_TOKEN)")
	fl.DurationVar(&f.every, "every", 2*time.Second, "checkpoint interval")
	fl.DurationVar(&f.grace, "recover-grace", chaosRecoverGrace, "the collector's RecoverGrace")
	return cmd
}

// collectorSummaryRE is the summary line `chaos collect` prints last.
var collectorSummaryRE = regexp.MustCompile(`(?m)^chaos-collect: summary (\{.*\})$`)

func runCollector(ctx context.Context, env Env, f collectorFlags) error {
	if f.run == "" || f.tasks == "" || f.output == "" || f.agents == "" || f.bridgeURL == "" {
		return fmt.Errorf("%w: --run, --tasks, --output, --agents and --bridge-url are required", ErrUsage)
	}
	ts, err := collect.ReadTasks(f.tasks)
	if err != nil {
		return err
	}
	ctl, err := client.New(f.bridgeURL, os.Getenv("STILLPOINT_BRIDGE_TOKEN"))
	if err != nil {
		return err
	}
	defer ctl.Close()
	conn := jetstream.ConnConfig{Name: "stillpoint-chaos-collect-" + f.run}
	if env.Conn != nil {
		conn = *env.Conn
		conn.Name = "stillpoint-chaos-collect-" + f.run
	}
	nc, js, err := demo.ConnectJS(ctx, conn)
	if err != nil {
		return err
	}
	defer nc.Close()
	bus, err := jetstream.Open(ctx, js)
	if err != nil {
		return err
	}
	col, err := collect.New(collect.Config{Run: f.run, Tasks: ts, Output: f.output, Agents: strings.Split(f.agents, ","),
		Conn: nc, JS: js, Bus: bus, Controller: ctl, Concurrency: len(ts), CheckpointEvery: f.every, RecoverGrace: f.grace,
		Logger: zerolog.New(env.Stderr).With().Timestamp().Logger()})
	if err != nil {
		return err
	}
	if env.HandleTerm != nil {
		defer env.HandleTerm(col.Stop)()
	}
	sum, err := col.Run(ctx)
	b, _ := json.Marshal(sum)
	fmt.Fprintf(env.Stdout, "chaos-collect: summary %s\n", b)
	return err
}

// collectorProcess runs a round's collector as `chaos collect` processes:
// the first, and one started again after each kill, until one exits by
// itself.
type collectorProcess struct {
	d       *demo.Fleet
	program string // the chaos binary
	args    []string

	mu sync.Mutex // held across a kill and the start that follows it
}

// start writes the round's tasks where the collector reads them and
// starts the first process.
func (c *collectorProcess) start(ts []collect.Task) error {
	var buf bytes.Buffer
	for _, t := range ts {
		b, err := json.Marshal(t)
		if err != nil {
			return err
		}
		buf.Write(append(b, '\n'))
	}
	if err := atomicfile.Write(filepath.Join(c.d.Dir(), "tasks.jsonl"), buf.Bytes(), 0o644); err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	return c.spawn()
}

func (c *collectorProcess) spawn() error {
	return c.d.Spawn(c.program, "collector", "controller", []string{"STILLPOINT_BRIDGE_TOKEN=" + c.d.Token()}, c.args...)
}

// restart kills the collector (SIGKILL) and starts it again.
func (c *collectorProcess) restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.d.Kill9(ctx, "collector"); err != nil {
		return err
	}
	return c.spawn()
}

// wait waits for the collector process that exits by itself (one the
// fault killed has a successor) and returns its summary. ctx ending (the
// round's limit) stops it.
func (c *collectorProcess) wait(ctx context.Context) (collect.Summary, error) {
	for {
		p := c.d.Process("collector")
		select {
		case <-p.Exited():
		case <-ctx.Done():
			p.Stop()
			return collect.Summary{}, context.Cause(ctx)
		}
		c.mu.Lock() // a restart in progress ends first
		next := c.d.Process("collector")
		c.mu.Unlock()
		if next != p {
			continue
		}
		exit, err := p.Wait(context.WithoutCancel(ctx))
		if err != nil {
			return collect.Summary{}, err
		}
		var sum collect.Summary
		m := collectorSummaryRE.FindStringSubmatch(p.Output())
		if m == nil || json.Unmarshal([]byte(m[1]), &sum) != nil {
			return sum, fmt.Errorf("the collector printed no summary (%s): %s", exit, lastLine(p.Output()))
		}
		if !exit.Success() {
			return sum, fmt.Errorf("the collector: %s: %s", exit, lastLine(p.Output()))
		}
		return sum, nil
	}
}

// verifyCommits verifies every checkpoint the stream says committed as
// its outcome goes by, as the in-process collector's OnCommit does (the
// collector process cannot report to this one, and may be killed before
// it would), until ctx ends.
func verifyCommits(ctx context.Context, nc *nats.Conn, bus *jetstream.Bus, run string, v *invariant.Manifests, wg *sync.WaitGroup) error {
	ids := make(chan string, 256)
	sub, err := nc.Subscribe(events.OutcomeSubject(run, events.TypeCheckpointCommitted), func(m *nats.Msg) {
		_, d, err := events.Unmarshal(m)
		if err != nil {
			return
		}
		if c, ok := d.(events.CheckpointCommitted); ok {
			select {
			case ids <- c.CheckpointID:
			default:
			}
		}
	})
	if err != nil {
		return err
	}
	wg.Go(func() {
		defer func() { _ = sub.Unsubscribe() }()
		for {
			select {
			case <-ctx.Done():
				return
			case id := <-ids:
				// Not cut short when ctx ends with the round: a read the bus
				// fails (a server killed at this commit) is still being
				// tried again, and the round's check waits for it. What
				// ctx's end leaves unread, the check verifies itself.
				v.OnCommit(context.WithoutCancel(ctx), bus, run, id)
			}
		}
	})
	return nil
}

// isCollectorRound tells whether a round's plan kills or preempts its
// collector, which then runs as a process of its own.
func isCollectorRound(plan []plannedFault) bool {
	for _, p := range plan {
		if p.kind == FaultCollector || p.kind == FaultPreempt {
			return true
		}
	}
	return false
}

// errNoCollector: a collector fault in a round whose collector runs in
// this process.
var errNoCollector = errors.New("the collector runs in the chaos process in this round")

// collectorKill is what inject does for FaultCollector.
func (i *injector) collectorKill(ctx context.Context, p plannedFault) error {
	if i.collector == nil {
		return errNoCollector
	}
	i.d.Say("kill -9 of the collector at %s, started again on its results and dispatch log", p.phase)
	return i.collector.restart(ctx)
}

// collectorArgs are the `chaos collect` arguments of a round.
func collectorArgs(d *demo.Fleet, w *chaosWorld, bridgeURL string, agents []string) []string {
	return []string{"collect", "--run", d.RunID(), "--tasks", filepath.Join(d.Dir(), "tasks.jsonl"),
		"--output", filepath.Join(d.Dir(), "results.jsonl"), "--agents", strings.Join(agents, ","), "--bridge-url", bridgeURL,
		"--every", w.f.every.String(), "--recover-grace", cmp.Or(w.f.grace, chaosRecoverGrace).String()}
}

// resultLines counts the lines of a results file (0 when there is none).
func resultLines(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	return bytes.Count(b, []byte{'\n'})
}
