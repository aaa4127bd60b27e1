package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
)

// errSandboxLost ends an attempt whose sandbox is lost: its daemon's
// heartbeat went (the daemon died, and with it the sandbox's init and
// every launch in it), or the owner no longer has the session (it
// restarted without it). Nothing of the attempt can go on there: the
// controller retires it and starts the rollout over one attempt later
// (agentapi.CodeSandboxLost).
var errSandboxLost = errors.New("agent: the attempt's sandbox is lost")

// daemonBook follows the heartbeats of the run's sandbox daemons in
// sp_daemons (jetstream.BucketDaemons), as the bridge does for a phase's
// members: a daemon whose key was deleted (the owner stopped its sandbox)
// or expired (it died and stopped heartbeating) is gone, and a launch there
// is lost. An expired key leaves no marker in that bucket: the book takes a
// daemon for gone once the bucket's TTL has passed since the server stored
// its last heartbeat. A daemon never seen is not gone: a sandbox just lent
// starts its daemon in the background.
type daemonBook struct {
	run string
	now func() time.Time

	mu      sync.Mutex
	gone    map[string]bool          // by sandbox id: its last entry was a delete or purge, or expired
	stored  map[string]time.Time     // by sandbox id: when the server stored its last heartbeat
	ttl     time.Duration            // a heartbeat's life in the bucket (jetstream.HeartbeatTTL)
	changed map[string]chan struct{} // by sandbox id: closed when it goes
	watcher natsjs.KeyWatcher
	// scoped: the connection has a member's own credentials, which may not
	// delete a watch's consumer of the daemons bucket (docs/PERMISSIONS.md):
	// close then leaves the watch to end with the connection.
	scoped bool
	quit   chan struct{}
	done   chan struct{}
}

func newDaemonBook(run string) *daemonBook {
	return &daemonBook{run: run, now: time.Now, gone: map[string]bool{}, stored: map[string]time.Time{},
		ttl: jetstream.DefaultSandboxTTL, changed: map[string]chan struct{}{}}
}

// sweepEvery is how often the book looks for heartbeats that expired: an
// eighth of their TTL, between a second and 15 s. A daemon that died is
// found sooner by asking it (Agent.daemonDied); this is for the one no
// call asked.
func sweepEvery(ttl time.Duration) time.Duration {
	return min(max(ttl/8, time.Second), 15*time.Second)
}

// watch starts the watch of the run's daemon keys; its goroutine ends
// with ctx or close, and close waits for it.
func (b *daemonBook) watch(ctx context.Context, bus *jetstream.Bus, scoped bool) error {
	st, err := bus.Daemons.Status(ctx)
	if err != nil {
		return err
	}
	b.mu.Lock()
	b.ttl = jetstream.HeartbeatTTL(st)
	b.mu.Unlock()
	wctx := ctx
	if scoped {
		// A watch made with ctx is stopped, its consumer deleted, when ctx
		// ends: see close.
		wctx = context.WithoutCancel(ctx)
	}
	w, err := bus.Daemons.Watch(wctx, events.MemberKeyFilter(b.run))
	if err != nil {
		return err
	}
	b.watcher, b.scoped, b.quit, b.done = w, scoped, make(chan struct{}), make(chan struct{})
	go func() {
		defer close(b.done)
		sweep := time.NewTicker(sweepEvery(b.ttl))
		defer sweep.Stop()
		prefix := b.run + "." + string(events.KindSandbox) + "."
		for {
			var (
				e  natsjs.KeyValueEntry
				ok bool
			)
			select {
			case <-ctx.Done():
				return
			case <-b.quit:
				return
			case <-sweep.C:
				b.sweep()
				continue
			case e, ok = <-w.Updates():
			}
			if !ok {
				return
			}
			if e == nil {
				continue
			}
			id, isDaemon := strings.CutPrefix(e.Key(), prefix)
			if !isDaemon {
				continue
			}
			b.heard(id, e.Operation() != natsjs.KeyValuePut, e.Created())
		}
	}()
	return nil
}

// close ends the watch's goroutine and waits for it. It stops the watch
// (which deletes its consumer) unless the connection has a member's own
// credentials: those may not delete a consumer of the daemons bucket, so
// that no member can delete another client's watch, and the server removes
// this one once the connection closes, as the agent's process ends.
func (b *daemonBook) close() {
	if b.watcher == nil {
		return
	}
	if !b.scoped {
		_ = b.watcher.Stop()
	}
	close(b.quit)
	<-b.done
}

