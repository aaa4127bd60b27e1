package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/controller-bridge/collect/tasks"
	"github.com/stillpoint/stillpoint/controller-bridge/invariant"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/build"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/owner/provider/microvm/qemu"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxclient"
)

// bins are the binaries the end-to-end tests run as processes:
// stillpoint (agent, owner, collect, demo), and the static sandboxd,
// scripted harness and OpenCode driver that go into sandboxes.
type bins struct{ stillpoint, sandboxd, harness, driver string }

// buildBins builds them (internal/build: once per test binary, shared with
// the other packages' tests).
func buildBins(t testing.TB) bins {
	t.Helper()
	b := build.StaticForTest(t, build.Stillpoint, build.Sandboxd, build.ScriptedHarness, build.OpenCodeDriver)
	return bins{b[build.Stillpoint], b[build.Sandboxd], b[build.ScriptedHarness], b[build.OpenCodeDriver]}
}

// fleet is one run's world: an embedded server, the scripted model server,
// the bridge in this process, and an owner and agents as processes.
type fleet struct {
	t     testing.TB
	run   string
	env   *jstest.Env
	bins  bins
	ms    *modelserver.Server
	msURL string
	// later are the model servers a test started after ms, in turn.
	later  []*modelserver.Server
	script modelserver.Script
	br     *bridge.Bridge
	state  string
	tasks  []collect.Task
	kind   string // the owner's --task-kind
	mu     sync.Mutex
	procs  map[string]*child.Process // the latest process of each name
	// consoles logs the microVMs' consoles once, if the test failed.
	consoles sync.Once
	agents   []string
	// ownerArgs and agentArgs are more flags of every owner and agent
	// process the fleet starts.
	ownerArgs, agentArgs []string
	// provider is the owner's --provider (default overlay). On microvm the
	// owner forwards upstream (host:port, the model server's) into each VM,
	// and the agents' model URL is the guest's side of it (modelURL).
	provider string
	upstream string
	modelURL string
	// userTurns is how many user turns each model call carries (0: one;
	// Codex's carry its environment message too).
	userTurns int
}

type fleetOptions struct {
	n           int
	agents      int
	concurrency int
	noPause     bool
	toolSeconds float64
	steps       int
	// tasks and script replace tasks.Set's; kind is then the owner's
	// --task-kind (default scripted).
	tasks  []collect.Task
	script modelserver.Script
	kind   string
	// repos, when set, runs the repository set (tasks.Repos; its Dir is
	// made here) on an owner of the command kind instead of the scripted
	// set.
	repos *tasks.RepoOptions
	// swe, when set, runs the SWE-style set (tasks.SWE; its Dir is made
	// here) on an owner of the swe kind: each sandbox made from its
	// instance's image (give the owner --image-cache).
	swe *tasks.SWEOptions
	// ownerArgs and agentArgs are more flags of the owner and the agents.
	ownerArgs, agentArgs []string
	// provider is the owner's --provider (default overlay).
	provider string
}

func startFleet(t testing.TB, o fleetOptions) *fleet {
	t.Helper()
	b := buildBins(t)
	env := jstest.Start(t)
	ts, script, kind := o.tasks, o.script, o.kind
	switch {
	case o.repos != nil:
		ro := *o.repos
		ro.Dir = filepath.Join(t.TempDir(), "repos")
		var err error
		if ts, script, err = tasks.Repos(ro); err != nil {
			t.Fatal(err)
		}
		kind = "command"
	case o.swe != nil:
		so := *o.swe
		so.Dir = filepath.Join(t.TempDir(), "swe")
		var err error
		if ts, script, err = tasks.SWE(t.Context(), so); err != nil {
			t.Fatal(err)
		}
		kind = "swe"
	case ts == nil:
		ts, script = tasks.Set(tasks.Options{N: o.n, ToolSeconds: o.toolSeconds, Steps: o.steps})
	}
	if kind == "" {
		kind = "scripted"
	}
	ms := modelserver.New(script)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: ms}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close(); <-served })
	f := &fleet{t: t, run: "e2e", env: env, bins: b, ms: ms, msURL: "http://" + ln.Addr().String(), script: script, state: t.TempDir(),
		tasks: ts, kind: kind, procs: map[string]*child.Process{}, ownerArgs: o.ownerArgs, agentArgs: o.agentArgs,
		provider: o.provider, upstream: ln.Addr().String()}
	if f.provider == "" {
		f.provider = "overlay"
	}
	f.modelURL = f.msURL
	if f.provider == "microvm" {
		// The harness runs in a VM: it reaches the model server through the
		// owner's forward, not the host's loopback.
		f.modelURL = "http://" + qemu.GuestUpstream
	}
	// Registered before any process starts, so it runs once they all
	// stopped (each process's own cleanup stops it and dumps its output
	// if the test failed).
	t.Cleanup(f.reapLeftovers)
	log := zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)
	f.br, err = bridge.New(bridge.Config{Run: f.run, Conn: env.Conn, JS: env.JS, Bus: env.Bus, Logger: log, PhaseTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, "bridge", f.br.Run)
	f.startOwner()
	for i := range max(o.agents, 1) {
		name := fmt.Sprintf("a%d", i+1)
		f.agents = append(f.agents, name)
		args := []string{"--concurrency", fmt.Sprint(max(o.concurrency, 1))}
		if o.noPause {
			args = append(args, "--no-pause")
		}
		f.startAgent(name, args...)
	}
	return f
}

