package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/controller-bridge/inspect"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// TestInspectCommand: `stillpoint inspect` against a provisioned bus with
// no run yet prints the empty report (text and --json), refuses a missing
// or bad run id as a usage error, and a server without the bus as a failure
// that names the bucket. A real run is inspected in package inspect.
func TestInspectCommand(t *testing.T) {
	env := jstest.Start(t)
	url := env.URL
	var out, errb bytes.Buffer
	if code := Main([]string{"inspect", "--run", "r1", "--nats-url", url}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	for _, want := range []string{"run r1", "LATEST none", "HEAD none", "checkpoints kept: 0", "live members: 0"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("inspect printed no %q:\n%s", want, out.String())
		}
	}
	out.Reset()
	if code := Main([]string{"inspect", "--run", "r1", "--json", "--nats-url", url}, &out, &errb); code != 0 {
		t.Fatalf("--json: exit %d: %s", code, errb.String())
	}
	var r inspect.Report
	if err := json.Unmarshal(out.Bytes(), &r); err != nil || r.Run != "r1" || r.Checkpoints == nil {
		t.Fatalf("--json printed %q: %v", out.String(), err)
	}
	for _, args := range [][]string{{"inspect", "--nats-url", url}, {"inspect", "--run", "bad run", "--nats-url", url}} {
		errb.Reset()
		if code := Main(args, &out, &errb); code != ExitUsage || !strings.Contains(errb.String(), "run") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errb.String())
		}
	}
	bare := jstest.Start(t, jstest.WithoutProvision())
	errb.Reset()
	if code := Main([]string{"inspect", "--run", "r1", "--nats-url", bare.URL}, &out, &errb); code != ExitFailure ||
		!strings.Contains(errb.String(), "bucket not found") {
		t.Errorf("a server without the bus: exit %d, stderr %q", code, errb.String())
	}
}
