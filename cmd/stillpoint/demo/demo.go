package demo

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/mattn/go-isatty"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/client"
	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/controller-bridge/invariant"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/atomicfile"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm/qemu"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

type demoFlags struct {
	rollouts int
	agents   int
	dir      string
	provider string
	cluster  bool
	auth     bool
	authDir  string
	tool     time.Duration
	harness  string
	tasks    string // the task set: "" (the harness's), or tasksSWE
	steps    int    // tool calls of each scripted task (default 2)
	run      string
	branches int // after the restore, branch one rollout this many ways
}

// Env is what the demo takes from the command line it is part of.
type Env struct {
	// Stdout gets the demo's report, Stderr its warnings and the live
	// line (when it is a terminal).
	Stdout, Stderr io.Writer
	// Conn is the root command's connection flags, read when the demo
	// runs: with a URL, the demo uses that server (one that `stillpoint
	// server` runs) instead of starting its own.
	Conn *jetstream.ConnConfig
	// Program is the stillpoint binary the bridge, the owners and the
	// agents run as (default: this process's own, os.Executable).
	Program string
}

// Sentinel errors of the demo's command.
var (
	// ErrUsage is wrapped by the errors of a demo called wrongly.
	ErrUsage = errors.New("demo: usage")
	// ErrInvariants is returned once the demo ran and printed its report,
	// when an invariant failed.
	ErrInvariants = errors.New("demo: invariants failed")
)

// Command returns the `demo` command. Its errors wrap ErrUsage for a
// wrong call; ErrInvariants says the run failed a check it reported.
func Command(env Env) *cobra.Command {
	var f demoFlags
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run a rollout collection through 3 checkpoints and a crash, and check the invariants",
		Long: `Run the whole system on this machine, no outside service: an embedded NATS
server, the bridge, a few nodes (--agents: each an agent and the sandbox owner
that lends it sandboxes, on the best provider: overlay as root, dir otherwise;
each its own process), the scripted model server and harness, and a bundled
task set of small coding tasks (their tools write files,
run a slow command and start a detached process).

The collection goes through 3 checkpoints and one crash: after the second
checkpoint the agents and the owners are killed with SIGKILL and started again,
and the collector restores the checkpoint. At the end it prints how many
rollouts continued in place and how many relaunched, the checkpoint timings,
the PROTOCOL §7 invariants checked on this run, and the nats commands to read
what happened. The last line is:
  demo: <N> rollouts, <N> results, <C> continued in place, <R> relaunched, <K> checkpoints committed, invariants ok

With --harness opencode the agents run the real OpenCode (1.18.33, from npm:
see docs/OPENCODE.md) on the bundled repository tasks instead (10 tasks of the
command kind: small repositories with a failing test each, the model's script
fixing 9 of them with OpenCode's own tools, the rewards from their tests);
--rollouts then takes the first of them (all 10 by default), 8 at most in
flight at once. Each OpenCode process takes about 0.6 GB and 4 s of CPU to
start.

With --harness claude or codex the agents run the real Claude Code (2.1.332)
or Codex CLI (0.171.0), from npm (docs/CLAUDE.md, docs/CODEX.md), on the
same repository tasks, each in its own tools; the sandboxes' relays
translate their Anthropic Messages or Responses calls to chat completions,
so that their trajectories have token ids.

With --tasks swe (and --harness opencode, claude or codex) the tasks are the
bundled SWE-style set instead (docs/TASKS.md): five instances of the swe kind,
each in a sandbox made from its own container image (built here from Debian's
packages the first time, with debootstrap, and cached), graded as the
SWE-bench harness grades.

With --harness exec the agents run the exec adapter's bundled example
(participants/exec/example: a small Python 3 agent defined by its JSON spec,
docs/HARNESSES.md) on the scripted task set; it needs python3 on the host,
which the sandboxes see.

It builds the static sandboxd and harness binaries first (go build, from the
stillpoint checkout), so run it from there: go run ./cmd/stillpoint demo`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runDemo(cmd.Context(), env, f) },
	}
	fl := cmd.Flags()
	fl.IntVar(&f.rollouts, "rollouts", 32, "tasks in the set")
	fl.IntVar(&f.agents, "agents", 2, "nodes: agent processes, each with a sandbox owner of its own")
	fl.StringVar(&f.dir, "dir", "", "work directory: logs, results, the NATS store (default: a new one under the temp dir)")
	fl.StringVar(&f.provider, "provider", "auto", "sandbox provider: auto (overlay as root, else dir), overlay, dir, microvm (QEMU microVMs: make microvm-assets first)")
	fl.BoolVar(&f.cluster, "cluster", false, "run a 3-node NATS cluster (R3) instead of one server")
	// With the global --nats-url the demo uses that server instead.
	fl.BoolVar(&f.auth, "auth", false, "give every component its own credentials (decentralized auth: a user per member, per sandbox)")
	fl.StringVar(&f.run, "run", "demo", "the run id (with --nats-url, one per demo on that server; with credentials lower case, no underscore)")
	fl.StringVar(&f.authDir, "auth-dir", "", "with --nats-url: that server's keys and creds (stillpoint server --auth-dir)")
	fl.DurationVar(&f.tool, "tool-time", defaultToolTime, "how long each task's slow tool call runs")
	fl.StringVar(&f.tasks, "tasks", "", "the task set: swe (the SWE-style set, each task in a sandbox of its own image; with --harness opencode, claude or codex), or none: the harness's own")
	fl.IntVar(&f.branches, "branches", 0, "after the crash restore, branch one rollout the restored checkpoint holds mid-run this many ways (docs/BRANCHES.md)")
	fl.StringVar(&f.harness, "harness", harnessScripted, "the agents' harness: scripted (the scripted task set), opencode, claude or codex (the repository tasks, run by the real OpenCode, Claude Code or Codex) or exec (the scripted task set, run by the exec adapter's example agent)")
	return cmd
}

