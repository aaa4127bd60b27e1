// Package tasks is the bundled task set of the end-to-end tests and the
// demo: small coding tasks for the scripted harness whose tool calls write
// files, run commands (one mid-tool long enough for a checkpoint to catch
// it) and start a process in a session of its own; the model script that
// drives them; and the owner's side of them (the sandbox spec with
// sandboxd and the harness in it, and the grade that checks the files).
package tasks

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"path/filepath"
	"strings"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/owner"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// HarnessPath is where the scripted harness is in a sandbox: in the bound
// binaries directory (owner.BinDir), or copied there.
const HarnessPath = owner.BinDir + "/scripted-harness"

// Workdir is the tasks' working directory in the sandbox.
const Workdir = "/work"

// Task is one rollout of the set: its id and its payload for the scripted
// adapter.
type Task struct {
	RolloutID string          `json:"rollout_id"`
	Task      json.RawMessage `json:"task"`
}

// Options shape the set.
type Options struct {
	// N is the number of tasks.
	N int
	// ToolSeconds is how long the middle tool call runs (the one a
	// checkpoint catches mid-tool); default 0.5.
	ToolSeconds float64
	// Steps is how many extra write-and-check steps each task takes
	// (default 2).
	Steps int
}

// ID returns the rollout id of task i.
func ID(i int) string { return fmt.Sprintf("task-%03d", i) }

func call(id, cmd string) modelserver.ToolCall {
	var tc modelserver.ToolCall
	tc.ID, tc.Type = id, "function"
	tc.Function.Name = "bash"
	b, _ := json.Marshal(map[string]string{"command": cmd})
	tc.Function.Arguments = string(b)
	return tc
}

// Set returns the tasks and the model script that solves them. Task i
// writes out/steps.txt one line per step, computes 6*7+i in a tool call
// that takes ToolSeconds, writes out/detached.txt from a process in a
// session of its own, and answers "done <id>".
func Set(o Options) ([]Task, modelserver.Script) {
	if o.ToolSeconds == 0 {
		o.ToolSeconds = 0.5
	}
	if o.Steps == 0 {
		o.Steps = 2
	}
	script := modelserver.Script{}
	tasks := make([]Task, o.N)
	for i := range o.N {
		id := ID(i)
		turns := []modelserver.Turn{{Content: "Setting up.", ToolCalls: []modelserver.ToolCall{call("c0", "mkdir -p out && echo start > out/steps.txt")}}}
		for s := 1; s <= o.Steps; s++ {
			turns = append(turns, modelserver.Turn{ToolCalls: []modelserver.ToolCall{
				call(fmt.Sprintf("c%d", s), fmt.Sprintf("echo step-%d >> out/steps.txt && wc -l < out/steps.txt", s))}})
		}
		turns = append(turns,
			modelserver.Turn{Content: "Computing.", ToolCalls: []modelserver.ToolCall{
				call("calc", fmt.Sprintf("sleep %g; echo $((6*7+%d)) > out/answer.txt; cat out/answer.txt", o.ToolSeconds, i))}},
			modelserver.Turn{ToolCalls: []modelserver.ToolCall{
				call("bg", "setsid -w sh -c 'echo detached-$$ > out/detached.txt' < /dev/null")}},
			modelserver.Turn{Content: "done " + id})
		script[id] = turns
		payload, _ := json.Marshal(map[string]string{"task": id, "prompt": fmt.Sprintf("Task %d: compute 6*7+%d into out/answer.txt.", i, i)})
		tasks[i] = Task{RolloutID: id, Task: payload}
	}
	return tasks, script
}

// SpecConfig says how the owner builds a task's sandbox.
type SpecConfig struct {
	// Sandboxd is the sandboxd config (binary, server, run, credentials).
	Sandboxd owner.SandboxdConfig
	// Harness is the host path of the static scripted-harness binary.
	Harness string
}

// bound tells whether the harness comes with the bound binaries directory.
func (c SpecConfig) bound() bool {
	return c.Sandboxd.BinDir != "" && filepath.Join(c.Sandboxd.BinDir, path.Base(HarnessPath)) == filepath.Clean(c.Harness)
}

// Spec returns the owner's SpecFunc: a sandbox per session, named after
// the session, with sandboxd as its first process and the harness copied
// in.
func Spec(c SpecConfig) owner.SpecFunc {
	return func(sessionID string, ep events.Episode, _ json.RawMessage) (provider.Spec, error) {
		id := "sb-" + strings.ReplaceAll(ep.String(), ".", "_")
		if len(id) > 64 {
			return provider.Spec{}, fmt.Errorf("session %s: sandbox id %q too long", sessionID, id)
		}
		s := provider.Spec{ID: id, Workdir: Workdir}
		if !c.bound() {
			s.CopyIn = []provider.CopyIn{{HostPath: c.Harness, SandboxPath: HarnessPath[1:], Mode: 0o755}}
		}
		return owner.SandboxdSpec(s, c.Sandboxd), nil
	}
}

// ForkSpec returns the owner's Config.ForkSpec: a restored fork starts
// sandboxd again under its own id (its files, the harness included, come
// from the snapshot).
func ForkSpec(c SpecConfig) func(provider.Spec) provider.Spec {
	return func(s provider.Spec) provider.Spec {
		// A copied harness is in the snapshot; a bound one is bound again.
		return owner.SandboxdSpec(s, c.Sandboxd)
	}
}

// Verdict is a task's grade.
type Verdict struct {
	Reward float64 `json:"reward"`
	// Detail says what was missing.
	Detail string `json:"detail,omitempty"`
}

// Grade checks a session's sandbox: the steps file, the answer 6*7+i,
// and the detached process's file.
func Grade(ctx context.Context, p provider.Provider, s *owner.Session) (json.RawMessage, error) {
	var i int
	if _, err := fmt.Sscanf(s.ID, "task-%d", &i); err != nil {
		return nil, fmt.Errorf("grade: session %s is not a task of the set", s.ID)
	}
	res, err := p.Exec(ctx, s.Sandbox.ID, []string{"sh", "-c", "cat out/answer.txt; head -c 9 out/detached.txt; echo; head -1 out/steps.txt"},
		provider.ExecOptions{}) // the sandbox's working directory, Workdir
	if err != nil {
		return nil, err
	}
	got := strings.Fields(string(res.Stdout))
	want := []string{fmt.Sprint(42 + i), "detached-", "start"}
	v := Verdict{Reward: 1}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		v = Verdict{Reward: 0, Detail: fmt.Sprintf("sandbox holds %q, want %q", got, want)}
	}
	return json.Marshal(v)
}
