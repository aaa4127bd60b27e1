package collect

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	agent "github.com/stillpoint/stillpoint/participants/agent/agentapi"
)

// A line a crash cut is truncated away; complete lines are read; the file
// is left at its end for appending.
func TestReadLinesCutsATornLastLine(t *testing.T) {
	p := filepath.Join(t.TempDir(), "out.jsonl")
	if err := os.WriteFile(p, []byte("{\"a\":1}\n\n{\"a\":2}\n{\"a\":"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := openLog(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []string
	if err := readLines(f, func(b []byte) error { got = append(got, string(b)); return nil }); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, "|") != `{"a":1}|{"a":2}` {
		t.Fatalf("lines %q", got)
	}
	if err := appendLine(f, map[string]int{"a": 3}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	if string(b) != "{\"a\":1}\n\n{\"a\":2}\n{\"a\":3}\n" {
		t.Fatalf("file %q", b)
	}
}

// Two results of one rollout in the output is corruption, named.
func TestOpenFilesRefusesTwoResultsOfARollout(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out.jsonl")
	line := `{"rollout_id":"r1","attempt":0,"episode":"r1","ok":true,"time":"2026-01-01T00:00:00Z"}` + "\n"
	if err := os.WriteFile(out, []byte(line+line), 0o644); err != nil {
		t.Fatal(err)
	}
	c := &Collector{cfg: Config{Output: out, DispatchLog: out + ".dispatch"}, done: map[string]Result{}}
	if _, err := c.openFiles(); err == nil || !strings.Contains(err.Error(), "r1 has two results") {
		t.Fatalf("openFiles: %v", err)
	}
}

func TestReadTasks(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ in, want string }{
		{`{"rollout_id":"r1","task":{}}` + "\n" + `{"rollout_id":"r1","task":{}}`, "already on line 1"},
		{`{"rollout_id":"../x","task":{}}`, "rollout_id"},
		{`{"rollout_id":"r1"}`, "no task"},
		{`not json`, "tasks.jsonl:1"},
	} {
		p := filepath.Join(dir, "tasks.jsonl")
		if err := os.WriteFile(p, []byte(c.in), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := ReadTasks(p); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ReadTasks(%q) = %v, want an error naming %q", c.in, err, c.want)
		}
	}
}

// The summary counts what restores did with the launches a process-keeping
// snapshot kept, from the results' launch logs; a failed result, which has
// no launch log, counts only as failed.
func TestSummaryCountsRebinds(t *testing.T) {
	ok := func(rebinds ...string) Result {
		var ls []agent.LaunchRecord
		for _, r := range rebinds {
			ls = append(ls, agent.LaunchRecord{Rebind: r, Ended: agent.LaunchFinished, Pauses: 1})
		}
		return Result{OK: true, Result: &agent.Result{Launches: ls}}
	}
	c := &Collector{done: map[string]Result{
		"a": ok(agent.RebindResumed), "b": ok(agent.RebindRelayGone, ""), "c": ok(agent.RebindResumed),
		"d": {OK: false, Error: "lost"},
	}}
	s := c.Summary()
	if s.Results != 4 || s.Failed != 1 || s.Rebinds[agent.RebindResumed] != 2 || s.Rebinds[agent.RebindRelayGone] != 1 || len(s.Rebinds) != 2 {
		t.Fatalf("summary %+v", s)
	}
}
