package tasks

import (
	"encoding/json"
	"fmt"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/participants/scripted"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

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
// session of its own, and answers "done <id>"; its check reads the answer,
// the detached process's mark and the first step back.
//
// Every turn after the first tool call has a continuation for any branch
// ("*", modelserver.Turn.Branches), so that a rollout's branches diverge:
// their texts name the branch, their answers end "on branch b<k>", and
// from the calc turn on an even-numbered branch writes a wrong answer,
// 6*7+i+k (branchAnswer): its check expects the task's, so odd branches
// grade 1 and even ones 0 when the branch point is before the bg turn (a
// branch after it keeps its parent's answer and grade).
func Set(o Options) ([]collect.Task, modelserver.Script) {
	if o.ToolSeconds == 0 {
		o.ToolSeconds = 0.5
	}
	if o.Steps == 0 {
		o.Steps = 2
	}
	script := modelserver.Script{}
	tasks := make([]collect.Task, o.N)
	for i := range o.N {
		id := ID(i)
		turns := []modelserver.Turn{{Content: "Setting up.", ToolCalls: []modelserver.ToolCall{call("c0", "mkdir -p out && echo start > out/steps.txt")}}}
		for s := 1; s <= o.Steps; s++ {
			step := fmt.Sprintf("echo step-%d >> out/steps.txt && wc -l < out/steps.txt", s)
			turns = append(turns, branched(modelserver.Turn{ToolCalls: []modelserver.ToolCall{call(fmt.Sprintf("c%d", s), step)}},
				modelserver.Turn{Content: fmt.Sprintf("Branch %s: step %d.", modelserver.BranchPlaceholder, s),
					ToolCalls: []modelserver.ToolCall{call(fmt.Sprintf("c%d", s), step)}}))
		}
		calc := fmt.Sprintf("sleep %g; echo $((6*7+%d)) > out/answer.txt; cat out/answer.txt", o.ToolSeconds, i)
		bg := "setsid -w sh -c 'echo detached-$$ > out/detached.txt' < /dev/null"
		turns = append(turns,
			branched(modelserver.Turn{Content: "Computing.", ToolCalls: []modelserver.ToolCall{call("calc", calc)}},
				modelserver.Turn{Content: "Computing on branch " + modelserver.BranchPlaceholder + ".",
					ToolCalls: []modelserver.ToolCall{call("calc", fmt.Sprintf("sleep %g; %s; cat out/answer.txt", o.ToolSeconds, branchAnswer(i)))}}),
			branched(modelserver.Turn{ToolCalls: []modelserver.ToolCall{call("bg", bg)}},
				modelserver.Turn{ToolCalls: []modelserver.ToolCall{call("bg", bg+"; "+branchAnswer(i))}}),
			branched(modelserver.Turn{Content: "done " + id},
				modelserver.Turn{Content: "done " + id + " on branch " + modelserver.BranchPlaceholder}))
		script[id] = turns
		payload, _ := json.Marshal(scripted.Task{
			Script: id,
			Prompt: fmt.Sprintf("Task %d: compute 6*7+%d into out/answer.txt.", i, i),
			Check: &scripted.Check{
				Command: []string{"sh", "-c", "cat out/answer.txt; head -c 9 out/detached.txt; echo; head -1 out/steps.txt"},
				Expect:  fmt.Sprintf("%d detached- start", 6*7+i),
			},
		})
		tasks[i] = collect.Task{RolloutID: id, Task: payload}
	}
	return tasks, script
}

// branched returns t with any branch answering b instead.
func branched(t, b modelserver.Turn) modelserver.Turn {
	t.Branches = map[string]modelserver.Turn{modelserver.AnyBranch: b}
	return t
}

// branchAnswer is the shell that writes out/answer.txt as branch b<k> of
// task i does: 6*7+i on an odd k (the task's answer), 6*7+i+k on an even
// one (a wrong answer: the check grades it 0).
func branchAnswer(i int) string {
	return fmt.Sprintf("b=%s; k=${b#b}; echo $((6*7+%d+(1-k%%2)*k)) > out/answer.txt", modelserver.BranchPlaceholder, i)
}
