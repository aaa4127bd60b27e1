package e2e

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// TestMain checks that the tests leave no goroutine behind: the bridge,
// owners and servers they run in-process, and the goroutines that wait for
// the processes they start.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, jstest.LeakOptions()...)
}