// defaultToolTime is --tool-time's default.
const defaultToolTime = 4 * time.Second

// Fleet is one run's world: its work directory, the binaries, the
// bridge, the nodes (each an agent and its sandbox owner) as processes of
// the stillpoint binary, and the processes it started. The demo runs on
// one; the chaos injector (e2e/chaos) runs each of its rounds on one
// (NewFleet).
type Fleet struct {
	env      Env
	f        demoFlags
	dir      string
	self     string
	sandboxd string
	harness  string
	driver   string // the driver of OpenCode, Claude Code or Codex, with --harness opencode, claude or codex
	execDir  string // the exec example's folder, with --harness exec
	natsURL  string
	authDir  string
	auth     *embedded.Authority // with credentials: mints the members' users
	run      string
	ids      []string // the rollouts of the task set
	inFlight int      // how many the collector runs at once
	lastTurn int      // the scripted tasks' last turn (each has as many)
	token    string
	log      zerolog.Logger
	// who starts the lines it says (default "demo").
	who string
	// bridgeAddr is the bridge's API address, once it started.
	bridgeAddr string
	// modelAddr is the model server's host address (a microvm owner
	// forwards its guests to it).
	modelAddr string
	// metricsAddrs are the --metrics-addr of each process name (and
	// "collector", served in this process), kept across restarts so that
	// a scraper keeps its targets.
	metricsAddrs map[string]string
	// wrap is FleetConfig.Wrap.
	wrap func(proc string) []string
	// registerWait bounds waitMember (FleetConfig.RegisterWait).
	registerWait time.Duration

	mu    sync.Mutex
	procs map[string]*child.Process // the latest process of each name
	all   []*child.Process          // every process started, killed ones too
}

