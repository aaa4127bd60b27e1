package modelserver

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"
)

// TaskLine is one line of a tasks file (JSONL) as the model server reads
// and `stillpoint tasks` writes it: the collector's line (rollout id and
// task payload) and, beside the payload, the scripted model's turns for
// the task. The collector, the agent and the owner never read Model: it
// is not part of the payload.
//
//	{"rollout_id": "py-calc", "task": {"task": "py-calc", ...},
//	 "model": {"turns": [{"content": "Reading the code.", "tool_calls": [...]}, ...]}}
type TaskLine struct {
	RolloutID string          `json:"rollout_id"`
	Task      json.RawMessage `json:"task"`
	Model     *TaskModel      `json:"model,omitempty"`
}

// TaskModel is the scripted model's part of a tasks file line.
type TaskModel struct {
	// Script names the script, what requests send as TaskHeader; default
	// the payload's "task" field when it is a string (the scripted
	// harness sends that), else the rollout id.
	Script string `json:"script,omitempty"`
	// Turns are the replies, in order.
	Turns []Turn `json:"turns"`
}

// ScriptName returns the name the line's turns are served under.
func (l TaskLine) ScriptName() string {
	if l.Model != nil && l.Model.Script != "" {
		return l.Model.Script
	}
	var p struct {
		Task any `json:"task"`
	}
	if json.Unmarshal(l.Task, &p) == nil {
		if s, ok := p.Task.(string); ok && s != "" {
			return s
		}
	}
	return l.RolloutID
}

// LoadTasks reads a tasks file's model turns into a script. Lines without
// a model are skipped; a file with none, a line that does not decode, a
// model without turns, a tool call without an id, a name or JSON
// arguments, and two lines that give one script different turns are
// errors (wrapping ErrNoScript) naming the line.
func LoadTasks(r io.Reader) (Script, error) {
	s := Script{}
	from := map[string]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var l TaskLine
		if err := json.Unmarshal(line, &l); err != nil {
			return nil, fmt.Errorf("%w: line %d: %v", ErrNoScript, n, err)
		}
		if l.Model == nil {
			continue
		}
		name := l.ScriptName()
		if strings.TrimSpace(name) == "" {
			return nil, fmt.Errorf("%w: line %d: no script name (model.script, the payload's task, or rollout_id)", ErrNoScript, n)
		}
		if err := checkTurns(l.Model.Turns); err != nil {
			return nil, fmt.Errorf("%w: line %d (%s): %v", ErrNoScript, n, name, err)
		}
		if prev, ok := s[name]; ok {
			if !reflect.DeepEqual(prev, l.Model.Turns) {
				return nil, fmt.Errorf("%w: line %d: script %q has other turns on line %d", ErrNoScript, n, name, from[name])
			}
			continue
		}
		s[name], from[name] = l.Model.Turns, n
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(s) == 0 {
		return nil, fmt.Errorf("%w: no line has model turns", ErrNoScript)
	}
	return s, nil
}

// LoadTasksFile is LoadTasks of the file at path.
func LoadTasksFile(path string) (Script, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s, err := LoadTasks(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// checkTurns checks the turns of one script; a tool call without a type
// gets "function".
func checkTurns(turns []Turn) error {
	if len(turns) == 0 {
		return fmt.Errorf("model.turns: none")
	}
	for i := range turns {
		if err := checkBranches(turns[i], fmt.Sprintf("model.turns[%d]", i)); err != nil {
			return err
		}
		for k, b := range turns[i].Branches {
			if err := checkTurns([]Turn{b}); err != nil {
				return fmt.Errorf("model.turns[%d].branches[%q]: %v", i, k, err)
			}
			turns[i].Branches[k] = b
		}
		for j := range turns[i].ToolCalls {
			tc := &turns[i].ToolCalls[j]
			field := fmt.Sprintf("model.turns[%d].tool_calls[%d]", i, j)
			switch {
			case tc.ID == "":
				return fmt.Errorf("%s: no id", field)
			case tc.Function.Name == "":
				return fmt.Errorf("%s: no function name", field)
			case !json.Valid([]byte(tc.Function.Arguments)):
				return fmt.Errorf("%s: function.arguments is not JSON: %.80q", field, tc.Function.Arguments)
			}
			if tc.Type == "" {
				tc.Type = "function"
			}
		}
	}
	return nil
}
