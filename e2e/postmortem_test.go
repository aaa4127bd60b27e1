package e2e

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// natsCLIVersion is the natscli release docs/POSTMORTEM.md is written for.
const natsCLIVersion = "0.5.0"

// TestPostmortemCommands runs a demo with its store kept, serves the store
// again as the demo says, and runs every command of docs/POSTMORTEM.md
// (its ```sh blocks, RUN, CKPT and NATS_URL set) and every command the
// demo printed, with natscli v0.5.0, stdout a pipe. Each must exit 0 and
// show the run: a checkpoint id, a member or a key or subject of the run;
// together they must name every checkpoint committed and every member of
// it. A command marked "(live run)" shows what a run still keeps, which
// after the demo's final release may be nothing: it must only not fail as
// a wrong call. A command added to the doc later is run as well.
func TestPostmortemCommands(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.5, 15*time.Second)
	natsCLI := requireNatsCLI(t)
	if _, err := exec.LookPath("jq"); err != nil {
		t.Fatal("docs/POSTMORTEM.md pipes into jq, which is not on PATH: apt-get install jq")
	}
	b := buildBins(t)
	dir := t.TempDir()
	printed := runDemoKept(t, b, nil, "--dir", dir)

	// The demo's server line serves its store again: run it as printed,
	// on a free port instead of 4333.
	serve := printed[0]
	if !strings.HasPrefix(serve, "go run ./cmd/stillpoint server ") || !strings.HasSuffix(serve, " &") {
		t.Fatalf("the demo's first command %q is not the server that serves its store", serve)
	}
	args := strings.Fields(strings.TrimSuffix(strings.TrimPrefix(serve, "go run ./cmd/stillpoint "), " &"))
	for i, a := range args {
		if a == "127.0.0.1:4333" {
			args[i] = "127.0.0.1:0"
		}
		if i > 0 && args[i-1] == "--dir" {
			if _, err := os.Stat(filepath.Join(a, "jetstream")); err != nil {
				t.Fatalf("the store the demo printed, %s, does not hold a JetStream store: %v", a, err)
			}
		}
	}
	url := startServer(t, b, args...)
	checkCommands(t, b, natsCLI, url, printed[1:], true)
}

// TestPostmortemCommandsOnAServerOfItsOwn runs the demo with --nats-url
// against `stillpoint server`: the demo's printed commands name that
// server (no store path, no server to start), and work as printed.
func TestPostmortemCommandsOnAServerOfItsOwn(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.5, 10*time.Second)
	natsCLI := requireNatsCLI(t)
	b := buildBins(t)
	url := startServer(t, b, "server", "--dir", filepath.Join(t.TempDir(), "nats"), "--listen", "127.0.0.1:0")
	printed := runDemoKept(t, b, []string{"--nats-url", url}, "--dir", t.TempDir())
	for _, c := range printed {
		if strings.Contains(c, " server ") || strings.Contains(c, readBackURL) || !strings.Contains(c, url) {
			t.Errorf("with --nats-url %s the demo printed %q", url, c)
		}
	}
	checkCommands(t, b, natsCLI, url, printed, false)
}

// runDemoKept runs `stillpoint demo --rollouts 4` (global flags first),
// checks its last line and returns the commands it printed to read the
// run back.
func runDemoKept(t *testing.T, b bins, global []string, args ...string) []string {
	t.Helper()
	demo := child.StartForTest(t, child.Spec{Name: "demo", Path: b.stillpoint, Dir: "..",
		Args: append(append(global, "demo", "--rollouts", "4"), args...)})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	exit, err := demo.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(demo.Output()), "\n")
	if !exit.Success() || !demoLine.MatchString(lines[len(lines)-1]) {
		t.Fatalf("demo: %s, last line %q (its output is below)", exit, lines[len(lines)-1])
	}
	return printedCommands(t, lines)
}

// startServer runs `stillpoint` with args (a server on a free port) until
// the test ends and returns its URL.
func startServer(t *testing.T, b bins, args ...string) string {
	t.Helper()
	srv := child.StartForTest(t, child.Spec{Name: "server", Path: b.stillpoint, Args: args})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	m, err := srv.WaitOutput(ctx, regexp.MustCompile(`NATS ready at (\S+)`))
	if err != nil {
		t.Fatal(err)
	}
	return m[1]
}

