package jetstream_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoServerDependency keeps nats-server out of this package's build: sandboxd, a small static
// binary, imports it. The embedded server lives in jetstream/embedded.
func TestNoServerDependency(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("this test runs `go list`; put the go command on PATH: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for dep := range strings.FieldsSeq(string(out)) {
		if strings.HasPrefix(dep, "github.com/nats-io/nats-server") {
			t.Errorf("package jetstream depends on %s; only jetstream/embedded may import nats-server", dep)
		}
	}
}
