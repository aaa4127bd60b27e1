package e2e

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/controller-bridge/collect/tasks"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/participants/opencode"
	"github.com/stillpoint/stillpoint/participants/opencode/driver"
)

// The turns of a repository task's script (tasks.Repos).
const (
	repoTurnLook = iota
	repoTurnTest1
	repoTurnFix
	repoTurnTest2
)

// TestOpenCodeRepoTasksThroughTwoCheckpointsAndACrash: the repository set
// run by the real OpenCode, 8 rollouts at once on two agents (the tenth
// and the ninth wait for a slot): OpenCode reads the code with its read
// tool, runs the tests with bash, fixes the code with edit or write and
// runs the tests again. The collector takes a checkpoint while every
// running rollout is in its first, slow, test run and another once they
// have gone on; then kill -9 of both agents and the owner. The collector
// restores the second checkpoint into the restarted fleet, and every
// rollout ends with exactly one result whose reward its own tests gave
// (1 after the fix, 0 for the control task), no model call repeated and
// no user turn injected. A rollout that fails leaves its OpenCode session
// folders, with their export, in the test's artifacts (sessionKeeper), and
// a line on their last messages in the log. It runs 8 OpenCode processes
// at once, then as many again.
func TestOpenCodeRepoTasksThroughTwoCheckpointsAndACrash(t *testing.T) {
	tier.Heavy(t)
	parallel(t, 1.25, 3*time.Minute)
	if _, err := opencode.Binary(); err != nil {
		t.Fatal(err)
	}
	if _, err := opencode.Ripgrep(); err != nil {
		t.Fatal(err)
	}
	const inFlight = 8
	b := buildBins(t)
	f := startFleet(t, fleetOptions{agents: 2, concurrency: inFlight,
		repos:     &tasks.RepoOptions{ToolSeconds: 8, Harness: tasks.HarnessOpenCode},
		ownerArgs: []string{"--opencode", b.driver},
		agentArgs: []string{"--adapter", "opencode", "--launch-timeout", "10m"}})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	// A rollout that fails keeps its OpenCode sessions (registered after
	// the fleet, so it runs before the fleet's processes stop).
	stop := keepSessions(t, f)
	var res map[string]collect.Result
	t.Cleanup(func() {
		k := stop()
		if !t.Failed() {
			return
		}
		for _, tk := range f.tasks {
			if r, ok := res[tk.RolloutID]; !ok || !r.OK {
				k.save(t, tk.RolloutID)
			}
		}
	})
	c := f.collector(t)
	c.start("--concurrency", "8")

	// reached counts the rollouts whose call at turn was answered, and
	// those that have started at all.
	reached := func(turn int) (n, started int) {
		for _, tk := range f.tasks {
			if f.answered(tk.RolloutID, repoTurnLook) {
				started++
			}
			if f.answered(tk.RolloutID, turn) {
				n++
			}
		}
		return n, started
	}
	poll.Wait(t, 4*time.Minute, "8 rollouts in their first test run", func() bool {
		n, _ := reached(repoTurnTest1)
		return n >= inFlight
	})
	c.signal(syscall.SIGUSR1)
	poll.Wait(t, 2*time.Minute, "the first committed checkpoint", func() bool { return f.latest(ctx) != "" })
	first := f.latest(ctx)
	poll.Wait(t, 4*time.Minute, "rollouts on past their fix", func() bool {
		n, _ := reached(repoTurnTest2)
		return n >= inFlight/2
	})
	began := time.Now()
	c.signal(syscall.SIGUSR1)
	poll.Wait(t, 2*time.Minute, "the second committed checkpoint", func() bool {
		l := f.latest(ctx)
		return l != "" && l != first
	})
	n, started := reached(repoTurnTest2)
	t.Logf("checkpoints %s and %s; at the crash %d of %d rollouts had started, %d were past their fix", first, f.latest(ctx), started, len(f.tasks), n)
	f.kill9("agent-a1", "agent-a2", "owner")
	f.startOwner()
	for _, a := range f.agents {
		f.startAgent(a, "--concurrency", "8")
	}
	if code := c.wait(8 * time.Minute); code != 0 {
		t.Fatalf("collect exited %d", code)
	}
	res = c.readResults()
	restored, continued := 0, 0
	for _, tk := range f.tasks {
		r, ok := res[tk.RolloutID]
		if !ok || r.Result == nil {
			continue // readResults said so
		}
		checkRepoVerdict(t, tk.RolloutID, *r.Result)
		f.checkOpenCodeLedger(tk.RolloutID, "")
		if r.Result.Restored {
			restored++
			if l := r.Result.Launches; len(l) > 0 && l[len(l)-1].Continued {
				continued++
			}
		}
		t.Logf("%-16s attempt %d restored %-5v reward %v", tk.RolloutID, r.Attempt, r.Result.Restored, verdict(t, *r.Result).Reward)
	}
	if restored == 0 || continued == 0 {
		t.Errorf("%d rollouts continued from the restored checkpoint, %d of them on their saved OpenCode session: want some of each", restored, continued)
	}
	t.Logf("%d rollouts restored, %d of them continued their saved OpenCode session", restored, continued)
	f.checkLedger(began)
}

