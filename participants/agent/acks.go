package agent

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/live"
)

// ackBook keeps the prepare acks of the run's sandbox daemons as they go
// by on the bus: the agent's readiness depends on them (PROTOCOL §5,
// readiness is a dependency graph). They travel on core NATS (PROTOCOL §3,
// acks): a subscription hears them as they are published, and one published
// before it looked, or missed, the daemon says again when asked on its
// alive subject with the prepare named (events.AliveQuery).
type ackBook struct {
	run string

	mu      sync.Mutex
	acks    map[ackKey]events.PrepareAck
	changed chan struct{}
	sub     *nats.Subscription
	prober  *live.Prober // asks a silent daemon whether it is there; nil before subscribe
}

type ackKey struct {
	seq     uint64
	sandbox string
}

func newAckBook(run string) *ackBook {
	return &ackBook{run: run, acks: map[ackKey]events.PrepareAck{}, changed: make(chan struct{})}
}

// subscribe starts the subscription to spl.<run>.ack.*.prepare.sandbox.*.
func (b *ackBook) subscribe(nc *nats.Conn) error {
	sub, err := nc.Subscribe(events.LivePrefix+"."+b.run+".ack.*."+string(events.PhasePrepare)+"."+string(events.KindSandbox)+".*", b.take)
	if err != nil {
		return err
	}
	b.sub = sub
	b.prober = &live.Prober{Conn: nc, Run: b.run, Every: probeEvery, Rounds: probeEvery}
	return nil
}

// take takes one message of the subscription: a daemon's prepare ack, a
// copy of one, or anything a workload published on its daemon's subjects.
func (b *ackBook) take(m *nats.Msg) {
	if b.heard(m.Subject) {
		return // a copy of an ack the book has: a flood of copies costs no decode
	}
	_, d, err := events.Unmarshal(m)
	if err != nil {
		return
	}
	if a, ok := d.(events.PrepareAck); ok {
		b.add(a)
	}
}

func (b *ackBook) close() {
	if b.sub != nil {
		_ = b.sub.Unsubscribe()
	}
}

// acksKept bounds the acks the book keeps of one sandbox, its newest
// prepares': far more than the prepares a run waits on at once.
const acksKept = 4

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
	// Forget the oldest acks of this sandbox beyond acksKept: by its own
	// sequences, not the run's, since a sandbox's workload can publish on
	// its daemon's ack subjects (its credentials), with any sequence, and
	// must not push another sandbox's acks out.
	var seqs []uint64
	for old := range b.acks {
		if old.sandbox == k.sandbox {
			seqs = append(seqs, old.seq)
		}
	}
	if len(seqs) > acksKept {
		slices.Sort(seqs)
		for _, s := range seqs[:len(seqs)-acksKept] {
			delete(b.acks, ackKey{s, k.sandbox})
		}
	}
}

// heard tells whether the book has the ack its subject,
// spl.<run>.ack.<seq>.prepare.sandbox.<name>, names: a sandbox's workload
// may publish on its daemon's ack subjects without end, and events.Unmarshal
// refuses an event on a subject not its own, so the subject alone tells a
// copy of an ack the book took.
func (b *ackBook) heard(subject string) bool {
	toks := strings.Split(subject, ".")
	if len(toks) != 7 {
		return false
	}
	seq, err := strconv.ParseUint(toks[3], 10, 64)
	if err != nil {
		return false
	}
	_, ok := b.lookup(seq, toks[6])
	return ok
}

// lookup returns the ack of sandbox to prepare seq, if the subscription
// heard it.
func (b *ackBook) lookup(seq uint64, sandbox string) (events.PrepareAck, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	a, ok := b.acks[ackKey{seq, sandbox}]
	return a, ok
}

// wait waits for the ack of sandbox to prepare seq until ctx ends, stop
// is closed (errReopened) or gone is (errDaemonGone: the daemon will
// never ack); the book is looked at again every poll.
func (b *ackBook) wait(ctx context.Context, seq uint64, sandbox string, stop, gone <-chan struct{}, poll time.Duration) (events.PrepareAck, error) {
	// A daemon's heartbeat lives minutes after it died (PROTOCOL §3,
	// Liveness): ask it, while its ack does not come, whether it is there,
	// and to say its ack again (one published before the subscription
	// looked, or missed on the way: core NATS delivers at most once).
	dead, stopProbe := b.probe(ctx, sandbox, events.AliveQuery{Seq: seq, Phase: events.PhasePrepare})
	defer stopProbe()
	for {
		b.mu.Lock()
		ch := b.changed
		b.mu.Unlock()
		if a, ok := b.lookup(seq, sandbox); ok {
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

// probe asks sandbox's daemon, every probeEvery until ctx ends or stop is
// called, whether it is there (live.Prober.Watch): the channel it returns
// is closed once the silence rule finds it gone, its connection gone and
// not coming back. Each request carries q: a daemon that answered that
// phase says its ack again, and answers with it, which the book takes.
func (b *ackBook) probe(ctx context.Context, sandbox string, q events.AliveQuery) (dead <-chan struct{}, stop func()) {
	m, err := events.NewMember(events.KindSandbox, sandbox)
	if b.prober == nil || err != nil {
		return make(chan struct{}), func() {}
	}
	return b.prober.Watch(ctx, m, q, func(reply *nats.Msg) { b.answered(m, q, reply) })
}

// answered takes the prepare ack that a daemon's answer to q carries, if it
// carries one (events.AliveQuery): heard on the asker's inbox, whatever
// floods the daemon's ack subject.
func (b *ackBook) answered(m events.Member, q events.AliveQuery, reply *nats.Msg) {
	if q.Seq == 0 || q.Phase != events.PhasePrepare || len(reply.Header) == 0 {
		return
	}
	msg := &nats.Msg{Subject: events.LiveAckSubject(b.run, q.Seq, events.PhasePrepare, m), Header: reply.Header, Data: reply.Data}
	if _, d, err := events.Unmarshal(msg); err == nil {
		if a, ok := d.(events.PrepareAck); ok && a.Seq == q.Seq {
			b.add(a)
		}
	}
}

// gone asks sandbox's daemon whether it is there until it answers or the
// silence rule finds it gone (live.Prober.Gone), and reports whether it
// is gone; not if ctx ends first.
func (b *ackBook) gone(ctx context.Context, sandbox string) bool {
	m, err := events.NewMember(events.KindSandbox, sandbox)
	if b.prober == nil || err != nil {
		return false
	}
	return b.prober.Gone(ctx, m)
}

// errReopened: the checkpoint resumed while a run waited on it.
var errReopened = errors.New("agent: the checkpoint resumed")

// errDaemonGone: the sandbox's daemon went while a run waited on its ack.
var errDaemonGone = errors.New("agent: the sandbox's daemon is gone")
