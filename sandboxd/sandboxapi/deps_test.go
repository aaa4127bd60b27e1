package sandboxapi_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestWireTypesOnly keeps the contract a leaf: of this module it imports
// events alone, so neither the supervisor nor the client
// (sandboxd/sandboxclient) nor the bus comes with it.
func TestWireTypesOnly(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("this test runs `go list`; put the go command on PATH: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	const module = "github.com/stillpoint/stillpoint/"
	for dep := range strings.FieldsSeq(string(out)) {
		switch dep {
		case module + "events", module + "sandboxd/sandboxapi":
			continue
		}
		if strings.HasPrefix(dep, module) {
			t.Errorf("package sandboxapi depends on %s; it holds the wire types only", dep)
		}
	}
}