// Say prints one line of the run's report, started by whom it is for
// (FleetConfig.Who; default "demo").
func (d *Fleet) Say(format string, args ...any) {
	who := d.who
	if who == "" {
		who = "demo"
	}
	fmt.Fprintf(d.env.Stdout, who+": "+format+"\n", args...)
}

func runDemo(ctx context.Context, env Env, f demoFlags) error {
	if f.rollouts < 1 || f.agents < 1 {
		return fmt.Errorf("%w: --rollouts and --agents must be at least 1", ErrUsage)
	}
	if f.harness == "" {
		f.harness = harnessScripted
	}
	if !slices.Contains([]string{harnessScripted, harnessOpenCode, harnessClaude, harnessCodex, harnessExec}, f.harness) {
		return fmt.Errorf("%w: --harness %q: want %s, %s, %s, %s or %s", ErrUsage, f.harness, harnessScripted, harnessOpenCode, harnessClaude, harnessCodex, harnessExec)
	}
	switch {
	case f.tasks == "":
	case f.tasks != tasksSWE:
		return fmt.Errorf("%w: --tasks %q: want %s (or none: the harness's own set)", ErrUsage, f.tasks, tasksSWE)
	case f.harness != harnessOpenCode && f.harness != harnessClaude && f.harness != harnessCodex:
		return fmt.Errorf("%w: --tasks %s runs a real harness: --harness %s, %s or %s", ErrUsage, tasksSWE, harnessOpenCode, harnessClaude, harnessCodex)
	}
	d := &Fleet{env: env, f: f, run: cmp.Or(f.run, "demo"), token: fmt.Sprintf("demo-%d", time.Now().UnixNano()), procs: map[string]*child.Process{},
		log: zerolog.New(env.Stderr).Level(zerolog.WarnLevel).With().Timestamp().Logger()}
	var err error
	if d.dir, d.self, err = workAndProgram(env, f.dir, "stillpoint-demo-"); err != nil {
		return err
	}
	d.Say("work directory %s (logs, results, the NATS store)", d.dir)
	if err := d.build(ctx); err != nil {
		return err
	}
	began := time.Now()
	defer d.StopAll()
	stopNATS, err := d.startNATS(ctx)
	if err != nil {
		return err
	}
	defer stopNATS()
	conn := jetstream.ConnConfig{URL: d.natsURL, Name: "stillpoint-demo"}
	if d.authDir != "" {
		conn.CredsFile = d.roleCreds(embedded.RoleAdmin)
	}
	nc, js, bus, err := d.openBus(ctx, conn)
	if err != nil {
		return err
	}
	defer nc.Close()

	ts, script, inFlight, err := d.TaskSet(ctx)
	if err != nil {
		return err
	}
	d.inFlight = inFlight
	d.ids = make([]string, len(ts))
	for i, t := range ts {
		d.ids[i] = t.RolloutID
	}
	ms, modelAddr, stopModel, err := ServeModel(script)
	if err != nil {
		return err
	}
	defer stopModel()
	modelURL := "http://" + modelAddr
	d.modelAddr = modelAddr
	if f.provider == "microvm" {
		// The harness runs in a VM: it reaches the model server through
		// the owner's slirp forward, not the host's loopback.
		modelURL = "http://" + qemu.GuestUpstream
	}

	bridgeURL, err := d.StartBridge(ctx)
	if err != nil {
		return err
	}
	agents := AgentNames(f.agents)
	for _, a := range agents {
		if err := d.StartNode(ctx, bus, a, modelURL); err != nil {
			return err
		}
	}
	d.Say("NATS %s, bridge %s, owners %s, agents %s (a node each), model server %s", d.natsURL, bridgeURL,
		strings.Join(d.owners(), ","), strings.Join(agents, ","), modelURL)

	ctl, err := client.New(bridgeURL, d.token)
	if err != nil {
		return err
	}
	defer ctl.Close()
	verified := &invariant.Manifests{}
	var progress *os.File
	if fd, ok := env.Stderr.(*os.File); ok && isatty.IsTerminal(fd.Fd()) {
		progress = fd
	}
	set := metrics.New()
	stopMetrics, err := d.serveMetrics(ctx, set, metrics.All(metrics.Connected(nc), metrics.StreamAnswers(bus.Stream)), agents)
	if err != nil {
		return err
	}
	defer stopMetrics()
	cfg := collect.Config{Run: d.run, Tasks: ts, Output: filepath.Join(d.dir, "results.jsonl"), Agents: agents, Metrics: set,
		Conn: nc, JS: js, Bus: bus, Controller: ctl, Concurrency: inFlight, Keep: 0, RecoverGrace: 90 * time.Second,
		Logger: zerolog.New(OpenLogFile(filepath.Join(d.dir, "logs", "collect.log"))).With().Timestamp().Logger(),
		OnCommit: func(ctx context.Context, res *bridgeapi.CheckpointResult) {
			verified.OnCommit(ctx, bus, d.run, res.CheckpointID)
		}}
	if progress != nil {
		cfg.Progress = progress
	}
	col, err := collect.New(cfg)
	if err != nil {
		return err
	}
	dctx, stopDirector := context.WithCancel(ctx)
	defer stopDirector()
	directed := make(chan error, 1)
	go func() { directed <- d.direct(dctx, col, ms, bus, agents, modelURL, ctl) }()
	sum, err := col.Run(ctx)
	stopDirector()
	if derr := <-directed; derr != nil && !errors.Is(derr, context.Canceled) {
		d.Say("the crash step did not run as planned: %v", derr)
	}
	if err != nil {
		return fmt.Errorf("demo: collection: %w", err)
	}
	fmt.Fprintln(env.Stdout)
	collect.WriteSummary(env.Stdout, sum)
	fmt.Fprintln(env.Stdout)

	d.StopAll()
	leftover := d.Reap(ctx)
	inv := invariant.Check(ctx, invariant.Run{Run: d.run, JS: js, Bus: bus, Summary: sum,
		Results: filepath.Join(d.dir, "results.jsonl"), Rollouts: d.ids, Graded: d.Graded, Model: ms, UserTurns: d.userTurns(),
		Manifests: verified, Sandboxes: leftover, NeedRestore: true})
	fmt.Fprintln(env.Stdout, "invariants (PROTOCOL §7) checked on this run:")
	invariant.Write(env.Stdout, inv)
	failed := invariant.Failed(inv)
	fmt.Fprintln(env.Stdout)
	d.printReadBack(env.Stdout)
	fmt.Fprintf(env.Stdout, "took %s (build excluded)\n\n", time.Since(began).Round(100*time.Millisecond))

	verdict := "invariants ok"
	if len(failed) > 0 {
		verdict = "invariants FAILED: " + strings.Join(failed, ", ")
	}
	branches := ""
	if len(sum.Branches) > 0 {
		branches = fmt.Sprintf(" (%d of them branches)", len(sum.Branches))
	}
	fmt.Fprintf(env.Stdout, "demo: %d rollouts%s, %d results, %d continued in place, %d relaunched, %d checkpoints committed, %s\n",
		sum.Rollouts, branches, sum.Results, sum.ContinuedInPlace, sum.Relaunched, len(sum.Committed()), verdict)
	if len(failed) > 0 {
		return ErrInvariants
	}
	return nil
}

