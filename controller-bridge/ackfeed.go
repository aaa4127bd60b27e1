package bridge

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// ackFeed is the bridge's one ordered consumer of its run's stored acks
// (sp.<run>.ack.>), made before the first phase it gathers live and read
// for the bridge's life. Each phase just published is gathered from it:
// the inbox of its sequence is opened before the phase is published, so
// that every ack of it comes after, and the feed hands each ack to the
// inbox its subject names. A consumer made for each phase put its creation,
// a round trip through a busy server (170 ms at 1,000 members on one node),
// on the path of every phase, between its publish and its first ack read.
// A phase read back by a replay still reads its own acks, from the first
// (openAcks).
//
// The sandbox daemons' prepare acks are not stored (PROTOCOL §3, acks):
// the feed hears them on a core-NATS subscription of the bridge's live
// connection, made with the consumer, and hands them to the same inboxes.
type ackFeed struct {
	mu    sync.Mutex
	cc    natsjs.ConsumeContext
	live  *nats.Subscription // spl.<run>.ack.*.prepare.>
	inbox map[uint64]*ackInbox
}

// ackFeedTimeout bounds the making of the feed: a phase publish does not
// wait longer for it (its acks are then read as a replay reads them).
const ackFeedTimeout = 2 * time.Second

// ackInbox is the acks of one phase, as the feed reads them.
type ackInbox struct {
	msgs  chan ackMsg
	done  chan struct{} // closed when the gathering no longer reads
	taken bool          // a gathering reads it
}

// openAckInbox starts the feed if it is not running and opens the inbox of
// phase seq: call it before the phase is published.
func (b *Bridge) openAckInbox(ctx context.Context, seq uint64) error {
	f := &b.acks
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cc == nil {
		ctx, cancel := context.WithTimeout(ctx, ackFeedTimeout)
		defer cancel()
		// From the stream's end as it is now, by sequence: an ordered
		// consumer made again before it delivered anything starts from
		// there again, where one delivering new messages would start from
		// its new end, past the acks stored meanwhile.
		info, err := b.cfg.Bus.Stream.Info(ctx)
		if err != nil {
			return fmt.Errorf("bridge: the ack feed: %w", err)
		}
		cons, err := b.cfg.JS.OrderedConsumer(ctx, jetstream.StreamName, natsjs.OrderedConsumerConfig{
			FilterSubjects: []string{events.SubjectPrefix + "." + b.cfg.Run + ".ack.>"},
			DeliverPolicy:  natsjs.DeliverByStartSequencePolicy, OptStartSeq: info.State.LastSeq + 1})
		if err != nil {
			return fmt.Errorf("bridge: the ack feed: %w", err)
		}
		// On the live connection, as the resume acks: a fleet's acks at
		// once on the bridge's own would queue the answers to what it asks
		// next behind them. Subscribed before any phase it serves is
		// published: no ack comes before it.
		nc := b.liveConn()
		live, err := nc.Subscribe(events.LiveAckFilter(b.cfg.Run, events.PhasePrepare), b.heardLiveAck)
		if err == nil {
			_ = live.SetPendingLimits(-1, -1)
			if err = nc.FlushWithContext(ctx); err != nil {
				_ = live.Unsubscribe()
			}
		}
		if err != nil {
			return fmt.Errorf("bridge: the ack feed: subscribe to the prepare acks on core NATS: %w", err)
		}
		cc, err := cons.Consume(b.heardAck, natsjs.ConsumeErrHandler(func(_ natsjs.ConsumeContext, err error) {
			b.log.Debug().Err(err).Msg("the ack feed")
		}))
		if err != nil {
			_ = live.Unsubscribe()
			return fmt.Errorf("bridge: the ack feed: %w", err)
		}
		f.cc, f.live, f.inbox = cc, live, map[uint64]*ackInbox{}
	}
	if _, ok := f.inbox[seq]; !ok {
		f.inbox[seq] = &ackInbox{msgs: make(chan ackMsg, 1024), done: make(chan struct{})}
	}
	// An inbox of an earlier phase that no gathering took (its operation
	// ended first) would fill up and hold the feed: it goes.
	for s, in := range f.inbox {
		if s < seq && !in.taken {
			close(in.done)
			delete(f.inbox, s)
		}
	}
	return nil
}