// checkCommands runs the demo's printed commands (but the server line)
// and, with doc, every command of docs/POSTMORTEM.md, against the demo's
// run on the server at url.
func checkCommands(t *testing.T, b bins, natsCLI, url string, printed []string, doc bool) {
	t.Helper()
	const run = "demo"
	committed, members := readRun(t, url, run)
	if len(committed) != 3 {
		t.Fatalf("the stream holds %d committed checkpoints of run %s, want the demo's 3: %v", len(committed), run, committed)
	}
	// What names the run: its subjects and keys, its checkpoints and
	// members, and its objects ("<run>/...": the trajectories').
	shows := append(append([]string{"sp." + run + ".", run + ".", run + "/"}, committed...), members...)

	// stillpoint on PATH, for the doc's own stillpoint commands.
	bin := t.TempDir()
	if err := os.Symlink(b.stillpoint, filepath.Join(bin, "stillpoint")); err != nil {
		t.Fatal(err)
	}
	// CKPT is the demo's first checkpoint: the demo asks it once every
	// rollout in flight runs its slow tool, so its prepare addressed
	// sandbox daemons and has a record of their acks (the later ones may
	// find every rollout finished, or the forks' daemons not yet up).
	env := []string{"PATH=" + filepath.Dir(natsCLI) + ":" + bin + ":" + os.Getenv("PATH"), "NATS_URL=" + url,
		"RUN=" + run, "CKPT=" + committed[0]}

	var docCmds []string
	if doc {
		md, err := os.ReadFile("../docs/POSTMORTEM.md")
		if err != nil {
			t.Fatal(err)
		}
		for _, block := range shBlocks(string(md)) {
			docCmds = append(docCmds, shellCommands(block)...)
		}
		if len(docCmds) < 10 {
			t.Fatalf("docs/POSTMORTEM.md has %d commands in its sh blocks; has its layout changed?", len(docCmds))
		}
	}
	var demoCmds []string
	for _, c := range printed {
		c = strings.ReplaceAll(c, "go run ./cmd/stillpoint ", "stillpoint ")
		demoCmds = append(demoCmds, strings.ReplaceAll(c, readBackURL, url))
	}

	for _, set := range []struct {
		what string
		cmds []string
	}{{"docs/POSTMORTEM.md", docCmds}, {"the demo", demoCmds}} {
		if len(set.cmds) == 0 {
			continue
		}
		var all strings.Builder
		for _, c := range set.cmds {
			out := runCommand(t, env, c, shows)
			all.WriteString(out)
		}
		for _, want := range append(append([]string{"checkpoint.committed"}, committed...), members...) {
			if want == "checkpoint.committed" && set.what == "the demo" {
				continue // the demo's commands print data, not headers or types
			}
			if !strings.Contains(all.String(), want) {
				t.Errorf("no command of %s shows %q", set.what, want)
			}
		}
	}
}

// readBackURL is the server address the demo prints its commands with.
const readBackURL = "nats://127.0.0.1:4333"

// usageError is what natscli and stillpoint print for a wrong call or a
// command that cannot run piped.
var usageError = regexp.MustCompile(`(?i)required argument|unknown (long )?flag|unexpected argument|usage: |expected command|requires a valid terminal|unknown command`)

