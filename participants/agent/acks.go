package agent

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
)

// ackBook keeps the prepare acks of the run's sandbox daemons as they go
// by on the bus: the agent's readiness depends on them (PROTOCOL §5,
// readiness is a dependency graph). A subscription sees them as they are
// published; a direct read of the stream finds one published before it.
type ackBook struct {
	run    string
	stream natsjs.Stream

	mu      sync.Mutex
	acks    map[ackKey]events.PrepareAck
	changed chan struct{}
	sub     *nats.Subscription
	nc      *nats.Conn // asks a silent daemon whether it is there
}

type ackKey struct {
	seq     uint64
	sandbox string
}

func newAckBook(run string, stream natsjs.Stream) *ackBook {
	return &ackBook{run: run, stream: stream, acks: map[ackKey]events.PrepareAck{}, changed: make(chan struct{})}
}

// subscribe starts the subscription to sp.<run>.ack.*.prepare.sandbox.*.
func (b *ackBook) subscribe(nc *nats.Conn) error {
	sub, err := nc.Subscribe("sp."+b.run+".ack.*."+string(events.PhasePrepare)+"."+string(events.KindSandbox)+".*", func(m *nats.Msg) {
		_, d, err := events.Unmarshal(m)
		if err != nil {
			return
		}
		if a, ok := d.(events.PrepareAck); ok {
			b.add(a)
		}
	})
	if err != nil {
		return err
	}
	b.sub, b.nc = sub, nc
	return nil
}

func (b *ackBook) close() {
	if b.sub != nil {
		_ = b.sub.Unsubscribe()
	}
}

func (b *ackBook) add(a events.PrepareAck) {
	if a.Member.Kind() != events.KindSandbox {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	k := ackKey{a.Seq, a.Member.Name()}
	if _, ok := b.acks[k]; ok {
		return
	}
	b.acks[k] = a
	close(b.changed)
	b.changed = make(chan struct{})
	// Prepare sequences only grow: forget acks far behind this one.
	for old := range b.acks {
		if old.seq+64 < a.Seq {
			delete(b.acks, old)
		}
	}
}

// lookup returns the ack of sandbox to prepare seq, reading the stream if
// the subscription has not seen it.
func (b *ackBook) lookup(ctx context.Context, seq uint64, sandbox string) (events.PrepareAck, bool) {
	b.mu.Lock()
	a, ok := b.acks[ackKey{seq, sandbox}]
	b.mu.Unlock()
	if ok {
		return a, true
	}
	m, err := events.NewMember(events.KindSandbox, sandbox)
	if err != nil {
		return a, false
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	raw, err := b.stream.GetLastMsgForSubject(rctx, events.AckSubject(b.run, seq, events.PhasePrepare, m))
	if err != nil {
		return a, false
	}
	_, d, err := events.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
	if err != nil {
		return a, false
	}
	if a, ok = d.(events.PrepareAck); ok {
		b.add(a)
	}
	return a, ok
}

// wait waits for the ack of sandbox to prepare seq until ctx ends, stop
// is closed (errReopened) or gone is (errDaemonGone: the daemon will
// never ack); the stream is read again every poll in case a message went
// by unseen.
func (b *ackBook) wait(ctx context.Context, seq uint64, sandbox string, stop, gone <-chan struct{}, poll time.Duration) (events.PrepareAck, error) {
	// A daemon's heartbeat lives minutes after it died (PROTOCOL §3,
	// Liveness): ask it, while its ack does not come, whether it is there.
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	dead := b.probe(pctx, sandbox)
	for {
		b.mu.Lock()
		ch := b.changed
		b.mu.Unlock()
		if a, ok := b.lookup(ctx, seq, sandbox); ok {
			return a, nil
		}
		select {
		case <-ch:
		case <-time.After(poll):
		case <-stop:
			return events.PrepareAck{}, errReopened
		case <-gone:
			return events.PrepareAck{}, errDaemonGone
		case <-dead:
			return events.PrepareAck{}, errDaemonGone
		case <-ctx.Done():
			return events.PrepareAck{}, context.Cause(ctx)
		}
	}
}

// probeEvery is how often a wait for a daemon's prepare ack asks the daemon
// whether it is there, the first time probeEvery in.
const probeEvery = time.Second

// probe asks sandbox's daemon, every probeEvery until ctx ends, whether it
// is there (events.AliveSubject): the channel it returns is closed once
// the requests have found no responder for events.AliveUnanswered, the
// daemon's connection gone and not coming back (one such answer may be a
// daemon reconnecting). A request that times out proves nothing.
func (b *ackBook) probe(ctx context.Context, sandbox string) <-chan struct{} {
	dead := make(chan struct{})
	if _, err := events.NewMember(events.KindSandbox, sandbox); b.nc == nil || err != nil {
		return dead
	}
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(probeEvery):
			}
			// Each answer starts the unanswered time again.
			if !b.answers(ctx, sandbox) {
				close(dead)
				return
			}
		}
	}()
	return dead
}

// answers asks sandbox's daemon whether it is there (events.AliveSubject)
// at once and then every probeEvery, until it answers (true), or requests
// have found no responder for events.AliveUnanswered (false: gone), or ctx
// ends (true: nothing proved it gone). A request that times out proves
// nothing.
func (b *ackBook) answers(ctx context.Context, sandbox string) bool {
	m, err := events.NewMember(events.KindSandbox, sandbox)
	if b.nc == nil || err != nil {
		return true
	}
	var unanswered time.Time
	for {
		rctx, cancel := context.WithTimeout(ctx, probeEvery)
		_, err := b.nc.RequestWithContext(rctx, events.AliveSubject(b.run, m), nil)
		cancel()
		switch {
		case err == nil:
			return true
		case !errors.Is(err, nats.ErrNoResponders):
		case unanswered.IsZero():
			unanswered = time.Now()
		case time.Since(unanswered) >= events.AliveUnanswered:
			return false
		}
		select {
		case <-ctx.Done():
			return true
		case <-time.After(probeEvery):
		}
	}
}

// errReopened: the checkpoint resumed while a run waited on it.
var errReopened = errors.New("agent: the checkpoint resumed")

// errDaemonGone: the sandbox's daemon went while a run waited on its ack.
var errDaemonGone = errors.New("agent: the sandbox's daemon is gone")
