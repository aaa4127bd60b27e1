package collect

import (
	"context"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
)

// flakyRetire is a controller whose retire fails its first fails calls, as
// a retire does while a recovering fleet's members are replaced.
type flakyRetire struct {
	noController
	mu    sync.Mutex
	fails int
	calls int
}

func (f *flakyRetire) Retire(context.Context, []string) (*bridgeapi.OpResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.calls <= f.fails {
		return &bridgeapi.OpResult{Status: bridgeapi.StatusFailed}, nil
	}
	return &bridgeapi.OpResult{Status: bridgeapi.StatusCompleted}, nil
}

// A retire that fails is asked again, retireTries times in all (a fleet
// killed and started again during a recovery fails a retire, which must
// not end the collection); one that keeps failing is an error.
func TestRetireAsksAgain(t *testing.T) {
	ctl := &flakyRetire{fails: 2}
	c := &Collector{cfg: Config{Controller: ctl}, log: zerolog.Nop()}
	if err := c.retire(t.Context(), []string{"r1"}); err != nil {
		t.Fatalf("retire after 2 failures: %v", err)
	}
	if ctl.calls != 3 || c.sum.Retired != 1 {
		t.Errorf("%d calls, %d retired; want 3 and 1", ctl.calls, c.sum.Retired)
	}
	ctl = &flakyRetire{fails: retireTries}
	c = &Collector{cfg: Config{Controller: ctl}, log: zerolog.Nop()}
	if err := c.retire(t.Context(), []string{"r1"}); err == nil || ctl.calls != retireTries {
		t.Errorf("retire that always fails: %v after %d calls", err, ctl.calls)
	}
}