// heard records an entry of sandbox id's key, stored at stored: a
// heartbeat, or a delete (removed). A heartbeat that has expired already
// (one read back when the watch started) is taken as gone.
func (b *daemonBook) heard(id string, removed bool, stored time.Time) {
	b.mu.Lock()
	expired := !removed && jetstream.HeartbeatExpired(stored, b.ttl, b.now())
	if removed {
		delete(b.stored, id)
	} else {
		b.stored[id] = stored
	}
	b.mu.Unlock()
	b.set(id, removed || expired)
}

// sweep takes every daemon whose last heartbeat has expired for gone.
func (b *daemonBook) sweep() {
	b.mu.Lock()
	now := b.now()
	var expired []string
	for id, at := range b.stored {
		if !b.gone[id] && jetstream.HeartbeatExpired(at, b.ttl, now) {
			expired = append(expired, id)
		}
	}
	b.mu.Unlock()
	for _, id := range expired {
		b.set(id, true)
	}
}

// set records whether sandbox id's daemon is gone.
func (b *daemonBook) set(id string, gone bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	was := b.gone[id]
	switch {
	case gone && !was:
		b.gone[id] = true
		if ch, ok := b.changed[id]; ok {
			close(ch)
			delete(b.changed, id)
		}
	case !gone && was:
		// A daemon of that id heartbeats again (a microVM fork's daemon
		// re-identified in place).
		delete(b.gone, id)
	}
}

// isGone tells whether sandbox id's daemon is gone.
func (b *daemonBook) isGone(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.gone[id]
}

// goneCh returns a channel closed once sandbox id's daemon goes (closed
// already if it is gone).
func (b *daemonBook) goneCh(id string) <-chan struct{} {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.gone[id] {
		ch := make(chan struct{})
		close(ch)
		return ch
	}
	ch, ok := b.changed[id]
	if !ok {
		ch = make(chan struct{})
		b.changed[id] = ch
	}
	return ch
}

// lostOr returns err, as errSandboxLost when what failed the stage is the
// sandbox itself: its daemon's heartbeat went (the stage failed on a call
// to it: a stop, a resume decision's command), its daemon never answered
// within DaemonWait (a fork's daemon killed before it registered), or its
// init exited. A cancelled run keeps its cause.
func (a *Agent) lostOr(r *run, bm agentapi.Bookmark, err error) error {
	if errors.Is(err, errSandboxLost) || r.ctx.Err() != nil || (bm.Next != agentapi.StageLaunch && bm.Next != agentapi.StageVerify) {
		return err
	}
	a.mu.Lock()
	sandbox := cmp.Or(r.sandbox, bm.Sandbox)
	a.mu.Unlock()
	switch {
	case sandbox != "" && a.daemons.isGone(sandbox):
		return fmt.Errorf("%w: the daemon of sandbox %s is gone: %w", errSandboxLost, sandbox, err)
	case bm.Next == agentapi.StageLaunch && errors.Is(err, nats.ErrNoResponders):
		return fmt.Errorf("%w: the daemon of sandbox %s never answered: %w", errSandboxLost, sandbox, err)
	case isCode(err, codeOwnerSandboxExited):
		return fmt.Errorf("%w: %w", errSandboxLost, err)
	case sandbox != "" && unanswered(err) && a.daemonDied(r.ctx, sandbox):
		return fmt.Errorf("%w: the daemon of sandbox %s does not answer: %w", errSandboxLost, sandbox, err)
	}
	return err
}

// unanswered tells a call that failed for want of an answer: it timed out,
// found no responder, or lost its connection. One that the daemon answered
// with an error proves the daemon alive.
func unanswered(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrConnectionClosed)
}

// busUnanswered tells a write to a JetStream store that failed for want
// of an answer (unanswered, or the stream's: no ack, an ack that timed
// out, the write of an earlier attempt still in process): one that may be
// made again once the bus answers.
func busUnanswered(err error) bool {
	return unanswered(err) || errors.Is(err, natsjs.ErrNoStreamResponse) || errors.Is(err, natsjs.ErrAsyncPublishTimeout) ||
		jetstream.IsDuplicateInProcess(err)
}

// daemonDied asks sandbox's daemon whether it is there until it answers
// or the silence rule finds it gone (ackBook.gone), and reports whether it
// is gone; one found gone is gone for the book too. One whose ctx ends
// first is not found gone. A call that found no answer may be one the
// daemon died under, and its heartbeat outlives it (a sandbox daemon's
// lives 2 minutes: PROTOCOL §3, Liveness): asking lets such a run start
// over in a new sandbox rather than fail as a whole.
func (a *Agent) daemonDied(ctx context.Context, sandbox string) bool {
	if a.daemons.isGone(sandbox) {
		return true
	}
	if a.acks == nil || !a.acks.gone(ctx, sandbox) {
		return false // alive, or the asker gave up first: nothing learnt
	}
	a.daemons.set(sandbox, true)
	return true
}
