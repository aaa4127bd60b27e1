package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/client"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/freeport"
	"github.com/stillpoint/stillpoint/internal/metrics"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/participants/exec/example"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// Process returns the latest process named name.
func (d *Fleet) Process(name string) *child.Process {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.procs[name]
}

// waitMember waits for a new instance of member m, run by process proc,
// to register.
func (d *Fleet) waitMember(ctx context.Context, bus *jetstream.Bus, m events.Member, not string, proc string) error {
	p := d.Process(proc)
	wait := d.registerWait
	if wait <= 0 {
		wait = 30 * time.Second
	}
	wctx, cancel := context.WithTimeoutCause(ctx, wait,
		fmt.Errorf("demo: %s did not register; see %s", m, filepath.Join(d.dir, "logs", proc+".log")))
	defer cancel()
	return poll.Until(wctx, poll.Every(50*time.Millisecond), func() (bool, error) {
		if e, err := bus.Heartbeats(m.Kind()).Get(ctx, events.MemberKey(d.run, m)); err == nil {
			var info events.MemberInfo
			if json.Unmarshal(e.Value(), &info) == nil && info.Instance != "" && info.Instance != not {
				return true, nil
			}
		}
		select {
		case <-p.Exited():
			return false, fmt.Errorf("demo: %s exited; see %s", proc, filepath.Join(d.dir, "logs", proc+".log"))
		default:
			return false, nil
		}
	})
}

func (d *Fleet) instance(ctx context.Context, bus *jetstream.Bus, m events.Member) string {
	e, err := bus.Heartbeats(m.Kind()).Get(ctx, events.MemberKey(d.run, m))
	if err != nil {
		return ""
	}
	var info events.MemberInfo
	_ = json.Unmarshal(e.Value(), &info)
	return info.Instance
}

// StartBridge starts the bridge (again, on the address it had: the
// collector's client keeps its URL), with extra in its environment, and
// waits until it serves.
func (d *Fleet) StartBridge(ctx context.Context, extra ...string) (string, error) {
	addr := d.bridgeAddr
	if addr == "" {
		addrs, err := FreeAddrs(1)
		if err != nil {
			return "", err
		}
		addr = addrs[0]
		d.bridgeAddr = addr
	}
	if err := d.spawn("bridge", string(embedded.RoleBridge), append([]string{"STILLPOINT_BRIDGE_TOKEN=" + d.token}, extra...),
		"bridge", "--run", d.run, "--listen", addr); err != nil {
		return "", err
	}
	url := "http://" + addr
	c, err := client.New(url, d.token)
	if err != nil {
		return "", err
	}
	defer c.Close()
	p := d.Process("bridge")
	wctx, cancel := context.WithTimeoutCause(ctx, 30*time.Second,
		fmt.Errorf("demo: the bridge did not come up; see %s", filepath.Join(d.dir, "logs", "bridge.log")))
	defer cancel()
	err = poll.Until(wctx, poll.Every(50*time.Millisecond), func() (bool, error) {
		select {
		case <-p.Exited():
			return false, fmt.Errorf("demo: the bridge exited; see %s", filepath.Join(d.dir, "logs", "bridge.log"))
		default:
		}
		once, cancel := context.WithTimeout(wctx, time.Second)
		defer cancel()
		return c.Ready(once) == nil, nil
	})
	if err != nil {
		return "", err
	}
	return url, nil
}

// metricsAddr returns the metrics address of process name: a free
// loopback port the first time, the same one after.
func (d *Fleet) metricsAddr(name string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if a, ok := d.metricsAddrs[name]; ok {
		return a, nil
	}
	addrs, err := FreeAddrs(1)
	if err != nil {
		return "", err
	}
	a := addrs[0]
	if d.metricsAddrs == nil {
		d.metricsAddrs = map[string]string{}
	}
	d.metricsAddrs[name] = a
	return a, nil
}

// serveMetrics serves the collector's metrics in this process until the
// returned stop, and says where every process serves its own.
func (d *Fleet) serveMetrics(ctx context.Context, set *metrics.Set, ready metrics.Probe, agents []string) (stop func(), err error) {
	addr, err := d.metricsAddr("collector")
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = metrics.Serve(sctx, ln, metrics.Handler(set, ready)) }()
	targets := []string{"collector http://" + addr + metrics.PathMetrics, "bridge http://" + d.bridgeAddr + metrics.PathMetrics}
	for _, n := range d.FleetProcs(agents) {
		a, err := d.metricsAddr(n)
		if err != nil {
			cancel()
			<-done
			return nil, err
		}
		targets = append(targets, n+" http://"+a+metrics.PathMetrics)
	}
	d.Say("metrics: %s", strings.Join(targets, ", "))
	return func() { cancel(); <-done }, nil
}