// runCommand runs one shell command, stdout a pipe, and checks it as
// TestPostmortemCommands says; it returns its stdout.
func runCommand(t *testing.T, env []string, c string, shows []string) string {
	t.Helper()
	var stderr bytes.Buffer
	p := child.StartForTest(t, child.Spec{Name: "sh", Path: "/bin/bash", Args: []string{"-o", "pipefail", "-c", c}, Env: env,
		Stderr: &stderr, Grace: time.Second})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	exit, err := p.Wait(ctx)
	if err != nil {
		t.Errorf("%s\n  did not finish: %v", c, err)
		return ""
	}
	out := p.Output()
	t.Logf("%s\n  %s, %d lines", c, exit, strings.Count(out, "\n"))
	if usageError.MatchString(out) || usageError.MatchString(stderr.String()) {
		t.Errorf("%s\n  is a wrong call:\n%s%s", c, stderr.String(), out)
		return out
	}
	switch {
	case strings.Contains(c, "(live run)"):
		return out
	case !exit.Success():
		t.Errorf("%s\n  %s:\n%s%s", c, exit, stderr.String(), out)
	case strings.Contains(c, "(prints nothing)"):
	case !containsAny(out, shows):
		t.Errorf("%s\n  printed nothing of the run (a checkpoint id, member, key or subject):\n%s", c, out)
	}
	return out
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// requireNatsCLI returns natscli's path, failing the test unless it is
// there and says natsCLIVersion.
func requireNatsCLI(t *testing.T) string {
	t.Helper()
	install := "go install github.com/nats-io/natscli/nats@v" + natsCLIVersion
	path, err := exec.LookPath("nats")
	if err != nil {
		t.Fatalf("natscli is not on PATH: %s", install)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").CombinedOutput()
	if err != nil || strings.TrimPrefix(strings.TrimSpace(string(out)), "v") != natsCLIVersion {
		t.Fatalf("%s --version says %q (%v), want %s: %s", path, strings.TrimSpace(string(out)), err, natsCLIVersion, install)
	}
	return path
}

// printedCommands returns the commands the demo printed to read the run
// back: the indented lines after "to read what happened".
func printedCommands(t *testing.T, lines []string) []string {
	t.Helper()
	var out []string
	in := false
	for _, l := range lines {
		switch {
		case strings.HasPrefix(l, "to read what happened"):
			in = true
		case in && strings.HasPrefix(l, "  "):
			out = append(out, strings.TrimSpace(l))
		case in:
			in = false
		}
	}
	if len(out) < 2 {
		t.Fatalf("the demo printed %d commands to read the run back: %q", len(out), out)
	}
	return out
}

// shBlocks returns the bodies of the ```sh blocks of a markdown text.
func shBlocks(md string) []string {
	var blocks []string
	for _, part := range strings.Split(md, "```sh\n")[1:] {
		body, _, ok := strings.Cut(part, "```")
		if ok {
			blocks = append(blocks, body)
		}
	}
	return blocks
}

// shellCommands splits a block into its commands: one a line, a line
// ending in a backslash going on on the next.
func shellCommands(block string) []string {
	var cmds []string
	cur := ""
	for _, l := range strings.Split(block, "\n") {
		if strings.TrimSpace(l) == "" {
			continue
		}
		if strings.HasSuffix(l, `\`) {
			cur += strings.TrimSuffix(l, `\`) + " "
			continue
		}
		cmds = append(cmds, cur+l)
		cur = ""
	}
	if cur != "" {
		cmds = append(cmds, cur)
	}
	return cmds
}

// readRun reads the run's committed checkpoint ids and the members they
// name from the stream, in order.
func readRun(t *testing.T, url, run string) (committed, members []string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: url, Name: "postmortem-test"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := natsjs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := js.OrderedConsumer(ctx, jetstream.StreamName, natsjs.OrderedConsumerConfig{
		FilterSubjects: []string{events.OutcomeSubject(run, events.TypeCheckpointCommitted)}})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for {
		msg, err := c.Next(natsjs.FetchMaxWait(2 * time.Second))
		if errors.Is(err, natsjs.ErrMsgIteratorClosed) || errors.Is(err, nats.ErrTimeout) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		_, d, err := events.Unmarshal(&nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()})
		if err != nil {
			t.Fatal(err)
		}
		o, ok := d.(events.CheckpointCommitted)
		if !ok {
			t.Fatalf("%s holds %T", msg.Subject(), d)
		}
		committed = append(committed, o.CheckpointID)
		for _, m := range o.Members {
			if !seen[string(m)] {
				seen[string(m)] = true
				members = append(members, string(m))
			}
		}
		if md, err := msg.Metadata(); err == nil && md.NumPending == 0 {
			break
		}
	}
	if len(members) == 0 {
		t.Fatalf("the committed outcomes of run %s name no member", run)
	}
	return committed, members
}

// TestPostmortemLiveRunCommands runs the commands of docs/POSTMORTEM.md
// marked "(live run)" against a run that still keeps its checkpoints (a
// bridge and a test fleet on an embedded server, two checkpoints taken):
// each must exit 0 and show the run, and together they must show both
// checkpoints (LATEST's history names each) and every member.
func TestPostmortemLiveRunCommands(t *testing.T) {
	tier.E2E(t)
	parallel(t, 0.75, 5*time.Second)
	natsCLI := requireNatsCLI(t)
	b := buildBins(t)
	const run = "live"
	env := jstest.Start(t)
	hs := membertest.StartMembers(t, env, run, 2, membertest.Options{Episodes: 2})
	br, err := bridge.New(bridge.Config{Run: run, Conn: env.Conn, JS: env.JS, Bus: env.Bus, PhaseTimeout: 30 * time.Second,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.WarnLevel)})
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, "bridge", br.Run)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	ids := []string{"c1", "c2"}
	for _, id := range ids {
		res, err := br.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: id})
		if err != nil || res.Status != bridgeapi.StatusCommitted {
			t.Fatalf("checkpoint %s: %+v %v", id, res, err)
		}
	}
	var members []string
	for _, h := range hs {
		members = append(members, string(h.Name))
	}

	bin := t.TempDir()
	if err := os.Symlink(b.stillpoint, filepath.Join(bin, "stillpoint")); err != nil {
		t.Fatal(err)
	}
	shell := []string{"PATH=" + filepath.Dir(natsCLI) + ":" + bin + ":" + os.Getenv("PATH"), "NATS_URL=" + env.URL,
		"RUN=" + run, "CKPT=" + ids[len(ids)-1]}
	md, err := os.ReadFile("../docs/POSTMORTEM.md")
	if err != nil {
		t.Fatal(err)
	}
	var live []string
	for _, block := range shBlocks(string(md)) {
		for _, c := range shellCommands(block) {
			if strings.Contains(c, "(live run)") {
				live = append(live, strings.Replace(c, "(live run)", "(on a live run)", 1))
			}
		}
	}
	if len(live) < 3 {
		t.Fatalf("docs/POSTMORTEM.md marks %d commands (live run); has its layout changed?", len(live))
	}
	var all strings.Builder
	for _, c := range live {
		all.WriteString(runCommand(t, shell, c, append(append([]string{run + "."}, ids...), members...)))
	}
	for _, want := range append(append([]string{`"checkpoint_id":"c1"`, `"checkpoint_id":"c2"`}, ids...), members...) {
		if !strings.Contains(all.String(), want) {
			t.Errorf("no live-run command shows %q", want)
		}
	}
}