// sessionKeeper keeps the OpenCode session folders of a fleet's sandboxes
// as each was when its sandbox went (the owner removes a sandbox's files
// once its rollout ends, failed or not): hard links to the store files,
// made while the sandbox lives and made again when a file is replaced
// (SQLite removes the log when its last connection closes). It reaches
// them in the overlay provider's upper directories, never through a
// sandbox's mount, which a held file would keep busy.
type sessionKeeper struct {
	sandboxes string            // the provider's sandboxes: <id>/upper/<data root>/<rollout>/<n>
	dir       string            // the links: <rollout>/<sandbox>/<n>/<file>
	inodes    map[string]uint64 // each link's inode
	failed    error             // the first link or copy that failed
}

// keptFiles are the files of a session folder the keeper keeps: the store,
// the session's id, and the plugin stub, without which OpenCode would run
// npm when it starts on the copy to export it.
var keptFiles = append(slices.Clone(driver.StoreFiles), driver.SessionFile,
	filepath.Join(driver.Dirs.Config, "opencode", "package.json"), filepath.Join(driver.Dirs.Config, "opencode", "package-lock.json"))

// keepSessions starts keeping the fleet's session folders, polling, until
// stop, which returns the keeper.
func keepSessions(t *testing.T, f *fleet) (stop func() *sessionKeeper) {
	k := &sessionKeeper{sandboxes: filepath.Join(f.state, "owner", "provider", "sandboxes"), dir: t.TempDir(), inodes: map[string]uint64{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			k.link()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return func() *sessionKeeper {
		cancel()
		<-done
		return k
	}
}

// link links every store file of every session folder it has not linked
// yet (a new inode is a new file).
func (k *sessionKeeper) link() {
	folders, _ := filepath.Glob(filepath.Join(k.sandboxes, "*", "upper", strings.TrimPrefix(opencode.DefaultDataRoot, "/"), "*", "*"))
	for _, folder := range folders {
		rel, err := filepath.Rel(k.sandboxes, folder)
		if err != nil {
			continue
		}
		parts := strings.Split(rel, string(filepath.Separator))
		sandbox, rollout, n := parts[0], parts[len(parts)-2], parts[len(parts)-1]
		for _, name := range keptFiles {
			src, dst := filepath.Join(folder, name), filepath.Join(k.dir, rollout, sandbox, n, name)
			var st syscall.Stat_t
			if syscall.Stat(src, &st) != nil || k.inodes[dst] == st.Ino {
				continue
			}
			_ = os.Remove(dst)
			err := os.MkdirAll(filepath.Dir(dst), 0o755)
			if err == nil {
				if err = os.Link(src, dst); err != nil {
					err = copyFile(src, dst)
				}
			}
			if err != nil {
				k.failed = cmp.Or(k.failed, err)
				continue
			}
			k.inodes[dst] = st.Ino
		}
	}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	return errors.Join(err, out.Close())
}

// save copies rollout's kept session folders into the test's artifacts
// (go test -artifacts -outputdir DIR keeps them), with `opencode export`
// of each one's session, and logs where they are and the last messages.
func (k *sessionKeeper) save(t *testing.T, rollout string) {
	t.Helper()
	folders, _ := filepath.Glob(filepath.Join(k.dir, rollout, "*", "*"))
	if len(folders) == 0 {
		t.Logf("%s: no OpenCode session folder was seen in its sandboxes (%v)", rollout, k.failed)
		return
	}
	oc, err := opencode.Binary()
	if err != nil {
		t.Logf("%s: %v", rollout, err)
	}
	for _, folder := range folders {
		rel, _ := filepath.Rel(k.dir, folder)
		home := filepath.Join(t.ArtifactDir(), "opencode", rel)
		for _, name := range keptFiles {
			if _, err := os.Stat(filepath.Join(folder, name)); err != nil {
				continue
			}
			if err := os.MkdirAll(filepath.Dir(filepath.Join(home, name)), 0o755); err != nil {
				t.Logf("%s: %v", rollout, err)
				return
			}
			if err := copyFile(filepath.Join(folder, name), filepath.Join(home, name)); err != nil {
				t.Logf("%s: %v", rollout, err)
			}
		}
		if oc == "" {
			continue
		}
		if err := os.MkdirAll(filepath.Join(home, driver.Dirs.Config, "opencode", "node_modules"), 0o755); err != nil {
			t.Logf("%s: %v", rollout, err)
		}
		e, err := exportSession(oc, home, rollout)
		if err != nil {
			t.Logf("%s: OpenCode session folder %s (sandbox %s) kept in %s; it does not export: %v", rollout, filepath.Base(folder), filepath.Base(filepath.Dir(folder)), home, err)
			continue
		}
		t.Logf("%s: OpenCode session %s, folder %s of sandbox %s, kept in %s with its export (export.json); %d messages, the last: %s",
			rollout, e.Info.ID, filepath.Base(folder), filepath.Base(filepath.Dir(folder)), home, len(e.Messages), lastMessages(e.Messages, 4))
	}
}

// exportSession exports the session of the session folder home (the one
// run recorded, else the newest titled rollout) into home/export.json.
func exportSession(oc, home, rollout string) (driver.Export, error) {
	var e driver.Export
	run := func(args ...string) ([]byte, error) {
		cmd := exec.Command(oc, args...)
		cmd.Dir, cmd.Env = home, driver.Environ(home, home, os.Getenv("PATH"), 0)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("opencode %s: %v: %s", args[0], err, stderr.String())
		}
		return out, nil
	}
	var saved struct {
		ID string `json:"id"`
	}
	if b, err := os.ReadFile(filepath.Join(home, driver.SessionFile)); err == nil {
		_ = json.Unmarshal(b, &saved)
	}
	if saved.ID == "" {
		out, err := run("session", "list", "--format", "json")
		if err != nil {
			return e, err
		}
		var list []driver.SessionInfo
		_ = json.Unmarshal(out, &list)
		var newest int64
		for _, s := range list {
			if s.Title == rollout && (saved.ID == "" || s.Updated > newest) {
				saved.ID, newest = s.ID, s.Updated
			}
		}
		if saved.ID == "" {
			return e, fmt.Errorf("no session titled %s in the store", rollout)
		}
	}
	out, err := run("export", saved.ID)
	if err != nil {
		return e, err
	}
	if err := os.WriteFile(filepath.Join(home, "export.json"), out, 0o644); err != nil {
		return e, err
	}
	return e, json.Unmarshal(out, &e)
}

// lastMessages describes the last n messages: each one's role, finish,
// whether it completed, its error, and its parts.
func lastMessages(msgs []driver.Message, n int) string {
	var out []string
	for i := max(0, len(msgs)-n); i < len(msgs); i++ {
		m := msgs[i]
		s := fmt.Sprintf("[%d] %s", i, m.Info.Role)
		if m.Info.Finish != "" {
			s += " finish " + m.Info.Finish
		}
		if m.Info.Time.Completed != 0 {
			s += " completed"
		}
		if m.Info.Error != nil {
			s += " error " + m.Info.Error.String()
		}
		for _, p := range m.Parts {
			switch p.Type {
			case "text":
				s += fmt.Sprintf(" text(%d B)", len(p.Text))
			case "tool":
				st := "?"
				if p.State != nil {
					st = p.State.Status
				}
				s += " " + p.Tool + ":" + st
			case "step-finish":
				s += " step-finish(" + p.Reason + ")"
			}
		}
		out = append(out, s)
	}
	return strings.Join(out, "; ")
}
