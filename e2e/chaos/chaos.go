package chaos

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/stillpoint/stillpoint/cmd/stillpoint/demo"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/client"
	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/controller-bridge/invariant"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
)

// The kinds of fault chaos injects (--faults).
const (
	// FaultBridge arms the round's first bridge with a failpoint picked
	// from BridgeFailpoints: it kills itself there (SIGKILL), and is
	// started again.
	FaultBridge = "bridge"
	// FaultAgent, FaultOwner and FaultFleet kill (SIGKILL) one agent, one
	// owner, or every owner and agent at a phase of the run, and start
	// them again: the collector asks the survivors again, retires what
	// the dead held, or restores the last checkpoint into the fresh
	// fleet.
	FaultAgent = "agent"
	FaultOwner = "owner"
	FaultFleet = "fleet"
	// FaultSandboxd and FaultHarness kill (SIGKILL) one sandbox daemon, or
	// one process a daemon launched, at a phase; nothing starts them
	// again but the run's own recovery.
	FaultSandboxd = "sandboxd"
	FaultHarness  = "harness"
	// FaultNATS kills the NATS server (SIGKILL) at a phase and starts it
	// again on the same store and address.
	FaultNATS = "nats"
	// FaultNATSNode kills one node of the 3-node cluster (--cluster) with
	// SIGKILL at a point, and starts it again on its store once a
	// checkpoint has ended without it (or nodeDownFor has passed).
	FaultNATSNode = "nats-node"
	// FaultStall stops one agent (SIGSTOP) at a point: a member that never
	// answers, until the checkpoint fails; it is continued (SIGCONT) then,
	// and answers after the abort.
	FaultStall = "stall"
)

// Faults lists every fault kind, in the order the table prints them.
var Faults = []string{FaultBridge, FaultAgent, FaultOwner, FaultFleet, FaultNode, FaultPreempt, FaultSandboxd, FaultHarness, FaultNATS, FaultNATSNode,
	FaultStall, FaultCollector, FaultPartition, FaultOneWay, FaultSplit, FaultSlow, FaultLossy}

// BridgeFailpoints are the points FaultBridge arms (see the bridge's
// failpoint package); the abort and restore ones are hit only when the
// round aborts or restores, after-release-latest only in a release that
// deletes what LATEST names (the final one).
var BridgeFailpoints = []string{
	"bridge/after-prepare", "bridge/after-prepare-acks", "bridge/after-commit", "bridge/after-commit-acks",
	"bridge/after-manifest", "bridge/after-latest", "bridge/after-outcome", "bridge/after-abort-marker",
	"bridge/after-release", "bridge/after-release-mark", "bridge/after-release-records", "bridge/after-release-member-list",
	"bridge/mid-release", "bridge/after-release-manifest", "bridge/after-release-latest", "bridge/after-release-outcome",
	"bridge/after-restore", "bridge/after-restore-acks",
}

// The points of a checkpoint a fault other than the bridge's waits for,
// beside the phases: a commit ack on the bus (its member manifest is
// written) and the checkpoint.committed outcome (the checkpoint manifest
// and LATEST are).
const (
	pointCommitAcked events.Phase = "commit-acked"
	pointCommitted   events.Phase = "committed"
	// pointFailed, the checkpoint.failed outcome, ends a stall.
	pointFailed events.Phase = "failed"
)

// chaosPhases are the points a fault other than the bridge's waits for (a
// restore only after a fleet's crash in the same round).
var chaosPhases = []events.Phase{events.PhasePrepare, events.PhaseCommit, pointCommitAcked, pointCommitted,
	events.PhaseResume, events.PhaseRestore, events.PhaseRelease}

// point names the point of a run's subject: its phase, pointCommitAcked
// for a commit ack, pointCommitted for the outcome, "" for the rest.
func point(run, subject string) events.Phase {
	rest, ok := strings.CutPrefix(subject, events.SubjectPrefix+"."+run+".")
	if !ok {
		return ""
	}
	parts := strings.Split(rest, ".")
	switch {
	case len(parts) == 2 && parts[0] == "phase":
		return events.Phase(parts[1])
	case len(parts) >= 3 && parts[0] == "ack" && parts[2] == string(events.PhaseCommit):
		return pointCommitAcked
	case subject == events.OutcomeSubject(run, events.TypeCheckpointCommitted):
		return pointCommitted
	case subject == events.OutcomeSubject(run, events.TypeCheckpointFailed):
		return pointFailed
	}
	return ""
}

