package leak

import (
	"net"
	"strings"
	"testing"
	"time"
)

// blockOn is a goroutine's innermost function, blocked on ch.
func blockOn(ch chan struct{}) { <-ch }

const blockOnName = "github.com/stillpoint/stillpoint/internal/leak.blockOn"

// writeTo writes to w, as a library's goroutine feeding a pipe does.
func writeTo(w net.Conn) { _, _ = w.Write([]byte("chunk")) }

const writeToName = "github.com/stillpoint/stillpoint/internal/leak.writeTo"

// ignored are the options of this package's own checks: the tests of the
// ignores leave a goroutine blocked on a nil channel and one writing to a
// pipe whose reader is gone.
var ignored = []Option{IgnoreBlockedForever(blockOnName), IgnoreOrphanedPipeWrite(writeToName)}

// TestMain checks this package the way it checks the others; the test of
// IgnoreBlockedForever leaves one goroutine blocked on a nil channel.
func TestMain(m *testing.M) { VerifyTestMain(m, ignored...) }

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
	if err := find(time.Minute, ignored); err != nil {
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
	if err := find(time.Minute, ignored); err != nil {
		t.Fatalf("find with the goroutine blocked forever ignored: %v", err)
	}
	ch := make(chan struct{})
	go blockOn(ch)
	defer close(ch)
	err := find(200*time.Millisecond, ignored)
	if err == nil || !strings.Contains(err.Error(), "leak.blockOn") || !strings.Contains(err.Error(), "[chan receive]") {
		t.Fatalf("find: %v, want the goroutine blocked on a real channel", err)
	}
}

// IgnoreOrphanedPipeWrite ignores a goroutine of its function blocked
// writing to a pipe nobody reads, and only that: the same function blocked
// elsewhere (here on a channel, inside the write of a conn of its own) is
// a leak.
func TestIgnoreOrphanedPipeWrite(t *testing.T) {
	_, w := net.Pipe() // the reader dropped: nothing reads or closes it
	go writeTo(w)
	if err := find(time.Minute, ignored); err != nil {
		t.Fatalf("find with the orphaned writer ignored: %v", err)
	}
	ch := make(chan struct{})
	go writeTo(blockingConn{net.Conn(nil), ch})
	defer close(ch)
	err := find(200*time.Millisecond, ignored)
	if err == nil || !strings.Contains(err.Error(), "leak.writeTo") {
		t.Fatalf("find: %v, want the writer blocked on a channel", err)
	}
}

// blockingConn's Write blocks until ch is closed.
type blockingConn struct {
	net.Conn
	ch chan struct{}
}

func (c blockingConn) Write(b []byte) (int, error) { <-c.ch; return len(b), nil }