func (f *fleet) start(name string, member events.Member, args ...string) {
	f.t.Helper()
	prev := map[events.Member]string{}
	if e, err := f.env.Bus.Heartbeats(member.Kind()).Get(f.t.Context(), events.MemberKey(f.run, member)); err == nil {
		var info events.MemberInfo
		if json.Unmarshal(e.Value(), &info) == nil {
			prev[member] = info.Instance
		}
	}
	p := child.StartForTest(f.t, child.Spec{Name: name, Path: f.bins.stillpoint,
		Args: append([]string{"--nats-url", f.env.URL, "--log-format", "json", "--log-level", "info"}, args...)})
	f.mu.Lock()
	f.procs[name] = p
	f.mu.Unlock()
	// A fresh process: wait for its own heartbeat, not the one a killed
	// process left.
	poll.Wait(f.t, 30*time.Second, "member "+string(member)+" to register", func() bool {
		exitedEarly(f.t, p)
		e, err := f.env.Bus.Heartbeats(member.Kind()).Get(f.t.Context(), events.MemberKey(f.run, member))
		if err != nil {
			return false
		}
		var info events.MemberInfo
		return json.Unmarshal(e.Value(), &info) == nil && info.Instance != "" && info.Instance != prev[member]
	})
}

// exitedEarly fails the test if p has exited.
func exitedEarly(t testing.TB, p *child.Process) {
	t.Helper()
	select {
	case <-p.Exited():
		t.Fatalf("%s exited before it was ready", p.Name())
	default:
	}
}

func (f *fleet) startOwner() { f.startOwnerAs("owner", "o1") }

// startNodeOwner starts owner name of another node: process owner-<name>,
// state directory owner-<name>. Its agents say --owner <name>.
func (f *fleet) startNodeOwner(name string) { f.startOwnerAs("owner-"+name, name) }

// ownerState is the state directory of the owner whose process is proc.
func (f *fleet) ownerState(proc string) string { return filepath.Join(f.state, proc) }

func (f *fleet) startOwnerAs(proc, name string) {
	args := []string{"owner", "--run", f.run, "--name", name, "--provider", f.provider, "--task-kind", f.kind,
		"--state-dir", f.ownerState(proc), "--sandboxd", f.bins.sandboxd, "--harness", f.bins.harness}
	if f.provider == "microvm" {
		args = append(args, "--sandbox-upstream", f.upstream, "--microvm-cache", microVMCache, "--microvm-prune-cache")
	}
	f.start(proc, events.Member("owner."+name), append(args, f.ownerArgs...)...)
	// Before the owner stops (cleanups run last first): its sandboxes
	// are still there to read.
	f.t.Cleanup(f.showConsoles)
}

// consoleTail is how much of each microVM's console a failed test logs.
const consoleTail = 16 << 10

// showConsoles logs, if the test failed on the microvm provider, the end
// of each VM's console: the guest's init, sandboxd and relay logs, which
// the test cannot see otherwise.
func (f *fleet) showConsoles() {
	if !f.t.Failed() || f.provider != "microvm" {
		return
	}
	f.consoles.Do(func() {
		paths, _ := filepath.Glob(filepath.Join(f.state, "owner", "provider", "sandboxes", "*", "console.log"))
		for _, p := range paths {
			b, err := os.ReadFile(p)
			if err != nil {
				f.t.Logf("console %s: %v", p, err)
				continue
			}
			f.t.Logf("--- console of %s (its last %d bytes):\n%s", filepath.Base(filepath.Dir(p)), min(len(b), consoleTail), b[max(len(b)-consoleTail, 0):])
		}
	})
}

