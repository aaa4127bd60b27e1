package tasks_test

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/controller-bridge/collect/tasks"
	"github.com/stillpoint/stillpoint/participants/scripted"
)

// A task's script, run by sh as the scripted harness runs its tool calls,
// passes the task's own check with no branch and on an odd branch, fails
// it on an even one, and its final answer names the branch: branches
// diverge, and their grades may.
func TestSetBranchesDiverge(t *testing.T) {
	ts, script := tasks.Set(tasks.Options{N: 2, ToolSeconds: 0.01, Steps: 1})
	for i, task := range ts {
		var p scripted.Task
		if err := json.Unmarshal(task.Task, &p); err != nil {
			t.Fatal(err)
		}
		turns := script[p.Script]
		for _, b := range []struct {
			label string
			pass  bool
		}{{"", true}, {"b1", true}, {"b2", false}, {"b3", true}} {
			dir := t.TempDir()
			var answer string
			for n, turn := range turns {
				tt := turn
				if n > 0 { // the branch point: after the first tool call
					tt = turn.ForBranch(b.label)
				}
				for _, tc := range tt.ToolCalls {
					var args struct {
						Command string `json:"command"`
					}
					if err := json.Unmarshal([]byte(tc.Function.Arguments), &args); err != nil {
						t.Fatalf("task %d turn %d: %v", i, n, err)
					}
					cmd := exec.Command("sh", "-c", args.Command)
					cmd.Dir = dir
					if out, err := cmd.CombinedOutput(); err != nil {
						t.Fatalf("task %d branch %q turn %d: %s: %v: %s", i, b.label, n, args.Command, err, out)
					}
				}
				answer = tt.Content
			}
			cmd := exec.Command(p.Check.Command[0], p.Check.Command[1:]...)
			cmd.Dir = dir
			out, err := cmd.Output()
			if err != nil {
				t.Fatal(err)
			}
			if pass := strings.Join(strings.Fields(string(out)), " ") == p.Check.Expect; pass != b.pass {
				t.Errorf("task %d branch %q: check printed %q, expects %q: pass %v, want %v", i, b.label, out, p.Check.Expect, pass, b.pass)
			}
			want := "done " + task.RolloutID
			if b.label != "" {
				want += " on branch " + b.label
			}
			if answer != want {
				t.Errorf("task %d branch %q answered %q, want %q", i, b.label, answer, want)
			}
		}
	}
}