type chaosFlags struct {
	seed     uint64
	duration time.Duration
	rollouts int
	agents   int
	dir      string
	provider string
	faults   string
	perRound int
	every    time.Duration
	tool     time.Duration
	steps    int
	plan     string
	cluster  bool
	netns    bool
	limit    time.Duration
	grace    time.Duration
	nodeDown time.Duration
}

// Command returns the `chaos` command, with its subcommands node and
// collect, which it runs as processes of its own binary. Its errors wrap ErrUsage for a
// wrong call; ErrInvariants says an invariant failed in some round.
func Command(env Env) *cobra.Command {
	var f chaosFlags
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Collect rollouts in rounds while injecting random faults, and check the invariants after each",
		Long: `Run the demo's system (a NATS server, the bridge, --agents nodes of an agent and its
sandbox owner, each its own process, and the scripted model server) through rounds of collection until --duration has
passed: each round is a run of its own with --rollouts scripted tasks, a checkpoint every
--every (each task makes --steps quick tool calls and a slow one of --tool-time), and --per-round faults drawn from --faults by the seed, each at a random moment:

  bridge    the bridge armed with a failpoint (a phase point: after-prepare, -commit-acks,
            -manifest, -latest, -outcome, -release, -restore, ...) kills itself there
  agent     kill -9 of one agent at a point (the phases prepare, commit, resume, restore,
            release; commit-acked: a member manifest written; committed: the checkpoint
            manifest written), started again
  owner     kill -9 of one node's sandbox owner at a phase, started again
  fleet     kill -9 of every owner and agent at a phase, started again: a restore
  node      kill -9 of one node's agent and owner at a point, its sandboxes stopped; started
            again once a checkpoint committed without them and --node-down has passed
            (needs --agents 2 or more)
  preempt   SIGTERM to the round's collector (then a process of its own) while a node is
            down: it stops after a checkpoint; the job comes back (every agent and owner
            started again) and the collector is run again, restoring. Drawn after a node
            fault; in --plan node@committed+preempt@prepare
  sandboxd  kill -9 of one sandbox daemon at a phase
  harness   kill -9 of one process a sandbox daemon launched, at a phase
  nats      kill -9 of the NATS server at a phase, started again on the same store
  nats-node with --cluster: kill -9 of one NATS node at a point, started again on its
            store once a checkpoint ended without it
  stall     SIGSTOP of one agent at a point (a member that never answers) until a
            checkpoint fails, then SIGCONT (it answers after the abort)
  collector kill -9 of the round's collector (then a process of its own) at a phase,
            started again on its results and dispatch log (not drawn by default)

With --netns (as root; implies --cluster), each NATS node and each node of an agent and
its owner runs in a network namespace of its own, and the network faults are drawn too:

  partition         one node of an agent and its owner cut off from everything, both
                    ways (nftables, or its link down), past the members' lease (40 s)
  partition-oneway  the same, one way only (it hears nothing, or nobody hears it), 15 s
  split             the NATS cluster split into a minority of one and a majority, 15 s
  slow              latency and jitter on every NATS connection (a proxy in front of
                    each node), one node's bandwidth bounded, 15 s
  lossy             a share of one node's packets dropped at random, 15 s

Each round's first fault is the next network kind in turn; each heals at the end of its
hold, and the invariants are checked once all are healed.

After each round every PROTOCOL §7 invariant is checked on it (controller-bridge/invariant), and at
the end a table says how many faults of each kind were injected, checkpoints committed and
aborted, restores, rollouts finished and invariant violations (0, or the command fails).
The same seed draws the same faults; when they land depends on the machine.

It builds the static stillpoint, sandboxd and harness binaries first, so run it from the stillpoint
checkout: go run ./e2e/cmd/chaos --seed 1 --duration 2m`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runChaos(cmd.Context(), env, f) },
	}
	cmd.AddCommand(nodeCommand(), collectorCommand(env))
	fl := cmd.Flags()
	fl.Uint64Var(&f.seed, "seed", 1, "the seed that draws the faults")
	fl.DurationVar(&f.duration, "duration", 2*time.Minute, "rounds start until this has passed (the last one finishes)")
	fl.IntVar(&f.rollouts, "rollouts", 8, "tasks in each round")
	fl.IntVar(&f.agents, "agents", 2, "nodes: agent processes, each with a sandbox owner of its own")
	fl.StringVar(&f.dir, "dir", "", "work directory: a directory per round, the NATS store (default: a new one under the temp dir)")
	fl.StringVar(&f.provider, "provider", "auto", "sandbox provider: auto (overlay as root, else dir), overlay, dir")
	fl.StringVar(&f.faults, "faults", "", "the fault kinds to draw from, comma-separated (default: every kind but collector and nats-node, or with --cluster but collector and nats; node and preempt with --agents 2 or more)")
	fl.DurationVar(&f.grace, "recover-grace", chaosRecoverGrace, "how long a round's collector waits for a fleet that restarted to settle (a restore needs all of it back)")
	fl.DurationVar(&f.limit, "round-limit", 5*time.Minute, "a round whose collection has not finished by then is stopped and counted as a violation")
	fl.BoolVar(&f.cluster, "cluster", false, "run NATS as a 3-node cluster (R3), each node its own process (the nats-node fault kills one)")
	fl.BoolVar(&f.netns, "netns", false, "run each NATS node and each node of an agent and its owner in a network namespace of its own, and draw the network faults (as root; implies --cluster)")
	fl.IntVar(&f.perRound, "per-round", 2, "faults in each round")
	fl.DurationVar(&f.every, "every", 2*time.Second, "checkpoint interval of each round")
	fl.DurationVar(&f.tool, "tool-time", 8*time.Second, "how long each task's slow tool call runs (a checkpoint catches it)")
	fl.IntVar(&f.steps, "steps", 2, "quick tool calls of each task before its slow one")
	fl.DurationVar(&f.nodeDown, "node-down", 0, "the least time a node fault keeps its node down (it also waits for a checkpoint that commits without it); raise --round-limit with it")
	fl.StringVar(&f.plan, "plan", "", "instead of drawing: one round per comma-separated entry, its faults joined by +, each kind@phase or bridge@<failpoint> (bridge@after-commit-acks+agent@prepare,fleet@commit)")
	return cmd
}