// takeAckInbox returns the inbox of phase seq, nil if none is open.
func (b *Bridge) takeAckInbox(seq uint64) *ackInbox {
	f := &b.acks
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inbox[seq]
}

// closeAckInbox ends the inbox of phase seq: the feed drops its acks from
// now on.
func (b *Bridge) closeAckInbox(seq uint64) {
	f := &b.acks
	f.mu.Lock()
	in := f.inbox[seq]
	delete(f.inbox, seq)
	f.mu.Unlock()
	if in != nil {
		close(in.done)
	}
}

// stopAckFeed ends the feed (Run is ending); a later phase starts another.
func (b *Bridge) stopAckFeed() {
	f := &b.acks
	f.mu.Lock()
	cc, live := f.cc, f.live
	f.cc, f.live = nil, nil
	for seq, in := range f.inbox {
		close(in.done)
		delete(f.inbox, seq)
	}
	f.mu.Unlock()
	if cc != nil {
		cc.Stop()
	}
	if live != nil {
		_ = live.Unsubscribe()
	}
}

// heardAck runs on the feed's goroutine: it hands m to the inbox of the
// phase its subject names (sp.<run>.ack.<seq>.<phase>.<member>).
func (b *Bridge) heardAck(m natsjs.Msg) {
	var streamSeq uint64
	if md, err := m.Metadata(); err == nil {
		streamSeq = md.Sequence.Stream
	}
	b.fileAck(events.SubjectPrefix, &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}, streamSeq)
}

// heardLiveAck runs on the core subscription's goroutine: it hands m, a
// sandbox daemon's prepare ack (spl.<run>.ack.<seq>.prepare.<member>), to
// the inbox of its phase. It has no stream sequence.
func (b *Bridge) heardLiveAck(m *nats.Msg) {
	b.fileAck(events.LivePrefix, m, 0)
}

// fileAck hands m, on prefix.<run>.ack.<seq>.<phase>.<member>, to the
// inbox of phase seq, waiting while the inbox is full and open; an ack of
// a phase with no inbox open is dropped.
func (b *Bridge) fileAck(prefix string, m *nats.Msg, streamSeq uint64) {
	rest, ok := strings.CutPrefix(m.Subject, prefix+"."+b.cfg.Run+".ack.")
	if !ok {
		return
	}
	seqText, _, _ := strings.Cut(rest, ".")
	seq, err := strconv.ParseUint(seqText, 10, 64)
	if err != nil {
		return
	}
	in := b.takeAckInbox(seq)
	if in == nil {
		return
	}
	select {
	case in.msgs <- ackMsg{msg: m, seq: streamSeq}:
	case <-in.done:
	}
}

// gathersLive tells whether the machine gathers phase p's acks once it is
// published (the bridge then opens its inbox in the ack feed first): every
// phase but renew, which is not answered, and resume, whose acks come on
// core NATS (resume.go).
func gathersLive(p events.Phase) bool {
	return p != events.PhaseRenew && p != events.PhaseResume
}

// feedAcks makes r read phase seq's acks from the ack feed's inbox, and
// reports false when no inbox was opened for it.
func (b *Bridge) feedAcks(r *ackReader, seq uint64, ctx context.Context) bool {
	f := &b.acks
	f.mu.Lock()
	in := f.inbox[seq]
	if in != nil {
		in.taken = true
	}
	f.mu.Unlock()
	if in == nil {
		return false
	}
	r.msgs = in.msgs
	r.inboxSeq = seq
	context.AfterFunc(ctx, func() { b.closeAckInbox(seq) })
	return true
}