// showLaunch logs, for a test about to fail, the output of the first
// launch of rollout id (attempt 0) as its sandbox's daemon has it: the
// launch is stopped, and its receipt carries the end of the output (the
// harness's own log, which otherwise stays in the sandbox).
func (f *fleet) showLaunch(ctx context.Context, id string) {
	sb := "sb-" + strings.ReplaceAll(id, ".", "_")
	dc, err := sandboxclient.New(f.env.Conn, f.run, sb)
	if err != nil {
		f.t.Logf("launch of %s: %v", id, err)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	launch := id + ".l1"
	if _, err := dc.Stop(ctx, launch, true); err != nil {
		f.t.Logf("stop launch %s in %s: %v", launch, sb, err)
	}
	rc, err := dc.WaitReceipt(ctx, launch, 30*time.Second)
	if err != nil {
		f.t.Logf("receipt of launch %s in %s: %v", launch, sb, err)
		return
	}
	f.t.Logf("--- launch %s in %s, stopped: %s; the end of its output:\n%s", launch, sb, rc.Outcome, rc.OutputTail)
}

func (f *fleet) startAgent(name string, args ...string) {
	f.start("agent-"+name, events.Member("agent."+name), append(append([]string{"agent", "--run", f.run, "--name", name, "--owner", "o1",
		"--model-url", f.modelURL}, f.agentArgs...), args...)...)
}

// kill9 kills the named processes with SIGKILL and waits for them: a
// crash. What they started (an owner's sandboxes) lives on.
func (f *fleet) kill9(names ...string) {
	f.t.Helper()
	for _, n := range names {
		f.mu.Lock()
		p := f.procs[n]
		f.mu.Unlock()
		if p == nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := p.Kill(ctx)
		cancel()
		if err != nil {
			f.t.Fatal(err)
		}
	}
}

// reapLeftovers stops sandboxes an owner left (after a test failure) so
// that nothing outlives the test; it fails the test if it had to.
func (f *fleet) reapLeftovers() {
	dirs, _ := filepath.Glob(filepath.Join(f.state, "owner*"))
	for _, dir := range dirs {
		if s, err := f.reap(dir); err != nil {
			f.t.Errorf("reap leftover sandboxes: %v", err)
		} else if s != "" && !f.t.Failed() {
			f.t.Errorf("sandboxes left behind: %s", s)
		}
	}
}

// reap stops the sandboxes in an owner's state directory, as a node's
// death takes its sandboxes, and says which it stopped.
func (f *fleet) reap(dir string) (string, error) {
	cmd := exec.Command(f.bins.stillpoint, "owner", "--reap", "--provider", f.provider, "--state-dir", dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%w\n%s", err, out)
	}
	return strings.TrimSpace(string(out)), nil
}

// client returns the client of agent name.
func (f *fleet) client(name string) *agentapi.Client {
	c, err := agentapi.NewClient(f.env.Conn, f.run, name)
	if err != nil {
		f.t.Fatal(err)
	}
	return c
}

// agentOf routes a rollout to an agent.
func (f *fleet) agentOf(i int) string { return f.agents[i%len(f.agents)] }

type outcome struct {
	res agentapi.Result
	err error
}

// dispatch sends task i's rollout at attempt to its agent and returns a
// channel for the outcome.
func (f *fleet) dispatch(ctx context.Context, i, attempt int) <-chan outcome {
	ch := make(chan outcome, 1)
	c := f.client(f.agentOf(i))
	go func() {
		res, err := c.Rollout(ctx, agentapi.Request{RolloutID: f.tasks[i].RolloutID, Attempt: attempt, Task: f.tasks[i].Task})
		ch <- outcome{res, err}
	}()
	return ch
}

func (f *fleet) checkpoint(ctx context.Context, id string) *bridgeapi.CheckpointResult {
	f.t.Helper()
	res, err := f.br.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: id})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		f.t.Fatalf("checkpoint %s: %+v %v", id, res, err)
	}
	return res
}

func isParkedOrStopping(err error) bool {
	var se *agentapi.ServiceError
	return errors.As(err, &se) && (se.Code == "parked" || se.Code == "stopping")
}

// checkTrajectory checks res's trajectory as invariant 8 does: stored as
// the result names it, its lineage clean, its last chain, call for call
// and token for token, what the fleet's model server answered for the
// task (so a call a crash lost is not in it, and its re-issue is, once),
// with no token break.
func (f *fleet) checkTrajectory(res agentapi.Result) {
	f.t.Helper()
	calls, breaks, err := invariant.Trajectory(f.t.Context(), f.env.Bus, res.Trajectory, append([]*modelserver.Server{f.ms}, f.later...)...)
	switch {
	case err != nil:
		f.t.Errorf("%s: its trajectory: %v (no_trajectory %q)", res.Episode, err, res.NoTrajectory)
	case breaks != 0 || calls == 0:
		f.t.Errorf("%s: its trajectory has %d calls, %d token breaks", res.Episode, calls, breaks)
	}
}
