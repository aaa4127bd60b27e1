package e2e

import (
	"testing"

	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// TestMain checks that the tests leave no goroutine behind: the bridge,
// owners and servers they run in-process, and the goroutines that wait for
// the processes they start.
func TestMain(m *testing.M) {
	leak.VerifyTestMain(m, jstest.LeakOptions()...)
}
