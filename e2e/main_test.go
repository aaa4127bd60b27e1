package e2e

import (
	"os"
	"testing"
)

// TestMain removes the binaries the tests built once the package's tests
// are done.
func TestMain(m *testing.M) {
	code := m.Run()
	if binsDir != "" {
		_ = os.RemoveAll(binsDir)
	}
	os.Exit(code)
}