// startNATS starts the embedded server (or cluster) and provisions the
// bus, or uses --nats-url. The function it returns shuts the server down.
func (d *Fleet) startNATS(ctx context.Context) (func(), error) {
	if d.env.Conn.URL != "" {
		// A server of its own (one node or a cluster, run by `stillpoint
		// server`), which provisioned the bus.
		d.natsURL, d.authDir = d.env.Conn.URL, d.f.authDir
		if d.authDir != "" {
			// The run's account, made here if new: the server on the dir picks it up and
			// provisions its bus (waitProvisioned).
			var err error
			if d.auth, err = embedded.LoadAuthority(d.authDir); err != nil {
				return nil, err
			}
			if err := d.auth.AddRun(d.run); err != nil {
				return nil, fmt.Errorf("%w: --run: %w", ErrUsage, err)
			}
		}
		return func() {}, nil
	}
	if d.f.authDir != "" {
		return nil, fmt.Errorf("%w: --auth-dir goes with --nats-url (the server's seeds); alone, use --auth", ErrUsage)
	}
	var trust *embedded.Trust
	provision := jetstream.ConnConfig{Name: "stillpoint-demo-provision"}
	if d.f.auth {
		d.authDir = filepath.Join(d.dir, "auth")
		var err error
		if d.auth, err = embedded.LoadAuthority(d.authDir); err != nil {
			return nil, err
		}
		if err := d.auth.AddRun(d.run); err != nil {
			return nil, fmt.Errorf("%w: --run: %w", ErrUsage, err)
		}
		if trust, err = d.auth.Trust(); err != nil {
			return nil, err
		}
		provision.CredsFile = d.roleCreds(embedded.RoleAdmin)
	}
	topo := jetstream.Topology{}
	nlog := zerolog.New(OpenLogFile(filepath.Join(d.dir, "logs", "nats.log"))).With().Timestamp().Logger()
	var stop func()
	if d.f.cluster {
		c, err := embedded.StartCluster(ctx, embedded.ClusterConfig{Dir: filepath.Join(d.dir, "nats"), Trust: trust, Logger: nlog})
		if err != nil {
			return nil, err
		}
		d.natsURL = c.URL()
		topo.Replicas = c.Len()
		stop = c.Shutdown
	} else {
		s, err := embedded.Start(ctx, embedded.Config{Dir: filepath.Join(d.dir, "nats"), ServerName: "stillpoint-demo", Trust: trust, Logger: nlog})
		if err != nil {
			return nil, err
		}
		d.natsURL = s.ClientURL()
		stop = s.Shutdown
	}
	provision.URL = d.natsURL
	nc, js, err := ConnectJS(ctx, provision)
	if err != nil {
		stop()
		return nil, err
	}
	if _, err := jetstream.Provision(ctx, js, topo); err != nil {
		nc.Close()
		stop()
		return nil, err
	}
	if d.auth == nil {
		nc.Close()
		return stop, nil
	}
	// The run's owners mint their sandboxes' users through its authority,
	// which is the demo's own here (stillpoint server does it otherwise).
	if _, err := d.auth.ServeMint(nc, d.run); err != nil {
		nc.Close()
		stop()
		return nil, err
	}
	return func() { nc.Close(); stop() }, nil
}

