package leak

import (
	"strings"
	"testing"
	"time"
)

// blockOn is a goroutine's innermost function, blocked on ch.
func blockOn(ch chan struct{}) { <-ch }

const blockOnName = "github.com/stillpoint/stillpoint/internal/leak.blockOn"

// TestMain checks this package the way it checks the others; the test of
// IgnoreBlockedForever leaves one goroutine blocked on a nil channel.
func TestMain(m *testing.M) { VerifyTestMain(m, IgnoreBlockedForever(blockOnName)) }

// A goroutine on its way out, slower than goleak's own ~0.4 s, is waited
// for, not reported.
func TestFindWaitsForGoroutinesOnTheirWayOut(t *testing.T) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(800 * time.Millisecond) // stands for a goroutine the scheduler runs late
	}()
	// TestIgnoreBlockedForever leaves a goroutine that can never end (it
	// blocks on a nil channel): ignored here, so that the two pass in any
	// order (-shuffle).
	if err := find(time.Minute, []Option{IgnoreBlockedForever(blockOnName)}); err != nil {
		t.Fatalf("find: %v", err)
	}
	select {
	case <-done:
	default:
		t.Fatal("find returned before the goroutine ended")
	}
}

func TestFindReportsALeak(t *testing.T) {
	ch := make(chan struct{})
	go blockOn(ch)
	defer close(ch)
	err := find(200*time.Millisecond, nil)
	if err == nil || !strings.Contains(err.Error(), "leak.blockOn") {
		t.Fatalf("find: %v, want the blocked goroutine", err)
	}
}

// IgnoreBlockedForever ignores a goroutine blocked on a nil channel, and
// only that: the same function blocked on a channel someone could close is
// a leak.
func TestIgnoreBlockedForever(t *testing.T) {
	var never chan struct{}
	go blockOn(never)
	if err := find(time.Minute, []Option{IgnoreBlockedForever(blockOnName)}); err != nil {
		t.Fatalf("find with the goroutine blocked forever ignored: %v", err)
	}
	ch := make(chan struct{})
	go blockOn(ch)
	defer close(ch)
	err := find(200*time.Millisecond, []Option{IgnoreBlockedForever(blockOnName)})
	if err == nil || !strings.Contains(err.Error(), "leak.blockOn") || !strings.Contains(err.Error(), "[chan receive]") {
		t.Fatalf("find: %v, want the goroutine blocked on a real channel", err)
	}
}
