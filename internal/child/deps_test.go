package child_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoTestingDependency keeps package testing out of the demo's binary,
// which starts its components through this package.
func TestNoTestingDependency(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("this test runs `go list`; put the go command on PATH: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for dep := range strings.FieldsSeq(string(out)) {
		if dep == "testing" || strings.HasPrefix(dep, "github.com/nats-io/") {
			t.Errorf("package child depends on %s", dep)
		}
	}
}
