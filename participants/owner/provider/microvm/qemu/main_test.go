package qemu

import (
	"testing"

	"github.com/stillpoint/stillpoint/internal/leak"
)

// TestMain checks that the tests leave no goroutine behind (the probe's
// wait for QEMU among them).
func TestMain(m *testing.M) { leak.VerifyTestMain(m) }
