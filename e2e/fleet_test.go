package e2e

import (
	"bytes"
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
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/e2e/tasks"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// bins are the binaries the end-to-end tests run as processes, built once
// per test binary: stillpoint (agent, owner), and the static sandboxd and
// scripted harness that go into sandboxes.
type bins struct{ stillpoint, sandboxd, harness string }

var (
	binsOnce sync.Once
	binsDir  string
	binsVal  bins
	binsErr  error
)

func buildBins(t testing.TB) bins {
	t.Helper()
	binsOnce.Do(func() {
		binsDir, binsErr = os.MkdirTemp("", "stillpoint-e2e-bin-")
		if binsErr != nil {
			return
		}
		binsVal = bins{filepath.Join(binsDir, "stillpoint"), filepath.Join(binsDir, "sandboxd"), filepath.Join(binsDir, "scripted-harness")}
		cmd := exec.Command("go", "build", "-o", binsDir+"/", "../cmd/stillpoint", "../cmd/sandboxd", "../cmd/scripted-harness")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			binsErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binsErr != nil {
		t.Fatal(binsErr)
	}
	return binsVal
}

// proc is a participant running as its own process.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *bytes.Buffer
	done chan struct{}
	err  error
}

// fleet is one run's world: an embedded server, the scripted model server,
// the bridge in this process, and an owner and agents as processes.
type fleet struct {
	t      testing.TB
	run    string
	env    *jstest.Env
	bins   bins
	ms     *modelserver.Server
	msURL  string
	br     *bridge.Bridge
	state  string
	tasks  []collect.Task
	mu     sync.Mutex
	procs  map[string]*proc
	logs   map[string]*jstest.Buffer
	agents []string
}

type fleetOptions struct {
	n           int
	agents      int
	concurrency int
	noPause     bool
	toolSeconds float64
	steps       int
}

func startFleet(t testing.TB, o fleetOptions) *fleet {
	t.Helper()
	b := buildBins(t)
	env := jstest.Start(t)
	ts, script := tasks.Set(tasks.Options{N: o.n, ToolSeconds: o.toolSeconds, Steps: o.steps})
	ms := modelserver.New(script)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: ms}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	f := &fleet{t: t, run: "e2e", env: env, bins: b, ms: ms, msURL: "http://" + ln.Addr().String(), state: t.TempDir(),
		tasks: ts, procs: map[string]*proc{}, logs: map[string]*jstest.Buffer{}}
	t.Cleanup(f.stopAll)
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
	if e, err := f.env.Bus.Members.Get(f.t.Context(), events.MemberKey(f.run, member)); err == nil {
		var info events.MemberInfo
		if json.Unmarshal(e.Value(), &info) == nil {
			prev[member] = info.Instance
		}
	}
	f.mu.Lock()
	buf, ok := f.logs[name]
	if !ok {
		buf = &jstest.Buffer{}
		f.logs[name] = buf
	}
	f.mu.Unlock()
	fmt.Fprintf(buf, "=== start %s\n", time.Now().Format(time.TimeOnly))
	cmd := exec.Command(f.bins.stillpoint, append([]string{"--nats-url", f.env.URL, "--log-format", "json", "--log-level", "info"}, args...)...)
	cmd.Stdout, cmd.Stderr = buf, buf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	f.mu.Lock()
	f.procs[name] = p
	f.mu.Unlock()
	// A fresh process: wait for its own heartbeat, not the one a killed
	// process left.
	waitFor(f.t, "member "+string(member)+" to register", func() bool {
		e, err := f.env.Bus.Members.Get(f.t.Context(), events.MemberKey(f.run, member))
		if err != nil {
			return false
		}
		var info events.MemberInfo
		return json.Unmarshal(e.Value(), &info) == nil && info.Instance != "" && info.Instance != prev[member]
	})
}

func (f *fleet) startOwner() {
	f.start("owner", "owner.o1", "owner", "--run", f.run, "--name", "o1", "--provider", "overlay",
		"--state-dir", filepath.Join(f.state, "owner"), "--sandboxd", f.bins.sandboxd, "--harness", f.bins.harness)
}

func (f *fleet) startAgent(name string, args ...string) {
	f.start("agent-"+name, events.Member("agent."+name), append([]string{"agent", "--run", f.run, "--name", name, "--owner", "o1",
		"--model-url", f.msURL}, args...)...)
}

// kill9 kills the named processes with SIGKILL and waits for them.
func (f *fleet) kill9(names ...string) {
	for _, n := range names {
		f.mu.Lock()
		p := f.procs[n]
		f.mu.Unlock()
		if p == nil {
			continue
		}
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (f *fleet) stopAll() {
	f.mu.Lock()
	ps := make([]*proc, 0, len(f.procs))
	for _, p := range f.procs {
		ps = append(ps, p)
	}
	f.mu.Unlock()
	for _, p := range ps {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range ps {
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	if f.t.Failed() {
		for name, b := range f.logs {
			s := b.String()
			if len(s) > 30000 {
				s = "...\n" + s[len(s)-30000:]
			}
			f.t.Logf("--- %s log:\n%s", name, s)
		}
	}
	// The owner's sandboxes are gone once it stopped; a crashed owner's are
	// reaped by the restarted one. Anything left is a leak.
	f.reapLeftovers()
}

// reapLeftovers stops sandboxes an owner left (after a test failure) so
// that nothing outlives the test; it fails the test if it had to.
func (f *fleet) reapLeftovers() {
	cmd := exec.Command(f.bins.stillpoint, "owner", "--reap", "--provider", "overlay", "--state-dir", filepath.Join(f.state, "owner"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		f.t.Errorf("reap leftover sandboxes: %v\n%s", err, out)
	} else if s := strings.TrimSpace(string(out)); s != "" && !f.t.Failed() {
		f.t.Errorf("sandboxes left behind: %s", s)
	}
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

// waitLedger waits until the model server has seen n requests.
func (f *fleet) waitLedger(n int) {
	f.t.Helper()
	waitFor(f.t, fmt.Sprintf("%d model calls", n), func() bool { return len(f.ms.Ledger()) >= n })
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
