package collect

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, jstest.LeakOptions()...)
}
