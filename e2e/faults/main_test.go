package faults

import (
	"testing"

	"github.com/stillpoint/stillpoint/internal/leak"
)

// TestMain checks that the tests leave no goroutine behind (those that
// wait for the chaos processes they start).
func TestMain(m *testing.M) { leak.VerifyTestMain(m) }