// FleetProcs returns the process names of every node: the owners, then
// the agents.
func (d *Fleet) FleetProcs(agents []string) []string {
	var out []string
	for _, o := range d.owners() {
		out = append(out, OwnerProc(o))
	}
	for _, a := range agents {
		out = append(out, "agent-"+a)
	}
	return out
}

// The world runs one node per agent: node i is agent a<i> and sandbox
// owner o<i>, the owner that lends that agent its sandboxes, as a machine
// of a cluster would run them. A node fault takes both down at once.

// AgentNames returns the names of n agents: a1 to a<n>.
func AgentNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("a%d", i+1)
	}
	return out
}

// NodeOwner returns the owner of agent's node: o<i> for a<i>.
func NodeOwner(agent string) string { return "o" + strings.TrimPrefix(agent, "a") }

// owners returns the names of the world's owners, one a node.
func (d *Fleet) owners() []string {
	out := AgentNames(d.f.agents)
	for i, a := range out {
		out[i] = NodeOwner(a)
	}
	return out
}

// OwnerProc is the process name of owner name; its log is
// logs/owner-<name>.log.
func OwnerProc(name string) string { return "owner-" + name }

// ownerDir is the state directory of owner name.
func (d *Fleet) ownerDir(name string) string { return filepath.Join(d.dir, "owner-"+name) }

// StartNode starts agent's node: its owner, then the agent.
func (d *Fleet) StartNode(ctx context.Context, bus *jetstream.Bus, agent, modelURL string) error {
	if err := d.StartOwner(ctx, bus, NodeOwner(agent)); err != nil {
		return err
	}
	return d.StartAgent(ctx, bus, agent, modelURL)
}

// StartOwner starts owner name (again: on the same state directory and
// metrics address) and waits until a new instance of it registers.
func (d *Fleet) StartOwner(ctx context.Context, bus *jetstream.Bus, name string) error {
	m := events.Member("owner." + name)
	prev := d.instance(ctx, bus, m)
	args := []string{"owner", "--run", d.run, "--name", name, "--provider", d.f.provider, "--state-dir", d.ownerDir(name),
		"--sandboxd", d.sandboxd, "--harness", d.harness}
	kind := "command"
	if d.f.tasks == tasksSWE {
		// Each sandbox is made from its instance's image, unpacked once
		// into the owners' shared cache (--image-cache's default).
		kind = "swe"
	}
	switch d.f.harness {
	case harnessOpenCode:
		args = append(args, "--task-kind", kind, "--opencode", d.driver)
	case harnessClaude:
		args = append(args, "--task-kind", kind, "--claude", d.driver, "--model-api-translate")
	case harnessCodex:
		args = append(args, "--task-kind", kind, "--codex", d.driver, "--model-api-translate")
	case harnessExec:
		args = append(args, "--bind", d.execDir+":"+example.SandboxDir)
	}
	if d.f.provider == "microvm" {
		// Images and the warm template are kept for the next demo.
		args = append(args, "--sandbox-upstream", d.modelAddr, "--microvm-cache", filepath.Join(os.TempDir(), "stillpoint-microvm-cache"), "--microvm-prune-cache")
	}
	if d.auth != nil {
		args = append(args, "--sandbox-users")
	}
	proc := OwnerProc(name)
	maddr, err := d.metricsAddr(proc)
	if err != nil {
		return err
	}
	args = append(args, "--metrics-addr", maddr)
	if err := d.spawn(proc, string(m), nil, args...); err != nil {
		return err
	}
	return d.waitMember(ctx, bus, m, prev, proc)
}

// StartAgent starts agent name (again) with the model at modelURL, and
// waits until a new instance of it registers.
func (d *Fleet) StartAgent(ctx context.Context, bus *jetstream.Bus, name, modelURL string) error {
	m := events.Member("agent." + name)
	prev := d.instance(ctx, bus, m)
	args := []string{"agent", "--run", d.run, "--name", name, "--owner", NodeOwner(name), "--model-url", modelURL, "--concurrency", fmt.Sprint(d.f.rollouts)}
	switch {
	case d.realHarness():
		args = append(args, "--adapter", d.f.harness, "--launch-timeout", "10m")
	case d.f.harness == harnessExec:
		args = append(args, "--adapter", "exec", "--harness-spec", filepath.Join(d.execDir, example.SpecFile))
	}
	maddr, err := d.metricsAddr("agent-" + name)
	if err != nil {
		return err
	}
	args = append(args, "--metrics-addr", maddr)
	if err := d.spawn("agent-"+name, string(m), nil, args...); err != nil {
		return err
	}
	return d.waitMember(ctx, bus, m, prev, "agent-"+name)
}

