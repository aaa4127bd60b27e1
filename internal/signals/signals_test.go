package signals_test

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/internal/signals"
)

func TestMain(m *testing.M) { leak.VerifyTestMain(m) }

// kill sends sig to this process.
func kill(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(os.Getpid(), sig); err != nil {
		t.Fatal(err)
	}
}

// within fails the test unless ch yields within 10 s.
func within[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not happen within 10 s", what)
	}
	var zero T
	return zero
}

// The first SIGINT cancels with ErrSignal as the cause; a later one goes
// to again, and Stop ends the goroutine.
func TestFirstCancelsLaterGoToAgain(t *testing.T) {
	again := make(chan os.Signal, 4)
	ctx, h := signals.Notify(context.Background(), func(s os.Signal) { again <- s })
	defer h.Stop()
	kill(t, syscall.SIGINT)
	within(t, ctx.Done(), "the cancel")
	if cause := context.Cause(ctx); !errors.Is(cause, signals.ErrSignal) || !strings.Contains(cause.Error(), "interrupt") {
		t.Errorf("cause %v, want ErrSignal naming the interrupt", cause)
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Errorf("Err %v, want context.Canceled", ctx.Err())
	}
	kill(t, syscall.SIGTERM)
	if s := within(t, again, "the second signal's call"); s != syscall.SIGTERM {
		t.Errorf("again got %v, want SIGTERM", s)
	}
	h.Stop()
	h.Stop()
}

// While OnTerm holds, SIGTERM calls its stop and leaves the context be;
// after undo it cancels again. SIGINT cancels all along.
func TestOnTermTakesSIGTERM(t *testing.T) {
	ctx, h := signals.Notify(context.Background(), nil)
	defer h.Stop()
	stopped := make(chan struct{}, 4)
	undo := h.OnTerm(func() { stopped <- struct{}{} })
	kill(t, syscall.SIGTERM)
	within(t, stopped, "the command's own stop")
	if ctx.Err() != nil {
		t.Fatal("SIGTERM cancelled the context while OnTerm held it")
	}
	undo()
	kill(t, syscall.SIGTERM)
	within(t, ctx.Done(), "the cancel after undo")
	if cause := context.Cause(ctx); !strings.Contains(cause.Error(), "terminated") {
		t.Errorf("cause %v, want the SIGTERM named", cause)
	}
}

// Stop cancels the context as the command ends, without a signal.
func TestStopCancels(t *testing.T) {
	ctx, h := signals.Notify(context.Background(), nil)
	h.Stop()
	within(t, ctx.Done(), "the cancel at Stop")
	if errors.Is(context.Cause(ctx), signals.ErrSignal) {
		t.Errorf("cause %v after a Stop, want no signal", context.Cause(ctx))
	}
}

// On's goroutine calls fn for each signal, and is gone once stop
// returns: the collect command leaves nothing behind it.
func TestOnEndsItsGoroutine(t *testing.T) {
	called := make(chan struct{}, 1)
	stop := signals.On(syscall.SIGUSR1, func() {
		select {
		case called <- struct{}{}:
		default:
		}
	})
	defer stop()
	kill(t, syscall.SIGUSR1)
	within(t, called, "fn's call for the signal")
	stop()
	buf := make([]byte, 1<<20)
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "signals.On") {
			t.Fatalf("On's goroutine outlives stop:\n%s", g)
		}
	}
}
