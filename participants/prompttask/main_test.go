package prompttask_test

import (
	"testing"

	"github.com/stillpoint/stillpoint/internal/leak"
)

func TestMain(m *testing.M) { leak.VerifyTestMain(m) }