// chaosWorld is what the rounds share: the binaries, the NATS server
// process and its address.
type chaosWorld struct {
	env      Env
	f        chaosFlags
	dir      string
	self     string // this binary: its node and collect subcommands
	program  string // the stillpoint binary: the NATS server and the fleet
	sandboxd string
	harness  string
	natsURL  string
	natsAddr string

	// tool is the slow tool call of the round being run (0: --tool-time):
	// a planned round run again for a fault that missed its point runs
	// longer.
	tool time.Duration

	net *netWorld // with --netns

	mu     sync.Mutex
	nats   *child.Process
	nodes  []*clusterNode // with --cluster
	routes string         // every node's route URL, joined
}

// natsReadyRE is the line `stillpoint server` prints once it serves.
var natsReadyRE = regexp.MustCompile(`NATS ready at (\S+)`)

// startNATS starts `stillpoint server` on the world's store and address
// (a random one the first time) and waits until it serves.
func (w *chaosWorld) startNATS(ctx context.Context) error {
	addr := w.natsAddr
	if addr == "" {
		addrs, err := demo.FreeAddrs(1)
		if err != nil {
			return err
		}
		addr = addrs[0]
	}
	p, err := child.Start(child.Spec{Name: "nats", Path: w.program, Args: []string{"server", "--dir", filepath.Join(w.dir, "nats"), "--listen", addr},
		LogFile: filepath.Join(w.dir, "nats.log")})
	if err != nil {
		return fmt.Errorf("chaos: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	m, err := p.WaitOutput(wctx, natsReadyRE)
	if err != nil {
		p.Stop()
		return fmt.Errorf("chaos: the NATS server did not come up (see %s): %w", filepath.Join(w.dir, "nats.log"), err)
	}
	w.mu.Lock()
	w.nats, w.natsAddr, w.natsURL = p, addr, m[1]
	w.mu.Unlock()
	return nil
}

// restartNATS kills the NATS server with SIGKILL and starts it again on
// the same store and address.
func (w *chaosWorld) restartNATS(ctx context.Context) error {
	w.mu.Lock()
	p := w.nats
	w.mu.Unlock()
	kctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := p.Kill(kctx); err != nil {
		return err
	}
	p.Stop()
	return w.startNATS(ctx)
}

// cluster reports whether NATS runs as a cluster of node processes.
func (w *chaosWorld) cluster() bool { return len(w.nodes) > 0 }

func (w *chaosWorld) stopNATS() {
	w.mu.Lock()
	p := w.nats
	w.mu.Unlock()
	if p != nil {
		p.Stop()
	}
}

func runChaos(ctx context.Context, env Env, f chaosFlags) error {
	f.cluster = f.cluster || f.netns
	kinds := map[string]bool{}
	if strings.TrimSpace(f.faults) == "" {
		for _, k := range Faults {
			kinds[k] = k != FaultNATSNode && k != FaultNATS && k != FaultCollector || k == FaultNATSNode && f.cluster || k == FaultNATS && !f.cluster
			if k == FaultNode || k == FaultPreempt {
				kinds[k] = f.agents >= nodeFaultsNeed
			}
			if isNetFault(k) {
				kinds[k] = f.netns
			}
		}
	}
	for k := range strings.SplitSeq(f.faults, ",") {
		if k = strings.TrimSpace(k); k == "" {
			continue
		}
		if !slices.Contains(Faults, k) {
			return fmt.Errorf("%w: --faults: unknown kind %q (want some of %s)", ErrUsage, k, strings.Join(Faults, ","))
		}
		kinds[k] = true
	}
	if f.rollouts < 1 || f.agents < 1 || f.perRound < 0 || f.duration <= 0 || f.every <= 0 {
		return fmt.Errorf("%w: --rollouts and --agents must be at least 1, --per-round not negative, --duration and --every positive", ErrUsage)
	}
	if kinds[FaultNATSNode] && !f.cluster || kinds[FaultNATS] && f.cluster {
		return fmt.Errorf("%w: --faults: nats-node goes with --cluster, nats without", ErrUsage)
	}
	for k := range kinds {
		if kinds[k] && isNetFault(k) && !f.netns {
			return fmt.Errorf("%w: --faults: %s is a network fault: it needs --netns", ErrUsage, k)
		}
	}
	if (kinds[FaultNode] || kinds[FaultPreempt]) && f.agents < nodeFaultsNeed {
		return fmt.Errorf("%w: --faults: node and preempt need --agents %d or more (a node is an agent and its owner)", ErrUsage, nodeFaultsNeed)
	}
	var drawn []string
	for _, k := range Faults {
		if kinds[k] {
			drawn = append(drawn, k)
		}
	}
	if len(drawn) == 0 && f.perRound > 0 {
		return fmt.Errorf("%w: --faults names no kind", ErrUsage)
	}
	planned, err := parsePlan(f.plan)
	if err != nil {
		return err
	}
	for _, round := range planned {
		if !f.netns && slices.ContainsFunc(round, func(p plannedFault) bool { return isNetFault(p.kind) }) {
			return fmt.Errorf("%w: --plan: the network faults (%s) need --netns", ErrUsage, strings.Join(netFaults, ", "))
		}
		if f.agents < nodeFaultsNeed && slices.ContainsFunc(round, func(p plannedFault) bool { return p.kind == FaultNode || p.kind == FaultPreempt }) {
			return fmt.Errorf("%w: --plan: node and preempt need --agents %d or more (a node is an agent and its owner)", ErrUsage, nodeFaultsNeed)
		}
	}
	w := &chaosWorld{env: env, f: f}
	if w.dir, err = demo.WorkDir(f.dir, "stillpoint-chaos-"); err != nil {
		return err
	}
	if w.self, err = os.Executable(); err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "chaos: work directory %s (a directory per round, the NATS store)\n", w.dir)
	if err := w.build(ctx); err != nil {
		return err
	}
	if f.netns {
		if w.net, err = startNet(ctx, demo.AgentNames(f.agents)); err != nil {
			return err
		}
		defer w.net.close()
		fmt.Fprintf(env.Stdout, "chaos: network %s: the NATS nodes and %d nodes of an agent and its owner, each in a namespace of its own\n", w.net.tag(), f.agents)
	}
	if f.cluster {
		defer w.stopCluster()
		if err := w.startCluster(ctx); err != nil {
			return err
		}
	} else {
		if err := w.startNATS(ctx); err != nil {
			return err
		}
		defer w.stopNATS()
	}

	rng := rand.New(rand.NewPCG(f.seed, f.seed^0x5eed))
	t := &chaosTable{injected: map[string]int{}, missed: map[string]int{}}
	began := time.Now()
	for round := 1; planned != nil && round <= len(planned) || planned == nil && (round == 1 || time.Since(began) < f.duration); round++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if planned != nil {
			if err := w.plannedRound(ctx, round, planned, rng.Uint64(), t); err != nil {
				return err
			}
			continue
		}
		plan := make([]plannedFault, f.perRound)
		restores := false // a restore phase comes only after a fleet's crash
		draw := func() plannedFault {
			phases := chaosPhases
			if !restores {
				phases = slices.DeleteFunc(slices.Clone(phases), func(p events.Phase) bool { return p == events.PhaseRestore })
			}
			p := plannedFault{kind: drawn[rng.IntN(len(drawn))], phase: phases[rng.IntN(len(phases))],
				after: time.Duration(rng.Int64N(int64(f.tool))), failpoint: BridgeFailpoints[rng.IntN(len(BridgeFailpoints))]}
			restores = restores || p.kind == FaultFleet
			return p
		}
		// With --netns, every round has a network fault: its first is
		// the next network kind in turn, so that a short run has each.
		net := slices.DeleteFunc(slices.Clone(drawn), func(k string) bool { return !isNetFault(k) })
		for i := range plan {
			plan[i] = draw()
			if i == 0 && len(net) > 0 {
				plan[0].kind, restores = net[(round-1)%len(net)], false
			}
		}
		// A preempt comes while a node is down: one is drawn before it.
		plan = withNodes(plan, draw)
		if err := w.round(ctx, round, plan, rng.Uint64(), t); err != nil {
			return err
		}
	}
	fmt.Fprintln(env.Stdout)
	t.write(env.Stdout, f, time.Since(began))
	if len(t.violations) > 0 {
		return ErrInvariants
	}
	return nil
}

