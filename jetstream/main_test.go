package jetstream_test

import (
	"context"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

func TestMain(m *testing.M) {
	leak.VerifyTestMain(m, jstest.LeakOptions()...)
}

// testContext bounds one test's calls to the bus.
func testContext(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}
