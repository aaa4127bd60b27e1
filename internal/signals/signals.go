package signals

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
)

// ErrSignal is the cause of a context Notify's handler cancelled, wrapped
// with the name of the signal that did.
var ErrSignal = errors.New("signals: stopped by a signal")

// Handler handles SIGINT and SIGTERM for one command, from Notify until
// Stop.
type Handler struct {
	ch     chan os.Signal
	cancel context.CancelCauseFunc
	again  func(os.Signal)
	term   atomic.Pointer[func()]
	done   chan struct{}
	wg     sync.WaitGroup
	stop   func()
}

// Notify starts handling SIGINT and SIGTERM: the first cancels the
// returned context (a child of parent) with cause ErrSignal, and each
// later one calls again with it (nil: it is ignored). Stop the Handler
// when the command ends.
func Notify(parent context.Context, again func(os.Signal)) (context.Context, *Handler) {
	ctx, cancel := context.WithCancelCause(parent)
	h := &Handler{ch: make(chan os.Signal, 2), cancel: cancel, again: again, done: make(chan struct{})}
	signal.Notify(h.ch, syscall.SIGINT, syscall.SIGTERM)
	h.wg.Go(h.loop)
	h.stop = sync.OnceFunc(func() {
		signal.Stop(h.ch)
		close(h.done)
		h.wg.Wait()
		cancel(nil)
	})
	return ctx, h
}

// loop cancels at the first signal that OnTerm does not take, then hands
// every later one to again.
func (h *Handler) loop() {
	for {
		select {
		case sig := <-h.ch:
			if f := h.term.Load(); f != nil && sig == syscall.SIGTERM {
				(*f)() // the command stops in its own way
				continue
			}
			h.cancel(fmt.Errorf("%w: %v", ErrSignal, sig))
		case <-h.done:
			return
		}
		break
	}
	for {
		select {
		case sig := <-h.ch:
			if h.again != nil {
				h.again(sig)
			}
		case <-h.done:
			return
		}
	}
}

// OnTerm makes SIGTERM call stop instead of cancelling the context, until
// the returned undo: a command that stops in a way of its own takes it.
// SIGINT still cancels, and once the context is cancelled a SIGTERM is a
// later signal like any other.
func (h *Handler) OnTerm(stop func()) (undo func()) {
	p := &stop
	h.term.Store(p)
	return func() { h.term.CompareAndSwap(p, nil) }
}

// Stop stops handling the signals, waits for the Handler's goroutine and
// cancels the context. It may be called more than once.
func (h *Handler) Stop() { h.stop() }

// Die is an again function for Notify: the signal ends the process as it
// ends one that does not catch it.
func Die(sig os.Signal) {
	signal.Reset(sig)
	if s, ok := sig.(syscall.Signal); ok {
		_ = syscall.Kill(os.Getpid(), s)
	}
}

// On calls fn each time the process gets sig, from a goroutine that the
// returned stop ends and waits for: signal.Stop alone would leave it
// waiting on a channel that is never closed.
func On(sig os.Signal, fn func()) (stop func()) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, sig)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-ch:
				fn()
			case <-done:
				return
			}
		}
	})
	return sync.OnceFunc(func() {
		signal.Stop(ch)
		close(done)
		wg.Wait()
	})
}

// SurviveBrokenPipe makes a write to standard output or error that nobody
// reads any more (a pipe whose reader died) fail with EPIPE instead of
// ending the process with SIGPIPE, for the rest of the process's life. It
// asks for SIGPIPE rather than ignoring it because a handler, unlike an
// ignored signal, is not inherited by the programs the process starts.
func SurviveBrokenPipe() { signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE) }
