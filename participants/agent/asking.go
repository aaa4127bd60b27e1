package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/live"
)

// whileDaemonLives runs fn, a call to sandbox's daemon, and ends it with
// errSandboxLost once the daemon is known gone: its heartbeat went, or,
// asked while fn waits for its answer (live.Prober.Watch), the silence
// rule finds it gone. A daemon killed while it held the call would
// otherwise hold the run for the call's whole timeout, and with it every
// checkpoint meanwhile: the run is not at a boundary, so its agent cannot
// be ready.
func whileDaemonLives[T any](ctx context.Context, a *Agent, sandbox string, fn func(context.Context) (T, error)) (T, error) {
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	died, stopWatch := a.watchDaemon(cctx, sandbox)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-cctx.Done():
		case <-a.daemons.goneCh(sandbox):
			cancel(errSandboxLost)
		case <-died:
			a.daemons.set(sandbox, true)
			cancel(errSandboxLost)
		}
	}()
	v, err := fn(cctx)
	cancel(nil)
	<-watched
	stopWatch()
	if err != nil && errors.Is(context.Cause(cctx), errSandboxLost) && ctx.Err() == nil {
		return v, fmt.Errorf("%w: the daemon of sandbox %s went while it held the call: %w", errSandboxLost, sandbox, err)
	}
	return v, err
}

// watchDaemon asks sandbox's daemon whether it is there once a round
// (live.Prober.Watch with its default rounds), until ctx ends or stop is
// called, and closes died once the silence rule finds it gone. Without a
// book (no connection) died is never closed.
func (a *Agent) watchDaemon(ctx context.Context, sandbox string) (died <-chan struct{}, stop func()) {
	m, err := events.NewMember(events.KindSandbox, sandbox)
	if a.acks == nil || a.acks.prober == nil || err != nil {
		return make(chan struct{}), func() {}
	}
	watch := *a.acks.prober
	watch.Rounds = 0
	return watch.Watch(ctx, m, events.AliveQuery{}, nil)
}

// retryNoResponders calls fn with a context bounded by timeout, again while
// nobody answers (a daemon or an owner starting, or restarting) for up to
// DaemonWait (live.Retry): such a request reached no one, so asking again
// is safe. A request that timed out is not asked again. A request that
// fails once ctx has ended returns ctx's cause, not the plain cancel the
// call saw: the cause (a shutdown, a park, a retire) decides the cleanup
// rule.
func retryNoResponders[T any](ctx context.Context, timeout time.Duration, fn func(context.Context) (T, error)) (T, error) {
	v, err := live.Retry(ctx, live.Policy{Interval: poll.Backoff(20*time.Millisecond, time.Second), Within: DaemonWait, Timeout: timeout}, fn)
	if err != nil && ctx.Err() != nil {
		return v, context.Cause(ctx)
	}
	return v, err
}

// ownerAsk bounds one ask of the owner for a session's sandbox, a lookup
// it answers at once: an ask or an answer lost on the bus (core NATS
// delivers at most once) is asked again well before a checkpoint's
// prepare gives up on the run that waits for it.
const ownerAsk = 5 * time.Second

// errOwnerUnanswered: the owner did not answer a request in time. A fault
// of the bus or of the owner, never the rollout's result: stages runs the
// stage again from its bookmark, which a checkpoint may park meanwhile (a
// lost owner is the controller's to recover from).
var errOwnerUnanswered = errors.New("agent: the owner does not answer")

// errReconnected: the connection reconnected while a request waited for
// its answer, which may then never come.
var errReconnected = errors.New("agent: the connection to NATS reconnected while the request waited")

// errAskAgain: a request waited every without an answer, which may have
// been lost with the callee's connection.
var errAskAgain = errors.New("agent: no answer yet; asking again")

// reconnectPoll is how often askingAgain looks at the connection.
const reconnectPoll = 250 * time.Millisecond

// askingAgain runs a long request (a grade may take an hour) and asks
// again when the connection reconnects while it waits, and every every
// (none when every is 0) while it has no answer. Core NATS delivers at
// most once: a request or its answer in flight when a connection broke is
// lost, and the request would otherwise wait out its whole timeout, hours
// for a grade. The caller sees its own connection reconnect; a loss with
// the callee's connection (a partition of the callee's node) only a
// repeat finds. The callee must take a repeated request: the owner's
// verify answers a repeat from the grade already asked (running, or
// answered within verifyKept), not with a second grade.
func askingAgain[T any](ctx context.Context, nc *nats.Conn, every time.Duration, fn func(context.Context) (T, error)) (T, error) {
	for {
		if nc == nil {
			return fn(ctx)
		}
		before := nc.Stats().Reconnects
		rctx, cancel := context.WithCancelCause(ctx)
		done := make(chan struct{})
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			t := time.NewTicker(reconnectPoll)
			defer t.Stop()
			var again <-chan time.Time
			if every > 0 {
				at := time.NewTimer(every)
				defer at.Stop()
				again = at.C
			}
			for {
				select {
				case <-done:
					return
				case <-again:
					cancel(errAskAgain)
					return
				case <-t.C:
					if nc.Stats().Reconnects != before && nc.IsConnected() {
						cancel(errReconnected)
						return
					}
				}
			}
		}()
		v, err := fn(rctx)
		close(done)
		<-watched
		// Asked again only when the cancel was askingAgain's and it is what
		// ended the request; an answer that came with it (a refusal too) is
		// the request's outcome.
		cause := context.Cause(rctx)
		ours := errors.Is(cause, errReconnected) || errors.Is(cause, errAskAgain)
		again := ours && ctx.Err() == nil && err != nil && (errors.Is(err, context.Canceled) || errors.Is(err, cause))
		cancel(nil)
		if !again {
			return v, err
		}
	}
}

// receiptGiveUp bounds how long a wait for a launch's end asks again a
// daemon that does not answer (restarting, or its sandbox gone) before the
// launch is given up.
const receiptGiveUp = 2 * time.Minute

// receiptRetry is how a wait for a launch's end asks the daemon again
// while it does not answer (noAnswer): a second apart, each wait bounded
// past the ReceiptWait the daemon holds it, for receiptGiveUp.
func (a *Agent) receiptRetry() live.Policy {
	return live.Policy{
		Interval: poll.Every(time.Second),
		Within:   receiptGiveUp,
		Timeout:  a.cfg.ReceiptWait + 10*time.Second,
		Again:    func(err error) bool { return errors.As(err, new(noAnswer)) },
	}
}

// noAnswer marks a wait for a launch's end that the daemon did not answer:
// one to ask again, for a while (receiptRetry).
type noAnswer struct{ err error }

func (n noAnswer) Error() string { return n.err.Error() }