// round runs one collection with its faults, checks the invariants on it,
// and adds it to the table. Only a failure to set the round up is an
// error; what the faults break is in the table.
func (w *chaosWorld) round(ctx context.Context, k int, plan []plannedFault, pick uint64, t *chaosTable) error {
	// Run ids of their own: the process table is searched by run.
	run := fmt.Sprintf("chaos%d-%08x", k, uint32(time.Now().UnixNano()))
	d := demo.NewFleet(demo.FleetConfig{Env: demo.Env{Stdout: w.env.Stdout, Stderr: w.env.Stderr}, Who: "chaos " + run, Dir: filepath.Join(w.dir, run),
		Program: w.program, Sandboxd: w.sandboxd, Harness: w.harness, NATSURL: w.natsURL, Run: run, Token: fmt.Sprintf("chaos-%d", time.Now().UnixNano()),
		Rollouts: w.f.rollouts, Agents: w.f.agents, Provider: w.f.provider, Tool: cmp.Or(w.tool, w.f.tool), Steps: w.f.steps, Wrap: w.wrap(),
		RegisterWait: w.registerWait()})
	defer d.StopAll()
	var names []string
	for _, p := range plan {
		names = append(names, p.String())
	}
	fmt.Fprintf(w.env.Stdout, "chaos: round %d (%s): faults %s\n", k, run, strings.Join(names, ", "))

	nc, js, err := demo.ConnectJS(ctx, jetstream.ConnConfig{URL: w.natsURL, Name: "stillpoint-chaos"})
	if err != nil {
		return err
	}
	defer nc.Close()
	if w.f.cluster {
		if err := waitCurrent(ctx, js); err != nil {
			return err
		}
	}
	bus, err := jetstream.Open(ctx, js)
	if err != nil {
		return err
	}
	ts, script, _, err := d.TaskSet(ctx)
	if err != nil {
		return err
	}
	var ids []string
	for _, tk := range ts {
		ids = append(ids, tk.RolloutID)
	}
	ms, modelAddr, stopModel, err := demo.ServeModelOn(script, w.modelHost())
	if err != nil {
		return err
	}
	defer stopModel()
	modelURL := "http://" + modelAddr

	// One bridge fault a round: the first bridge is armed, the ones it is
	// started again as are not; a second one drawn is missed.
	var armed []string
	extraBridge := 0
	for _, p := range plan {
		switch {
		case p.kind == FaultBridge && len(armed) == 0:
			armed = append(armed, "STILLPOINT_FAILPOINTS="+p.failpoint)
		case p.kind == FaultBridge:
			extraBridge++
		}
	}
	bridgeURL, err := d.StartBridge(ctx, armed...)
	if err != nil {
		return err
	}
	agents := demo.AgentNames(w.f.agents)
	for _, a := range agents {
		if err := d.StartNode(ctx, bus, a, modelURL); err != nil {
			return err
		}
	}
	ctl, err := client.New(bridgeURL, d.Token())
	if err != nil {
		return err
	}
	defer ctl.Close()
	verified := &invariant.Manifests{}
	var (
		col  *collect.Collector
		proc *collectorProcess // a collector fault: the collector is a process
	)
	if isCollectorRound(plan) {
		proc = &collectorProcess{d: d, program: w.self, args: collectorArgs(d, w, bridgeURL, agents)}
	} else {
		col, err = collect.New(collect.Config{Run: run, Tasks: ts, Output: filepath.Join(d.Dir(), "results.jsonl"), Agents: agents,
			Conn: nc, JS: js, Bus: bus, Controller: ctl, Concurrency: len(ts), CheckpointEvery: w.f.every, RecoverGrace: cmp.Or(w.f.grace, chaosRecoverGrace),
			Logger: zerolog.New(demo.OpenLogFile(filepath.Join(d.Dir(), "logs", "collect.log"))).With().Timestamp().Logger(),
			OnCommit: func(ctx context.Context, res *bridgeapi.CheckpointResult) {
				verified.OnCommit(ctx, bus, run, res.CheckpointID)
			}})
		if err != nil {
			return err
		}
	}
	done := func() int {
		if col != nil {
			return col.Counts().Done
		}
		return resultLines(filepath.Join(d.Dir(), "results.jsonl"))
	}

	inj := &injector{w: w, d: d, bus: bus, nc: nc, agents: agents, ids: ids, modelURL: modelURL, rng: rand.New(rand.NewPCG(pick, 1)),
		collector: proc, injected: map[string]int{}, missed: map[string]int{FaultBridge: extraBridge}}
	ictx, stopInjecting := context.WithCancel(ctx)
	var wg sync.WaitGroup
	firstFailpoint := ""
	for _, p := range plan {
		if p.kind == FaultBridge {
			firstFailpoint = p.failpoint
			break
		}
	}
	wg.Go(func() { inj.bridgeWatch(ictx, len(armed) > 0, firstFailpoint) })
	rctx, stopRound := context.WithTimeoutCause(ctx, cmp.Or(w.f.limit, 5*time.Minute), errRoundLimit)
	var (
		sum  collect.Summary
		cerr error
	)
	if proc != nil {
		if err := verifyCommits(ictx, nc, bus, run, verified, &wg); err != nil {
			stopRound()
			stopInjecting()
			wg.Wait()
			return err
		}
		if err := proc.start(ts); err != nil {
			stopRound()
			stopInjecting()
			wg.Wait()
			return err
		}
		wg.Go(func() { inj.run(ictx, plan, done) })
		sum, cerr = proc.wait(rctx)
	} else {
		wg.Go(func() { inj.run(ictx, plan, done) })
		sum, cerr = col.Run(rctx)
	}
	stopRound()
	if errors.Is(context.Cause(rctx), errRoundLimit) {
		cerr = fmt.Errorf("%w (%s): %d results of %d", errRoundLimit, cmp.Or(w.f.limit, 5*time.Minute), done(), len(ids))
	}
	stopInjecting()
	wg.Wait()
	// Every invariant is checked after healing: the network's faults
	// undone, and every stream's replicas current again.
	if w.net != nil {
		if err := w.net.heal(context.WithoutCancel(ctx)); err != nil {
			t.violations = append(t.violations, fmt.Sprintf("round %d: the network did not heal: %v", k, err))
		}
		if err := waitCurrent(context.WithoutCancel(ctx), js); err != nil {
			t.violations = append(t.violations, fmt.Sprintf("round %d: the cluster did not heal: %v", k, err))
		}
	}
	if cerr != nil {
		t.violations = append(t.violations, fmt.Sprintf("round %d: the collection failed: %v", k, cerr))
	}
	// A bridge that died in the final release leaves it to the next
	// one: it is up again (the watch restarted it), and finishes it.
	if err := waitIdle(ctx, ctl, d); err != nil {
		t.violations = append(t.violations, fmt.Sprintf("round %d: %v", k, err))
	}
	// What is left is checked and cleaned up even when ctx ended.
	ctx = context.WithoutCancel(ctx)
	d.StopAll()
	leftover := d.Reap(ctx)
	procs, perr := demo.RunProcesses(run)
	if perr != nil {
		procs = append(procs, "(process table: "+perr.Error()+")")
	}
	inv := invariant.Check(ctx, invariant.Run{Run: run, JS: js, Bus: bus, Summary: sum, Results: filepath.Join(d.Dir(), "results.jsonl"),
		Rollouts: ids, Graded: d.Graded, Model: ms, Manifests: verified, Sandboxes: leftover, Processes: procs, Settle: w.settle()})
	for _, r := range inv {
		if !r.OK {
			t.violations = append(t.violations, fmt.Sprintf("round %d: %d. %s: %s", k, r.N, r.Name, r.Detail))
		}
	}
	t.rounds++
	inj.mu.Lock()
	for kind, n := range inj.injected {
		t.injected[kind] += n
	}
	for kind, n := range inj.missed {
		t.missed[kind] += n
	}
	t.lastMissed = slices.Clone(inj.missedNames)
	inj.mu.Unlock()
	committed, aborted := 0, 0
	for _, ck := range sum.Checkpoints {
		if ck.Status == bridgeapi.StatusCommitted {
			committed++
		} else {
			aborted++
		}
	}
	t.committed += committed
	t.aborted += aborted
	t.restores += len(sum.Restores)
	t.rollouts += len(ids)
	t.finished += sum.Results
	verdict := "invariants ok"
	if failed := invariant.Failed(inv); len(failed) > 0 {
		verdict = "invariants FAILED: " + strings.Join(failed, ", ")
	}
	fmt.Fprintf(w.env.Stdout, "chaos: round %d: %d results of %d, %d committed, %d aborted, %d restores, %s\n",
		k, sum.Results, len(ids), committed, aborted, len(sum.Restores), verdict)
	return nil
}

