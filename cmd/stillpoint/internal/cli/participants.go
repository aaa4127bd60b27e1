package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sync/errgroup"

	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/agent"
	"github.com/stillpoint/stillpoint/participants/claude"
	"github.com/stillpoint/stillpoint/participants/codex"
	"github.com/stillpoint/stillpoint/participants/opencode"
	"github.com/stillpoint/stillpoint/participants/owner"
	"github.com/stillpoint/stillpoint/participants/owner/commandkind"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm/qemu"
	"github.com/stillpoint/stillpoint/participants/owner/provider/registry"
	"github.com/stillpoint/stillpoint/participants/scripted"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

type agentFlags struct {
	run         string
	name        string
	owner       string
	modelURL    string
	adapter     string
	harness     string
	harnessSpec string
	concurrency int
	noPause     bool
	timeout     time.Duration
	clock       string
	noFreeze    bool
	freezeWait  time.Duration
	metricsAddr string
}

func newAgentCmd(g *globals) *cobra.Command {
	var f agentFlags
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run an agent: rollouts of the scripted harness in sandboxes an owner lends",
		Long: `Run the agent (member agent.<name>) of a run: it serves rollout requests on the
micro endpoint spsvc.<run>.agent.<name>.run, drives each rollout through seed,
harness, verify and return in a sandbox the owner lends, and takes part in every
checkpoint: runs park at their bookmark, launches pause in place, a restore
continues them.

--adapter chooses the harness:
  scripted  the scripted coding agent (--harness is its path in the sandbox)
  opencode  OpenCode 1.18.33 through its driver, both shown in the sandbox by
            the owner's --opencode (docs/OPENCODE.md)
  claude    Claude Code 2.1.332 through its driver, both shown in the sandbox
            by the owner's --claude (docs/CLAUDE.md); --model-url serves the
            Anthropic Messages API, or chat completions through the owner's
            --model-api-translate
  codex     Codex CLI 0.171.0 through its driver, both shown in the sandbox by
            the owner's --codex (docs/CODEX.md); --model-url serves the
            OpenAI Responses API, or chat completions likewise
  exec      a harness defined in JSON (--harness-spec FILE; docs/HARNESSES.md)`,
		Example: `  stillpoint agent --run train-7 --name a1 --owner o1 --model-url http://127.0.0.1:8000
  stillpoint agent --run train-7 --name a1 --owner o1 --model-url http://127.0.0.1:8000 --adapter opencode
  stillpoint agent --run train-7 --name a1 --owner o1 --model-url http://127.0.0.1:8000 --adapter exec --harness-spec participants/exec/example/spec.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runAgent(cmd.Context(), g, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.run, "run", env("STILLPOINT_RUN"), "run id (env STILLPOINT_RUN)")
	fl.StringVar(&f.name, "name", "a1", "agent name: member agent.<name>")
	fl.StringVar(&f.owner, "owner", "o1", "name of the sandbox owner that lends the sandboxes")
	fl.StringVar(&f.modelURL, "model-url", env("STILLPOINT_MODEL_URL"), "chat-completions server the harness calls (env STILLPOINT_MODEL_URL)")
	fl.StringVar(&f.adapter, "adapter", "scripted", "the harness: "+strings.Join(adapterNames(), ", "))
	fl.StringVar(&f.harness, "harness", scripted.HarnessPath, "the scripted harness's path inside the sandbox")
	fl.StringVar(&f.harnessSpec, "harness-spec", "", "--adapter exec: the harness's spec, a JSON file (docs/HARNESSES.md)")
	fl.IntVar(&f.concurrency, "concurrency", agent.DefaultConcurrency, "rollouts run at once")
	fl.BoolVar(&f.noPause, "no-pause", false, "never pause launches: stop them at a checkpoint and relaunch after it")
	fl.DurationVar(&f.timeout, "launch-timeout", 10*time.Minute, "time limit of one launch, paused time not counted")
	fl.StringVar(&f.clock, "clock-policy", string(agent.ClockContinuous), "a sandbox's clock after an in-place restore: continuous (kept continuous with the pause when it froze the launch) or host (set to the host's time)")
	fl.BoolVar(&f.noFreeze, "no-freeze", false, "on providers whose snapshots keep processes, hold launches at a checkpoint without freezing them (restore_sandbox_clock off)")
	fl.DurationVar(&f.freezeWait, "freeze-wait", sandboxapi.DefaultFreezeWait, "how long a freezing hold waits for every process to stop (checkpoint_freeze_wait_seconds)")
	metricsAddrFlag(fl, &f.metricsAddr)
	return cmd
}

func runAgent(ctx context.Context, g *globals, f agentFlags) error {
	log, err := g.logger()
	if err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	if f.modelURL == "" {
		return &exitError{code: ExitUsage, err: errors.New("--model-url (or STILLPOINT_MODEL_URL) is required")}
	}
	build, ok := adapters()[f.adapter]
	if !ok {
		return &exitError{code: ExitUsage, err: fmt.Errorf("--adapter %q: want one of %s", f.adapter, strings.Join(adapterNames(), ", "))}
	}
	adapter, err := build(adapterConfig{modelURL: f.modelURL, noPause: f.noPause, timeout: f.timeout, harness: f.harness, harnessSpec: f.harnessSpec})
	if err != nil {
		return &exitError{code: ExitUsage, err: fmt.Errorf("--adapter %s: %w", f.adapter, err)}
	}
	bus, js, closeBus, err := openBus(ctx, g, "stillpoint-agent-"+f.name, 1)
	if err != nil {
		return err
	}
	defer closeBus()
	var set *metrics.Set
	if f.metricsAddr != "" {
		set = metrics.New()
	}
	a, err := agent.New(agent.Config{Run: f.run, Name: f.name, JS: js, Bus: bus, Owner: f.owner, Concurrency: f.concurrency,
		Adapter: adapter, Logger: log, ModelURL: f.modelURL, ClockPolicy: agent.ClockPolicy(f.clock), NoFreeze: f.noFreeze, FreezeWait: f.freezeWait,
		Metrics: set})
	if err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	stopMetrics, err := startMetrics(ctx, g, f.metricsAddr, "agent "+string(a.Name()), set, memberReady(connOf(js), bus, f.run, a.Member()))
	if err != nil {
		return err
	}
	log.Info().Str("run", f.run).Str("member", string(a.Name())).Str("adapter", adapter.Name()).Msg("agent serving")
	fmt.Fprintf(g.stdout, "stillpoint: agent %s of run %s serving\n", a.Name(), f.run)
	err = quiet(a.Run(ctx))
	return errors.Join(err, stopMetrics())
}

type ownerFlags struct {
	run           string
	name          string
	taskKind      string
	provider      string
	stateDir      string
	sandboxd      string
	harness       string
	sandboxNATS   string
	sandboxCreds  string
	sandboxUsers  bool
	sandboxMode   string
	binds         []string
	opencode      string
	claude        string
	codex         string
	pinLimit      int
	noCheckpoints bool
	reap          bool
	sandboxLease  time.Duration
	accel         string
	upstream      string
	vmCache       string
	vmPrune       bool
	vmMem         int
	vmFullCopy    bool
	vmCPU         string
	sandboxdArgs  []string
	metricsAddr   string
	directModel   bool
	noTokens      bool
	translate     bool // --model-api-translate: the relays translate Messages and Responses to chat completions
	imageCache    string
	imageCacheMax int64
	imageCacheSet bool // --image-cache given: it must open
}

func newOwnerCmd(g *globals) *cobra.Command {
	var f ownerFlags
	cmd := &cobra.Command{
		Use:   "owner",
		Short: "Run a sandbox owner: sessions, their sandboxes, snapshots and forks",
		Long: `Run the sandbox owner (member owner.<name>) of a run. It lends a sandbox per
session on its provider (overlay as root, else dir), with sandboxd as the
sandbox's first process; it snapshots every live session at a checkpoint's
commit, forks them at a restore, and deletes snapshots on release. Agents
reach it on spsvc.<run>.owner.<name>.

--task-kind chooses how a session's sandbox is built from its task and how
it is graded. The kinds: ` + strings.Join(taskKindNames(), ", ") + `.
  scripted  the scripted harness copied in (--harness); the grade runs the
            check the task names and compares its output
  command   a task defined in its JSON (docs/TASKS.md): a workspace copied
            in, setup commands, pinned paths, and a verify command whose exit
            status or JSON output is the reward; --harness, if given, is
            copied in (or shown with the binaries directory)
  swe       a SWE-bench instance (docs/TASKS.md): the sandbox is its image
            (the image field), the repository at base_commit in the image's
            working directory; the grade applies the test patch over the
            model's diff and runs FAIL_TO_PASS and PASS_TO_PASS as SWE-bench
            does; reward 1 when resolved

--sandboxd and --harness are host paths of static binaries (CGO_ENABLED=0):
go build -o bin/ ./cmd/sandboxd ./cmd/scripted-harness. In one directory
(named sandboxd and scripted-harness), that directory is shown read-only in
every sandbox at /opt/stillpoint/bin; otherwise they are copied in.

--opencode DRIVER shows OpenCode in every sandbox, for agents with
--adapter opencode: the OpenCode binary (` + opencode.BinaryEnv + `, or the npm
install of ` + opencode.NPMPackage + ` in ` + opencode.SystemCache + ` or
~/.cache/stillpoint/opencode), ripgrep (rg on PATH) and DRIVER, the static
opencode-driver (go build ./cmd/opencode-driver), read-only at
` + opencode.SandboxBinDir + `. --claude DRIVER shows Claude Code likewise, for
--adapter claude: its binary (` + claude.BinaryEnv + `, or the npm install of
` + claude.NPMPackage + ` in ` + claude.SystemCache + ` or
~/.cache/stillpoint/claude) and DRIVER, the static claude-driver, read-only at
` + claude.SandboxBinDir + `. --codex DRIVER shows Codex the same way, for
--adapter codex: the Codex binary (` + codex.BinaryEnv + `, or the npm install of
` + codex.NPMPackage + ` in ` + codex.SystemCache + ` or
~/.cache/stillpoint/codex) and DRIVER, the static codex-driver, read-only at
` + codex.SandboxBinDir + `. --bind HOST:SANDBOX shows any host directory
read-only in every sandbox; none of them is copied into snapshots.

A task that names an image (the "image" field of a command task, or of a
swe task, which needs one: an OCI layout directory, a docker save archive
or a registry reference) has its
sandbox made of that image: the owner resolves it into --image-cache
(default ` + defaultImageCache + `; layers unpacked once, pruned to
--image-cache-max least recently used first, never one a sandbox or kept
snapshot stands on) before any sandbox is made, and a bad image refuses
the seed naming the reference. overlay mounts the layers, microvm builds
a root disk of them once per image; dir refuses.`,
		Example: `  stillpoint owner --run train-7 --name o1 --sandboxd bin/sandboxd --harness bin/scripted-harness`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.imageCacheSet = cmd.Flags().Changed("image-cache")
			return runOwner(cmd.Context(), g, f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.run, "run", env("STILLPOINT_RUN"), "run id (env STILLPOINT_RUN)")
	fl.StringVar(&f.name, "name", "o1", "owner name: member owner.<name>")
	fl.StringVar(&f.taskKind, "task-kind", "scripted", "the kind of task served: "+strings.Join(taskKindNames(), ", "))
	fl.StringVar(&f.provider, "provider", "auto", "sandbox provider: auto (overlay as root, else dir), overlay, dir, microvm")
	fl.StringVar(&f.stateDir, "state-dir", "", "where sandboxes and snapshots live (default: a directory under the system temp dir)")
	fl.DurationVar(&f.sandboxLease, "sandbox-lease", microvm.DefaultSandboxLease, "microvm: a VM whose owner has not renewed its lease for this long powers itself off")
	fl.StringVar(&f.accel, "microvm-accel", "auto", "microvm: auto (KVM when a probe guest runs at speed, else TCG), kvm or tcg")
	fl.StringVar(&f.vmCache, "microvm-cache", "", "microvm: the directory of images and warm templates, which owners may share (default: under --state-dir)")
	fl.StringArrayVar(&f.sandboxdArgs, "sandboxd-arg", nil, "one more flag of every sandbox's sandboxd member, and its forks' (repeatable; e.g. --failpoint=relay-down in the end-to-end tests)")
	metricsAddrFlag(fl, &f.metricsAddr)
	fl.StringVar(&f.vmCPU, "microvm-cpu", "", "microvm: the guests' CPU model under TCG (default qemu64; max with --opencode, whose binary needs newer instructions)")
	fl.IntVar(&f.vmMem, "microvm-mem", microvm.DefaultMemMiB, "microvm: each guest's RAM in MiB (OpenCode needs about 1024)")
	fl.BoolVar(&f.vmFullCopy, "microvm-full-copy", false, "microvm: keep a snapshot's RAM in its state file, read in full by each fork (the design before RAM files, for comparison)")
	fl.BoolVar(&f.vmPrune, "microvm-prune-cache", false, "microvm: prune --microvm-cache at start (templates unused for an hour beyond the newest four); only for a cache no other owner's snapshots stand on")
	fl.StringVar(&f.upstream, "sandbox-upstream", "", "microvm: HOST:PORT of the model upstream, reachable in each VM at "+qemu.GuestUpstream)
	fl.StringVar(&f.sandboxd, "sandboxd", "", "host path of the static sandboxd binary (required)")
	fl.StringVar(&f.harness, "harness", "", "host path of the static harness binary (the scripted kind requires it)")
	fl.StringVar(&f.sandboxNATS, "sandbox-nats-url", "", "server URL the sandboxes' daemons use (default --nats-url)")
	fl.StringVar(&f.sandboxCreds, "sandbox-creds", "", "credentials copied into each sandbox for its daemon: a .creds file or an nkey seed (server --auth-dir --nkeys's sandbox.nk)")
	fl.BoolVar(&f.sandboxUsers, "sandbox-users", false, "give each sandbox a user of its own, minted by the server (stillpoint server --auth-dir) and renewed while it lives")
	fl.StringVar(&f.sandboxMode, "pause-mode", "", "sandboxd pause mode: freeze, stop or hold (default: the best the host allows)")
	fl.StringArrayVar(&f.binds, "bind", nil, "HOST:SANDBOX: a host directory shown read-only at SANDBOX in every sandbox (repeatable)")
	fl.StringVar(&f.opencode, "opencode", "", "host path of the static opencode-driver: show it, OpenCode and ripgrep in every sandbox")
	fl.StringVar(&f.claude, "claude", "", "host path of the static claude-driver: show it and Claude Code in every sandbox")
	fl.StringVar(&f.codex, "codex", "", "host path of the static codex-driver: show it and Codex in every sandbox")
	fl.IntVar(&f.pinLimit, "pin-limit", commandkind.DefaultMaxPin, "command kind: the most bytes a session's pinned files may take")
	fl.BoolVar(&f.noCheckpoints, "no-checkpoints", false, "lend sandboxes but take no part in checkpoints (restart_only)")
	fl.BoolVar(&f.reap, "reap", false, "stop the sandboxes an earlier owner process left in --state-dir, print their ids, and exit")
	fl.BoolVar(&f.directModel, "direct-model", false, "run no model relay in the sandboxes: harnesses call the model directly, and no rollout has a trajectory (on microvm, none continues in place either)")
	fl.BoolVar(&f.translate, "model-api-translate", false, "the sandboxes' relays send Anthropic Messages and OpenAI Responses calls (Claude Code, Codex) to the model server as chat completions, and translate the replies back, so that token ids are captured as for OpenCode (docs/TRAJECTORIES.md); not with --direct-model, which runs no relay")
	fl.StringVar(&f.imageCache, "image-cache", defaultImageCache, "the image cache: the layers of the images tasks name, unpacked once and shared by owners (overlay mounts them; microvm builds its root disks from them)")
	fl.Int64Var(&f.imageCacheMax, "image-cache-max", 0, "the image cache's size bound in bytes; images no sandbox or kept snapshot stands on are pruned, least recently used first, to stay under it (0: 20 GiB)")
	fl.BoolVar(&f.noTokens, "no-capture-tokens", false, "capture model calls without asking the model server for token ids and logprobs (a server that refuses return_token_ids)")
	return cmd
}

func runOwner(ctx context.Context, g *globals, f ownerFlags) error {
	log, err := g.logger()
	if err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	if f.translate && f.directModel {
		// The translation is the relay's, and --direct-model runs none.
		return &exitError{code: ExitUsage, err: errors.New("--model-api-translate and --direct-model: the translation is done by the sandboxes' relays, which --direct-model leaves out; use one")}
	}
	newKind, ok := taskKinds()[f.taskKind]
	if !ok {
		return &exitError{code: ExitUsage, err: fmt.Errorf("--task-kind %q: want one of %s", f.taskKind, strings.Join(taskKindNames(), ", "))}
	}
	if !f.reap && f.sandboxd == "" {
		return &exitError{code: ExitUsage, err: errors.New("--sandboxd is required (a static binary: CGO_ENABLED=0 go build ./cmd/sandboxd)")}
	}
	for _, p := range []*string{&f.sandboxd, &f.harness} {
		if f.reap || *p == "" {
			continue
		}
		abs, err := filepath.Abs(*p)
		if err != nil {
			return &exitError{code: ExitUsage, err: err}
		}
		if _, err := os.Stat(abs); err != nil {
			return &exitError{code: ExitUsage, err: err}
		}
		*p = abs
	}
	if f.stateDir == "" {
		f.stateDir = filepath.Join(os.TempDir(), "stillpoint-owner-"+f.run+"-"+f.name)
	}
	if f.stateDir, err = filepath.Abs(f.stateDir); err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	images, resolver, err := openImageCache(f.imageCache, f.imageCacheSet, f.imageCacheMax, log)
	if err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	mv := microvm.Config{Sandboxd: f.sandboxd, Lease: f.sandboxLease, Accel: f.accel, Upstream: f.upstream, CacheDir: f.vmCache,
		PruneCache: f.vmPrune, MemMiB: f.vmMem, CPU: f.vmCPU, FullCopy: f.vmFullCopy, Logger: log}
	if images != nil {
		// Not a nil *image.Cache in the interface: microvm tells "no
		// cache" by a nil interface.
		mv.Images = images
	}
	if f.opencode != "" && f.provider == "microvm" {
		// OpenCode and ripgrep are on the harness disk; the libraries they
		// load go into the guests' root image.
		h, err := opencode.Locate(f.opencode)
		if err != nil {
			return &exitError{code: ExitUsage, err: fmt.Errorf("--opencode: %w", err)}
		}
		mv.HostLibraries = []string{h.OpenCode, h.Ripgrep}
		if mv.CPU == "" {
			mv.CPU = "max" // qemu64 lacks instructions OpenCode's binary uses
		}
	}
	if f.claude != "" && f.provider == "microvm" {
		// Claude Code is on the harness disk; the libraries it loads go
		// into the guests' root image.
		h, err := claude.Locate(f.claude)
		if err != nil {
			return &exitError{code: ExitUsage, err: fmt.Errorf("--claude: %w", err)}
		}
		mv.HostLibraries = append(mv.HostLibraries, h.Claude)
		if mv.CPU == "" {
			mv.CPU = "max" // as for OpenCode: a Bun binary that wants newer instructions
		}
	}
	prov, reason, err := registry.Open(f.provider, filepath.Join(f.stateDir, "provider"), mv, imageFinder(images))
	if err != nil {
		return err
	}
	// A sandbox on disk at start is one a crashed owner process left: its
	// sessions live on only in checkpoints (a restore forks them), so it
	// is stopped, as the machine's crash would have.
	reap, _ := errgroup.WithContext(ctx)
	reap.SetLimit(8) // the owner joins the run only once they are gone
	var printMu sync.Mutex
	for _, id := range prov.Sandboxes() {
		reap.Go(func() error {
			if err := prov.Stop(ctx, id); err != nil {
				return fmt.Errorf("stop sandbox %s left by an earlier owner: %w", id, err)
			}
			log.Warn().Str("sandbox", id).Msg("stopped a sandbox left by an earlier owner process")
			if f.reap {
				printMu.Lock()
				fmt.Fprintln(g.stdout, id)
				printMu.Unlock()
			}
			return nil
		})
	}
	if err := reap.Wait(); err != nil {
		return err
	}
	if f.reap {
		return nil
	}
	natsURL := f.sandboxNATS
	if natsURL == "" {
		natsURL = g.conn.URL
	}
	var args []string
	if f.sandboxMode != "" {
		args = append(args, "--mode", f.sandboxMode)
	}
	switch {
	case f.directModel:
	case f.provider == "microvm":
		// Its snapshots keep processes: the harness calls the model through
		// the daemon's relay, which a checkpoint holds and a restore
		// re-points (PROTOCOL §6), on the guest's own loopback.
		args = append(args, "--relay", fmt.Sprintf("127.0.0.1:%d", sandboxapi.DefaultRelayPort))
	default:
		// Every model call goes through the sandbox's relay, which captures
		// it (docs/TRAJECTORIES.md); these sandboxes share the host's
		// network, so each relay takes a port of its own.
		args = append(args, "--relay", "127.0.0.1:0")
	}
	if f.noTokens {
		args = append(args, "--capture-tokens=false")
	}
	if f.translate {
		args = append(args, "--relay-translate", "chat")
	}
	args = append(args, f.sandboxdArgs...)
	sd := owner.SandboxdConfig{Binary: f.sandboxd, NATSURL: natsURL, Run: f.run, CredsFile: f.sandboxCreds, Args: args}
	if f.sandboxCreds != "" {
		// An nkey seed (the sandbox role's of server --auth-dir) goes in as --nkey.
		if seed, err := jetstream.IsNKeySeedFile(f.sandboxCreds); err != nil {
			return &exitError{code: ExitUsage, err: fmt.Errorf("--sandbox-creds: %w", err)}
		} else if seed {
			sd.CredsFile, sd.NKeyFile = "", f.sandboxCreds
		}
	}
	var sandboxUsers *owner.SandboxCreds
	if f.sandboxUsers {
		if f.sandboxCreds != "" {
			return &exitError{code: ExitUsage, err: errors.New("--sandbox-creds and --sandbox-users: use one")}
		}
		// The server mints them (jetstream.MintSubject) once connected, below.
		sandboxUsers = &owner.SandboxCreds{Run: f.run, Dir: filepath.Join(f.stateDir, "creds")}
		sd.Creds = sandboxUsers
	}
	if sd.Binds, err = sandboxBinds(f); err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	if filepath.Dir(f.sandboxd) == filepath.Dir(f.harness) && filepath.Base(f.harness) == filepath.Base(scripted.HarnessPath) {
		// Both binaries in one directory: it is shown read-only in each
		// sandbox, not copied, so snapshots do not carry them.
		sd.BinDir = filepath.Dir(f.sandboxd)
	}
	kind, err := newKind(taskKindConfig{sandboxd: sd, harness: f.harness, pinLimit: f.pinLimit})
	if err != nil {
		return &exitError{code: ExitUsage, err: fmt.Errorf("--task-kind %s: %w", f.taskKind, err)}
	}
	bus, js, closeBus, err := openBus(ctx, g, "stillpoint-owner-"+f.name, 1)
	if err != nil {
		return err
	}
	defer closeBus()
	if sandboxUsers != nil {
		sandboxUsers.Minter = jetstream.Minter{NC: connOf(js), Run: f.run}
		if err := sandboxUsers.Check(); err != nil {
			return &exitError{code: ExitUsage, err: fmt.Errorf("--sandbox-users: %w (is the server the run's authority, stillpoint server --auth-dir?)", err)}
		}
	}
	var set *metrics.Set
	if f.metricsAddr != "" {
		set = metrics.New()
	}
	o, err := owner.New(owner.Config{Run: f.run, Name: f.name, JS: js, Bus: bus, Provider: prov, Checkpointing: !f.noCheckpoints,
		LendsSandboxes: true, StateDir: filepath.Join(f.stateDir, "owner"), TaskKind: kind, Logger: log, SandboxCreds: sandboxUsers,
		Metrics: set, Images: resolver})
	if err != nil {
		return &exitError{code: ExitUsage, err: err}
	}
	stopMetrics, err := startMetrics(ctx, g, f.metricsAddr, "owner "+f.name, set, memberReady(connOf(js), bus, f.run, o.Member()))
	if err != nil {
		return err
	}
	defer func() { _ = stopMetrics() }()
	desc := prov.Name()
	if reason != "" {
		desc += ": " + reason
	}
	log.Info().Str("run", f.run).Str("provider", desc).Str("task_kind", f.taskKind).Msg("owner serving")
	fmt.Fprintf(g.stdout, "stillpoint: owner %s of run %s serving %s tasks (%s)\n", f.name, f.run, f.taskKind, desc)
	grp, gctx := errgroup.WithContext(ctx)
	grp.Go(func() error { return o.Run(gctx) })
	grp.Go(func() error { return o.Serve(gctx, connOf(js)) })
	return quiet(grp.Wait())
}

// sandboxBinds returns the binds of --bind, --opencode, --claude and
// --codex. --opencode stages OpenCode, ripgrep and the driver in the state
// directory (links where it can) and binds that; --claude and --codex
// likewise Claude Code or Codex and its driver.
func sandboxBinds(f ownerFlags) ([]provider.Bind, error) {
	var binds []provider.Bind
	for _, b := range f.binds {
		host, in, ok := strings.Cut(b, ":")
		if !ok || host == "" || !strings.HasPrefix(in, "/") {
			return nil, fmt.Errorf("--bind %q: want HOST:SANDBOX, SANDBOX absolute", b)
		}
		abs, err := filepath.Abs(host)
		if err != nil {
			return nil, err
		}
		if fi, err := os.Stat(abs); err != nil || !fi.IsDir() {
			return nil, fmt.Errorf("--bind %q: %s is not a directory", b, abs)
		}
		binds = append(binds, provider.Bind{HostDir: abs, SandboxDir: strings.TrimLeft(in, "/")})
	}
	if f.opencode != "" {
		h, err := opencode.Locate(f.opencode)
		if err != nil {
			return nil, fmt.Errorf("--opencode: %w", err)
		}
		ob, err := h.Binds(filepath.Join(f.stateDir, "opencode"))
		if err != nil {
			return nil, fmt.Errorf("--opencode: %w", err)
		}
		binds = append(binds, ob...)
	}
	if f.codex != "" {
		h, err := codex.Locate(f.codex)
		if err != nil {
			return nil, fmt.Errorf("--codex: %w", err)
		}
		cb, err := h.Binds(filepath.Join(f.stateDir, "codex"))
		if err != nil {
			return nil, fmt.Errorf("--codex: %w", err)
		}
		binds = append(binds, cb...)
	}
	if f.claude != "" {
		h, err := claude.Locate(f.claude)
		if err != nil {
			return nil, fmt.Errorf("--claude: %w", err)
		}
		cb, err := h.Binds(filepath.Join(f.stateDir, "claude"))
		if err != nil {
			return nil, fmt.Errorf("--claude: %w", err)
		}
		binds = append(binds, cb...)
	}
	return binds, nil
}

// quiet turns the end a signal asked for into a clean exit.
func quiet(err error) error {
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}