// spawn starts a component as a process of the stillpoint binary, its
// output in logs/<name>.log (Spawn).
func (d *Fleet) spawn(name, as string, env []string, args ...string) error {
	return d.Spawn(d.self, name, as, env, args...)
}

// Spawn starts program with the global flags of the stillpoint command
// (the NATS URL, JSON logs) and args, its output in logs/<name>.log. With
// credentials, as is the bridge's role or the member the component is,
// whose user of its own is minted here.
func (d *Fleet) Spawn(program, name, as string, env []string, args ...string) error {
	full := []string{"--nats-url", d.natsURL, "--log-format", "json", "--log-level", "info"}
	if d.auth != nil {
		creds := d.roleCreds(embedded.Role(as))
		if as != string(embedded.RoleBridge) {
			b, _, err := d.auth.MemberCreds(d.run, events.Member(as), 0)
			if err != nil {
				return fmt.Errorf("demo: credentials of %s: %w", as, err)
			}
			creds = filepath.Join(embedded.RunDir(d.authDir, d.run), as+".creds")
			err = atomicfile.Write(creds, b, 0o600)
			clear(b)
			if err != nil {
				return fmt.Errorf("demo: credentials of %s: %w", as, err)
			}
		}
		full = append(full, "--creds", creds)
	}
	path, argv := program, append(full, args...)
	if d.wrap != nil {
		if pre := d.wrap(name); len(pre) > 0 {
			path, argv = pre[0], slices.Concat(pre[1:], []string{program}, argv)
		}
	}
	p, err := child.Start(child.Spec{Name: name, Path: path, Args: argv, Env: env,
		LogFile: filepath.Join(d.dir, "logs", name+".log")})
	if err != nil {
		return fmt.Errorf("demo: %w", err)
	}
	d.mu.Lock()
	d.procs[name] = p
	d.all = append(d.all, p)
	d.mu.Unlock()
	return nil
}