// Kill9 kills the named processes with SIGKILL and waits for them: a
// crash, after which what they started (the owner's sandboxes) lives on.
func (d *Fleet) Kill9(ctx context.Context, names ...string) error {
	for _, n := range names {
		if p := d.Process(n); p != nil {
			if err := p.Kill(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// StopAll stops every process it started (SIGTERM, then SIGKILL after 20 s,
// all at once) and waits for them.
func (d *Fleet) StopAll() {
	d.mu.Lock()
	all := d.all
	d.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range all {
		wg.Go(func() { p.Stop() })
	}
	wg.Wait()
}

// Reap stops the sandboxes left in every owner's state directory and
// returns their ids (none, when every session ended).
func (d *Fleet) Reap(ctx context.Context) []string {
	var ids []string
	for _, o := range d.owners() {
		ids = append(ids, d.ReapOwner(ctx, o)...)
	}
	return ids
}

// ReapOwner stops the sandboxes left in owner name's state directory (the
// owner is not running) and returns their ids.
func (d *Fleet) ReapOwner(ctx context.Context, name string) []string {
	cmd := exec.CommandContext(ctx, d.self, "owner", "--reap", "--provider", d.f.provider, "--state-dir", d.ownerDir(name),
		"--log-level", "error")
	out, err := cmd.Output()
	if err != nil {
		return []string{"(reap of owner " + name + " failed: " + err.Error() + ")"}
	}
	var ids []string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if s := strings.TrimSpace(sc.Text()); s != "" && !strings.HasPrefix(s, "stillpoint:") {
			ids = append(ids, s)
		}
	}
	return ids
}

// ServeModel serves the scripted model of script on a free loopback port
// until stop, which waits for the server to end.
func ServeModel(script modelserver.Script) (ms *modelserver.Server, addr string, stop func(), err error) {
	return ServeModelOn(script, "127.0.0.1")
}

// ServeModelOn is ServeModel on a free port of host: an address that
// processes in other network namespaces reach.
func ServeModelOn(script modelserver.Script, host string) (ms *modelserver.Server, addr string, stop func(), err error) {
	ms = modelserver.New(script)
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, "", nil, err
	}
	srv := &http.Server{Handler: ms, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan struct{})
	go func() { defer close(served); _ = srv.Serve(ln) }()
	return ms, ln.Addr().String(), func() { _ = srv.Close(); <-served }, nil
}

// FreeAddrs returns n loopback addresses free now, held for this process
// (internal/freeport) until it exits: the bridge, or a
// node and the NATS server of the chaos injector, started again after a
// fault binds the same one.
func FreeAddrs(n int) ([]string, error) {
	ps, err := freeport.Reserve("127.0.0.1", n)
	if err != nil {
		return nil, err
	}
	out := make([]string, n)
	for i := range out {
		out[i] = ps.Addr("127.0.0.1", i)
	}
	return out, nil
}

// workAndProgram returns the run's work directory (WorkDir) and the
// stillpoint binary its components run as (env.Program, else this
// process's own).
func workAndProgram(env Env, dir, prefix string) (work, self string, err error) {
	if work, err = WorkDir(dir, prefix); err != nil {
		return "", "", err
	}
	if self = env.Program; self == "" {
		if self, err = os.Executable(); err != nil {
			return "", "", err
		}
	}
	return work, self, nil
}

// WorkDir returns dir, else a new directory named after prefix under the
// temp dir, absolute.
func WorkDir(dir, prefix string) (string, error) {
	work, err := dir, error(nil)
	if work == "" {
		if work, err = os.MkdirTemp("", prefix); err != nil {
			return "", err
		}
	}
	return filepath.Abs(work)
}

// OpenLogFile opens a log file (created with its directory); on error
// logs are discarded.
func OpenLogFile(p string) *os.File {
	_ = os.MkdirAll(filepath.Dir(p), 0o755)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		f, _ = os.Open(os.DevNull)
	}
	return f
}
