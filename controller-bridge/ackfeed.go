package bridge

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/live"
)

// ackFeed is the bridge's one ordered consumer of its run's stored acks
// (sp.<run>.ack.>), made before the first phase it gathers live and read
// for the bridge's life. Each phase just published is gathered from it:
// the inbox of its sequence is opened before the phase is published, so
// that every ack of it comes after, and the feed hands each ack to the
// inbox its subject names (live.Inboxes). One consumer for the bridge's life keeps a
// consumer's creation, a round trip through a busy server, off the path
// between a phase's publish and its first ack. A phase read back by a replay still reads its own acks, from the first
// (openAcks).
//
// The sandbox daemons' acks are not stored (PROTOCOL §3, acks): the inbox
// of a phase that addresses daemons also hears them, on a core-NATS
// subscription of that phase's daemon ack subjects alone
// (spl.<run>.ack.<seq>.<phase>.sandbox.*) on the bridge's live connection,
// made with the inbox and ended with it, through a gate (liveGate) that
// takes each daemon's first valid ack. A daemon's credentials may publish
// on its ack subjects at will: what the bridge hears of them is bounded to
// the phases it waits for, and what it reads of them to the gate's.
type ackFeed struct {
	mu    sync.Mutex // the consumer's making and ending
	cc    natsjs.ConsumeContext
	inbox live.Inboxes[*ackInbox] // Spare 0: an inbox no gathering took goes with the next phase's
}

// ackFeedTimeout bounds the making of the feed: a phase publish does not
// wait longer for it (its acks are then read as a replay reads them).
const ackFeedTimeout = 2 * time.Second

// ackInbox is the acks of one phase, as the feed reads them.
type ackInbox struct {
	msgs chan ackMsg
	done chan struct{} // closed when the gathering no longer reads
	// live hears the phase's daemon acks through gate; nil when the
	// phase addresses no sandbox daemon.
	live *nats.Subscription
	gate *liveGate
}

// addressesDaemons tells whether phase h addresses sandbox daemons: by a
// roster, or by name (a phase of an older build).
func addressesDaemons(h events.PhaseHeader) bool {
	return h.Sandboxes != nil || slices.ContainsFunc(h.Members, func(m events.Member) bool { return m.Kind() == events.KindSandbox })
}

// openAckInbox starts the feed if it is not running and opens the inbox of
// phase p, with its subscription of the daemons' acks if p addresses
// daemons: call it before p is published. An inbox of an earlier phase
// that no gathering took (its operation ended first) would fill up and
// hold the feed: it goes.
func (b *Bridge) openAckInbox(ctx context.Context, p events.PhaseEvent) error {
	h := p.Header()
	ctx, cancel := context.WithTimeout(ctx, ackFeedTimeout)
	defer cancel()
	if err := b.startAckFeed(ctx); err != nil {
		return err
	}
	return b.acks.inbox.Open(h.Seq, func() (*ackInbox, error) {
		in := &ackInbox{msgs: make(chan ackMsg, 1024), done: make(chan struct{})}
		if addressesDaemons(h) {
			if err := b.hearDaemonAcks(ctx, in, p); err != nil {
				return nil, err
			}
		}
		return in, nil
	})
}

// startAckFeed starts the feed if it is not running.
func (b *Bridge) startAckFeed(ctx context.Context) error {
	f := &b.acks
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.cc != nil {
		return nil
	}
	// From the stream's end as it is now, by sequence: an ordered
	// consumer made again before it delivered anything starts from there
	// again, where one delivering new messages would start from its new
	// end, past the acks stored meanwhile.
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
	cc, err := cons.Consume(b.heardAck, natsjs.ConsumeErrHandler(func(_ natsjs.ConsumeContext, err error) {
		b.log.Debug().Err(err).Msg("the ack feed")
	}))
	if err != nil {
		return fmt.Errorf("bridge: the ack feed: %w", err)
	}
	f.cc = cc
	return nil
}

// hearDaemonAcks subscribes in to the sandbox daemons' acks of phase p on
// core NATS, on the live connection, as the resume acks: a fleet's acks at
// once on the bridge's own would queue the answers to what it asks next
// behind them. The subscription is in place at the server when it
// returns, before p is published: no ack comes before it.
func (b *Bridge) hearDaemonAcks(ctx context.Context, in *ackInbox, p events.PhaseEvent) error {
	gate := newLiveGate(b.cfg.Run, p.Phase(), p.Header(), b.log)
	sub, err := live.Listen(ctx, b.liveConn(), gate.filter(events.KindSandbox), func(m *nats.Msg) {
		ack, ev := gate.admit(m)
		if ack == nil {
			return
		}
		select {
		case in.msgs <- ackMsg{msg: m, ack: ack, ev: &ev}:
		case <-in.done:
		}
	}, liveAcksPendingMsgs, liveAcksPendingBytes)
	if err != nil {
		return fmt.Errorf("bridge: the ack feed: the daemons' acks of %s seq %d: %w", p.Phase(), p.Header().Seq, err)
	}
	in.live, in.gate = sub, gate
	return nil
}

// Close ends the inbox: the gathering no longer reads, and the daemons'
// acks are no longer heard.
func (in *ackInbox) Close() {
	close(in.done)
	if in.live != nil {
		_ = in.live.Unsubscribe()
		in.gate.report()
	}
}

// closeAckInbox ends the inbox of phase seq: the feed drops its acks from
// now on.
func (b *Bridge) closeAckInbox(seq uint64) { b.acks.inbox.Close(seq) }

// stopAckFeed ends the feed (Run is ending); a later phase starts another.
func (b *Bridge) stopAckFeed() {
	f := &b.acks
	f.mu.Lock()
	cc := f.cc
	f.cc = nil
	f.mu.Unlock()
	f.inbox.CloseAll()
	if cc != nil {
		cc.Stop()
	}
}

// heardAck runs on the feed's goroutine: it files m in the inbox of the
// phase its subject names (sp.<run>.ack.<seq>.<phase>.<member>), waiting
// while the inbox is full and open; an ack of a phase with no inbox open
// is dropped.
func (b *Bridge) heardAck(m natsjs.Msg) {
	var streamSeq uint64
	if md, err := m.Metadata(); err == nil {
		streamSeq = md.Sequence.Stream
	}
	rest, ok := strings.CutPrefix(m.Subject(), events.SubjectPrefix+"."+b.cfg.Run+".ack.")
	if !ok {
		return
	}
	seqText, _, _ := strings.Cut(rest, ".")
	seq, err := strconv.ParseUint(seqText, 10, 64)
	if err != nil {
		return
	}
	in, ok := b.acks.inbox.File(seq)
	if !ok {
		return
	}
	select {
	case in.msgs <- ackMsg{msg: &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}, seq: streamSeq}:
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
	in, ok := b.acks.inbox.Take(seq)
	if !ok {
		return false
	}
	r.msgs, r.gate = in.msgs, in.gate
	r.inboxSeq = seq
	context.AfterFunc(ctx, func() { b.closeAckInbox(seq) })
	return true
}
