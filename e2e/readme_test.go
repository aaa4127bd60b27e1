package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/opencode"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
)

// The README's text before its blocks of the parts by hand: with the
// scripted harness, and with OpenCode.
const (
	readmeMarker         = "With a server running (`go run ./cmd/stillpoint server` in another terminal),"
	readmeOpenCodeMarker = "hand with OpenCode, on 2 of the repository tasks"
)

// byHandBlock returns a README block of the parts by hand: the first
// fenced sh block after marker.
func byHandBlock(t *testing.T, marker string) string {
	t.Helper()
	b, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), marker)
	if !ok {
		t.Fatalf("README.md has no text %q before its block", marker)
	}
	_, rest, ok = strings.Cut(rest, "\n```sh\n")
	block, _, closed := strings.Cut(rest, "\n```\n")
	if !ok || !closed {
		t.Fatal("README.md: no fenced sh block after the parts by hand")
	}
	return block
}

// freeAddr returns a loopback address with a port free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestReadmeByHand runs the README's parts by hand as they are written,
// from the checkout's root, against a server of its own: bash runs the
// block, with its directory and its two ports given through the variables
// the block reads. Every rollout of the repository set ends with one
// result whose reward its tests gave, and the model server wrote its
// ledger with no repeated call.
func TestReadmeByHand(t *testing.T) {
	tier.E2E(t)
	parallel(t, 1.5, 15*time.Second)
	runByHand(t, byHandBlock(t, readmeMarker))
}

// TestReadmeByHandWithOpenCode runs the README's parts by hand with
// OpenCode as they are written, as TestReadmeByHand does the first block:
// the real OpenCode runs 2 of the repository tasks at once.
func TestReadmeByHandWithOpenCode(t *testing.T) {
	tier.E2E(t)
	parallel(t, 1.5, 55*time.Second)
	if _, err := opencode.Binary(); err != nil {
		t.Fatal(err)
	}
	block := byHandBlock(t, readmeOpenCodeMarker)
	for _, want := range []string{"--harness opencode", "--opencode bin/opencode-driver", "--adapter opencode"} {
		if !strings.Contains(block, want) {
			t.Fatalf("the README's OpenCode block does not say %q:\n%s", want, block)
		}
	}
	runByHand(t, block)
}

// checkoutBin is held by a test that runs a README block: the block builds
// into the checkout's bin/ and runs what it built from there, so a second
// block's build beside it would replace binaries the first is running.
var checkoutBin sync.Mutex

// runByHand runs a README block of the parts by hand and checks what it
// did.
func runByHand(t *testing.T, block string) {
	t.Helper()
	checkoutBin.Lock()
	t.Cleanup(checkoutBin.Unlock)
	if _, err := exec.LookPath("bash"); err != nil {
		t.Fatal("the README's block runs in bash: apt-get install bash")
	}
	for _, want := range []string{"bin/stillpoint tasks", "bin/stillpoint modelserver", "bin/stillpoint collect", "kill $(jobs -p)"} {
		if !strings.Contains(block, want) {
			t.Fatalf("the README's block does not run %q:\n%s", want, block)
		}
	}
	env := jstest.Start(t)
	w := t.TempDir()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// The block's owner stops every sandbox it lent; what a failure
		// left is stopped here, and fails the test.
		out, err := exec.Command(filepath.Join(root, "bin", "stillpoint"), "owner", "--reap", "--state-dir", filepath.Join(w, "owner")).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "" {
			t.Errorf("sandboxes left by the README's owner: %s %v", out, err)
		}
	})
	p := child.StartForTest(t, child.Spec{Name: "README parts by hand", Path: "bash", Args: []string{"-e", "-c", block}, Dir: root,
		Env: []string{"W=" + w, "MODEL=" + freeAddr(t), "BRIDGE=" + freeAddr(t), "STILLPOINT_NATS_URL=" + env.URL,
			"STILLPOINT_LOG_LEVEL=warn", "STILLPOINT_LOG_FORMAT=json"}})
	ctx, cancel := context.WithTimeout(t.Context(), 8*time.Minute)
	defer cancel()
	exit, err := p.Wait(ctx)
	if err != nil || !exit.Success() {
		t.Fatalf("the README's block: %v %v\n%s", exit, err, p.Output())
	}
	ts, err := collect.ReadTasks(filepath.Join(w, "tasks.jsonl"))
	if err != nil || len(ts) == 0 {
		t.Fatalf("the block's tasks file: %d tasks, %v", len(ts), err)
	}
	n := len(ts)
	for _, want := range []string{fmt.Sprintf(`wrote %d repos tasks`, n), fmt.Sprintf(`scripted model of %d tasks`, n),
		fmt.Sprintf(`results +%d \(%d graded, 0 failed, 0 infra_failed\)`, n, n), `ledger of \d+ requests`} {
		if !regexp.MustCompile(want).MatchString(p.Output()) {
			t.Errorf("the block's output does not say %q:\n%s", want, p.Output())
		}
	}

	f, err := os.Open(filepath.Join(w, "results.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var r collect.Result
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("results line %q: %v", sc.Text(), err)
		}
		seen[r.RolloutID]++
		if !r.OK || r.Result == nil {
			t.Errorf("%s: failed: %s", r.RolloutID, r.Error)
			continue
		}
		checkRepoVerdict(t, r.RolloutID, *r.Result)
	}
	for _, tk := range ts {
		if seen[tk.RolloutID] != 1 {
			t.Errorf("%s: %d results, want 1", tk.RolloutID, seen[tk.RolloutID])
		}
	}
	if len(seen) != n {
		t.Errorf("results of %d rollouts, want the %d of the tasks file", len(seen), n)
	}
	raw, err := os.ReadFile(filepath.Join(w, "ledger.json"))
	if err != nil {
		t.Fatalf("the model server wrote no ledger: %v", err)
	}
	var ledger []modelserver.Entry
	if err := json.Unmarshal(raw, &ledger); err != nil || len(ledger) < n {
		t.Fatalf("ledger of %d entries: %v", len(ledger), err)
	}
	for _, e := range ledger {
		if e.UserTurns != 1 {
			t.Errorf("%s: a request with %d user turns", e.Task, e.UserTurns)
		}
	}
}