// direct drives the run: a checkpoint once every rollout in flight is
// under way (its second model call answered: in both task sets, its slow
// tool runs then), a second once a quarter have had two more calls
// answered (and, with a real harness, one rollout has returned and
// another waits at its last call), then the crash (SIGKILL of the agents
// and the owners, started again: the collector restores), then a third
// while relaunched rollouts are under way.
func (d *Fleet) direct(ctx context.Context, col *collect.Collector, ms *modelserver.Server, bus *jetstream.Bus, agents []string, modelURL string, ctl *client.Client) error {
	n, inFlight := len(d.ids), d.inFlight
	calls := func(min int) int {
		per := map[string]int{}
		for _, e := range ms.Ledger() {
			per[e.Task]++
		}
		k := 0
		for _, c := range per {
			if c >= min {
				k++
			}
		}
		return k
	}
	waitUntil := func(what string, cond func() bool) error {
		return poll.Until(ctx, poll.Every(50*time.Millisecond), func() (bool, error) {
			if cond() {
				return true, nil
			}
			if col.Counts().Done >= n {
				return false, fmt.Errorf("the collection finished before %s", what)
			}
			return false, nil
		})
	}
	committed := func() int { s := col.Summary(); return len(s.Committed()) }
	checkpoint := func(k int) error {
		col.CheckpointNow()
		return waitUntil(fmt.Sprintf("checkpoint %d", k), func() bool { return committed() >= k })
	}
	if err := waitUntil("every rollout in flight started", func() bool { return calls(2) >= inFlight }); err != nil {
		return err
	}
	if err := checkpoint(1); err != nil {
		return err
	}
	// The crash comes right after the second checkpoint. The scripted
	// rollouts finish close together, so it comes while a quarter are
	// on, and their last replies wait until the third checkpoint: however
	// slow the machine, none can end before the crash, and every one is
	// relaunched (on microvm the snapshots keep the processes, which go
	// on in place, their relays sending the held calls again). A real
	// harness's take longer and apart: the first to reach its last call
	// goes on and finishes in place (the first checkpoint paused it), and
	// the others' last replies wait, so that the crash finds them inside
	// their launches rather than at their grading.
	returned := 0
	if d.realHarness() {
		returned = min(1, inFlight-1) // a single rollout is held, not let through
		ms.HoldLast(returned)
	} else {
		ms.HoldFrom(d.lastTurn)
	}
	defer ms.Release()
	// With a real harness, and on microvm, the second checkpoint waits
	// for a last call held as well. On microvm its snapshot cuts that
	// call, which the fork's relay sends again after the restore
	// (recorded once, invariant 8).
	cut := d.realHarness() || d.f.provider == "microvm"
	if err := waitUntil("a quarter of the rollouts had two more calls answered", func() bool {
		return calls(4) >= max(inFlight/4, 1) && col.Counts().Done >= returned && (!cut || ms.Held() > 0)
	}); err != nil {
		return err
	}
	if err := checkpoint(2); err != nil {
		return err
	}
	d.Say("kill -9 of the agents and the owners")
	if err := d.Kill9(ctx, d.FleetProcs(agents)...); err != nil {
		return err
	}
	for _, a := range agents {
		if err := d.StartNode(ctx, bus, a, modelURL); err != nil {
			return err
		}
	}
	if err := waitUntil("the restore", func() bool { return len(col.Summary().Restores) > 0 }); err != nil {
		return err
	}
	restored := time.Now()
	d.Say("restored %s into the new processes", col.Summary().Restores[0])
	if d.f.branches > 0 {
		if err := d.branch(ctx, col, bus, ctl, col.Summary().Restores[0]); err != nil {
			return err
		}
	}
	if d.f.provider == "microvm" {
		// On microvm the restore resumed the held launches in place: they
		// finish in place whenever the third checkpoint comes.
		time.Sleep(300 * time.Millisecond)
		err := checkpoint(3)
		ms.Release()
		return err
	}
	// The third checkpoint pauses relaunched rollouts that are under way:
	// one has called the model since the restore (its new launch runs),
	// and its last reply is held until the checkpoint is over, so that the
	// launch goes on in place. Without the wait, on a slow machine, the
	// checkpoint could come before any launch had started again.
	wait, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err := poll.Until(wait, poll.Every(50*time.Millisecond), func() (bool, error) {
		l := ms.Ledger()
		return len(l) > 0 && l[len(l)-1].Time.After(restored), nil
	})
	if err != nil {
		return fmt.Errorf("no relaunched rollout called the model within 2 minutes of the restore: %w", err)
	}
	err = checkpoint(3)
	ms.Release()
	return err
}

