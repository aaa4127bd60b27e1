package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExecAdapterNeedsAGoodSpec: --adapter exec without a spec, or with
// one that does not parse, is a usage error that says what is wrong, before
// the agent connects anywhere.
func TestExecAdapterNeedsAGoodSpec(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"launch": {"argv": ["h", "{promt}"]}, "continue": "never", "answer": "last_line"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--harness-spec is required"},
		{[]string{"--harness-spec", bad}, bad + `: launch.argv[1]: "{promt}": unknown placeholder {promt}`},
		{[]string{"--harness-spec", bad + ".none"}, "no such file"},
	} {
		var out, errb bytes.Buffer
		args := append([]string{"--nats-url", "nats://127.0.0.1:1", "agent", "--run", "r", "--model-url", "http://127.0.0.1:1", "--adapter", "exec"}, c.args...)
		if code := Main(args, &out, &errb); code != ExitUsage || !strings.Contains(errb.String(), c.want) {
			t.Errorf("%v: exit %d, stderr %q, want %d and %q", c.args, code, errb.String(), ExitUsage, c.want)
		}
	}
}