// waitIdle waits for the bridge to serve with no operation open.
func waitIdle(ctx context.Context, ctl *client.Client, d *demo.Fleet) error {
	wctx, cancel := context.WithTimeoutCause(ctx, 60*time.Second,
		fmt.Errorf("the bridge is not idle a minute after the collection ended; see %s", filepath.Join(d.Dir(), "logs", "bridge.log")))
	defer cancel()
	return poll.Until(wctx, poll.Every(200*time.Millisecond), func() (bool, error) {
		once, cancel := context.WithTimeout(wctx, 2*time.Second)
		defer cancel()
		st, err := ctl.Status(once)
		return err == nil && st.Open == "", nil
	})
}

// errRoundLimit is the cause of a round stopped at --round-limit.
var errRoundLimit = errors.New("the collection did not finish within the round limit")

// chaosRecoverGrace is how long a round's collector waits for the fleet
// to settle after a crash: every fault starts what it killed again at
// once, and a partial loss (one agent, the owner) waits out the whole
// grace before its rollouts start over.
const chaosRecoverGrace = 15 * time.Second

// nodeDownFor bounds how long a killed node stays down when no checkpoint
// ends meanwhile.
const nodeDownFor = 20 * time.Second

// stallLimit bounds a stall that sees no checkpoint fail.
const stallLimit = time.Minute

// clusterListSettle is how long a cluster round's check reads again the
// snapshots and records it finds left (invariant.Run.Settle).
const clusterListSettle = 15 * time.Second

// settle is the check's invariant.Run.Settle: on a cluster, a node killed
// in the round may still be catching up, and a listing served by it show
// what the release just deleted.
func (w *chaosWorld) settle() time.Duration {
	if w.f.cluster {
		return clusterListSettle
	}
	return 0
}
