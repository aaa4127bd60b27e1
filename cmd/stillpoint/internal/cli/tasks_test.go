package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/controller-bridge/collect/tasks"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// `tasks` writes a set as a tasks file the collector reads, whose lines
// carry their model turns; `modelserver --tasks` serves them and writes
// its ledger when it stops.
func TestTasksAndModelServer(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "tasks.jsonl")
	var out, errb bytes.Buffer
	if code := Main([]string{"tasks", "--set", "scripted", "--n", "3", "--out", file}, &out, &errb); code != 0 {
		t.Fatalf("tasks: exit %d: %s", code, errb.String())
	}
	ts, err := collect.ReadTasks(file)
	if err != nil || len(ts) != 3 {
		t.Fatalf("the collector reads %d tasks: %v", len(ts), err)
	}
	if code := Main([]string{"tasks", "--set", "nope", "--out", file}, &out, &errb); code != ExitUsage || !strings.Contains(errb.String(), "want repos, swe or scripted") {
		t.Errorf("tasks --set nope: exit %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := Main([]string{"tasks", "--set", "repos", "--harness", "aider", "--out", file}, &out, &errb); code != ExitUsage || !strings.Contains(errb.String(), `--harness "aider"`) {
		t.Errorf("tasks --harness aider: exit %d, stderr %q", code, errb.String())
	}
	oc := filepath.Join(dir, "opencode.jsonl")
	if code := Main([]string{"tasks", "--set", "repos", "--harness", "opencode", "--out", oc}, &out, &errb); code != 0 {
		t.Fatalf("tasks --harness opencode: exit %d: %s", code, errb.String())
	}
	fh, err := os.Open(oc)
	if err != nil {
		t.Fatal(err)
	}
	script, err := modelserver.LoadTasks(fh)
	fh.Close()
	if err != nil || len(script["py-calc"]) == 0 || script["py-calc"][0].ToolCalls[0].Function.Name != "read" {
		t.Fatalf("the OpenCode repository script: %v %v", script["py-calc"], err)
	}
	// --n takes the first tasks of the set, by id, and only their turns.
	four := filepath.Join(dir, "four.jsonl")
	if code := Main([]string{"tasks", "--set", "repos", "--n", "4", "--out", four}, &out, &errb); code != 0 {
		t.Fatalf("tasks --set repos --n 4: exit %d: %s", code, errb.String())
	}
	ts4, err := collect.ReadTasks(four)
	if err != nil || len(ts4) != 4 {
		t.Fatalf("tasks --set repos --n 4: the collector reads %d tasks: %v", len(ts4), err)
	}
	want := tasks.RepoNames()[:4]
	for i, tk := range ts4 {
		if tk.RolloutID != want[i] {
			t.Errorf("tasks --set repos --n 4: task %d is %s, want %s", i, tk.RolloutID, want[i])
		}
	}
	if code := Main([]string{"tasks", "--set", "repos", "--n", "-1", "--out", four}, &out, &errb); code != ExitUsage {
		t.Errorf("tasks --set repos --n -1: exit %d, want a usage error", code)
	}

	ledger := filepath.Join(dir, "ledger.json")
	stdout := &jstest.Buffer{}
	g := &globals{stdout: stdout, stderr: &jstest.Buffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- runModelServer(ctx, g, modelServerFlags{tasks: file, listen: "127.0.0.1:0", ledger: ledger})
	}()
	addr := regexp.MustCompile(`on (http://\S+)`)
	var url string
	poll.Wait(t, 10*time.Second, "the model server to listen", func() bool {
		m := addr.FindStringSubmatch(stdout.String())
		if m != nil {
			url = m[1]
		}
		return m != nil
	})
	b, _ := json.Marshal(modelserver.Request{Model: "m", Messages: []modelserver.Message{{Role: "user", Content: json.RawMessage(`"go"`)}}})
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(b))
	req.Header.Set(modelserver.TaskHeader, ts[0].RolloutID)
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a scripted call: %v %v", resp, err)
	}
	resp.Body.Close()
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(ledger)
	if err != nil {
		t.Fatal(err)
	}
	var l []modelserver.Entry
	if err := json.Unmarshal(raw, &l); err != nil || len(l) != 1 || l[0].Task != ts[0].RolloutID {
		t.Fatalf("ledger %s: %v", raw, err)
	}
	if code := Main([]string{"modelserver", "--tasks", filepath.Join(dir, "none.jsonl")}, &out, &errb); code != ExitUsage {
		t.Errorf("modelserver of a missing file: exit %d", code)
	}
}

// `tasks --set swe` writes the SWE-style set, its images in one OCI
// layout under --dir, and --n keeps the first instances.
func TestTasksSWE(t *testing.T) {
	tier.Long(t)
	dir := t.TempDir()
	file := filepath.Join(dir, "swe.jsonl")
	var out, errb bytes.Buffer
	if code := Main([]string{"tasks", "--set", "swe", "--harness", "opencode", "--n", "2", "--dir", filepath.Join(dir, "swe"), "--out", file}, &out, &errb); code != 0 {
		t.Fatalf("tasks --set swe: exit %d: %s", code, errb.String())
	}
	ts, err := collect.ReadTasks(file)
	if err != nil || len(ts) != 2 {
		t.Fatalf("the collector reads %d tasks: %v", len(ts), err)
	}
	var in struct{ Image string }
	if err := json.Unmarshal(ts[0].Task, &in); err != nil || in.Image != filepath.Join(dir, "swe", "oci")+":"+ts[0].RolloutID {
		t.Fatalf("task %s: image %q (%v)", ts[0].RolloutID, in.Image, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "swe", "oci", "index.json")); err != nil {
		t.Fatal(err)
	}
}