// readBackURL is where the demo's commands to read a run back find its
// store, served again by `stillpoint server` once the demo's own server
// stopped.
const readBackURL = "nats://127.0.0.1:4333"

// printReadBack prints the commands that read the run back: each one works
// as printed, piped or not (TestPostmortemCommands in e2e runs them). With
// --nats-url the run stays on that server; otherwise its store is served
// again from the work directory.
func (d *Fleet) printReadBack(w io.Writer) {
	url := d.natsURL
	if d.env.Conn.URL != "" {
		fmt.Fprintf(w, "to read what happened (the run stays on the server at %s; docs/POSTMORTEM.md has more):\n", url)
	} else {
		url = readBackURL
		store := filepath.Join(d.dir, "nats")
		cluster := ""
		if d.f.cluster {
			cluster = " --cluster"
		}
		if d.authDir != "" {
			cluster += " --auth-dir " + d.authDir
		}
		fmt.Fprintf(w, "to read what happened (the store is in %s; docs/POSTMORTEM.md has more):\n", store)
		fmt.Fprintf(w, "  go run ./cmd/stillpoint server%s --dir %s --listen 127.0.0.1:4333 &\n", cluster, store)
	}
	conn := "--nats-url " + url
	natsConn := "--server " + url
	if d.authDir != "" {
		creds := d.roleCreds(embedded.RoleAdmin)
		conn += " --creds " + creds
		natsConn += " --creds " + creds
	}
	fmt.Fprintf(w, "  go run ./cmd/stillpoint timeline --run %s %s\n", d.run, conn)
	fmt.Fprintf(w, "  go run ./cmd/stillpoint inspect --run %s %s\n", d.run, conn)
	fmt.Fprintf(w, "  go run ./cmd/stillpoint trajectory --run %s %s --format jsonl\n", d.run, conn)
	fmt.Fprintf(w, "  nats %s sub --stream STILLPOINT --all -T --wait 5s --raw 'sp.%s.outcome.checkpoint.>'\n", natsConn, d.run)
	fmt.Fprintf(w, "  nats %s sub --stream STILLPOINT --all -T --wait 5s -t 'sp.%s.phase.>'\n", natsConn, d.run)
	fmt.Fprintf(w, "  nats %s sub --stream STILLPOINT --all -T --wait 5s --raw 'sp.%s.member.>'\n", natsConn, d.run)
	fmt.Fprintf(w, "  nats %s kv get sp_manifests %s\n", natsConn, events.HeadKey(d.run))
}
