package cli

import (
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// onSignal's goroutine calls fn for each signal, and is gone once stop
// returns: the collect command leaves nothing behind it.
func TestOnSignalEndsItsGoroutine(t *testing.T) {
	called := make(chan struct{}, 1)
	stop := onSignal(syscall.SIGUSR1, func() {
		select {
		case called <- struct{}{}:
		default:
		}
	})
	defer stop()
	if err := syscall.Kill(os.Getpid(), syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-called:
	case <-time.After(10 * time.Second):
		t.Fatal("fn was not called for the signal")
	}
	stop()
	buf := make([]byte, 1<<20)
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "cli.onSignal") {
			t.Fatalf("onSignal's goroutine outlives stop:\n%s", g)
		}
	}
}
