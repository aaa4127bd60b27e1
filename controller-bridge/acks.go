package bridge

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// ackMsg is a message on a phase's ack subjects, with its stream sequence.
type ackMsg struct {
	msg *nats.Msg
	seq uint64
}

// ackReader reads the acks of one phase event with an ordered consumer
// (those already recorded first) and, when asked, watches the heartbeats
// of the phase's members in the bridge's view of them, turning both into
// the machine's inputs.
type ackReader struct {
	b      *Bridge
	phase  events.Phase
	seq    uint64          // the phase's
	ctx    context.Context // ends when the reader closes
	cancel context.CancelFunc
	cc     natsjs.ConsumeContext
	live   *nats.Subscription // the daemons' prepare acks, when the ack feed could not hear them
	msgs   chan ackMsg

	watch *memberWatch         // nil without watching
	gone  <-chan machine.Input // MemberGone; nil without watching: never ready

	inboxSeq uint64 // the phase whose ack feed inbox msgs is, 0 for a consumer of its own

	// rec, of a prepare just published to sandbox daemons, notes their
	// acks for the stream's record (prepared.go); nil otherwise.
	rec *prepareRecord
}

// openAcks starts reading the acks of p. backlog is the stream sequence
// of the last ack already recorded, 0 if there is none (or p is fresh:
// just published, so none is from before). A phase with no members has
// nothing to read.
func (b *Bridge) openAcks(ctx context.Context, p events.PhaseEvent, watch, fresh bool) (r *ackReader, backlog uint64, err error) {
	h := p.Header()
	members, _ := h.Expected()
	if len(members) == 0 {
		if fresh {
			b.closeAckInbox(h.Seq)
		}
		return nil, 0, nil
	}
	filter := events.AckFilter(b.cfg.Run, h.Seq)
	if !fresh {
		// A phase read back (a replay): its acks recorded so far count
		// whatever the time, so the machine waits until it read them all.
		// A phase just published is gathered live: its acks come as they
		// are stored, and its deadline holds.
		// The leader's last: a replica behind it would end the backlog
		// short of acks the stream holds.
		if last, err := leaderLastMsg(ctx, b.cfg.Conn, jetstream.StreamName, filter); err == nil {
			backlog = last.Sequence
		} else if !errors.Is(err, natsjs.ErrMsgNotFound) {
			return nil, 0, fmt.Errorf("bridge: acks of seq %d: %w", h.Seq, err)
		}
	}
	gctx, cancel := context.WithCancel(ctx)
	r = &ackReader{b: b, phase: p.Phase(), seq: h.Seq, ctx: gctx, cancel: cancel, msgs: make(chan ackMsg, 256)}
	if fresh && watch && p.Phase() == events.PhasePrepare {
		r.rec = newPrepareRecord(h, members, b.cfg.Now())
	}
	// The reader as made here: a return with an error sets r to nil, and
	// both the close below and the consumer's handler, which may still
	// run until then, need it.
	rd := r
	defer func() {
		if err != nil {
			rd.close()
		}
	}()
	if fresh && b.feedAcks(r, h.Seq, gctx) {
		// Its inbox in the ack feed, opened before it was published.
		return r, 0, r.startWatch(gctx, watch, members)
	}
	if fresh && p.Phase() == events.PhasePrepare {
		// No inbox in the ack feed (it could not be made), so no core
		// subscription of the daemons' prepare acks either, which are not
		// stored: one of this phase's own hears them from now on, and a
		// silent daemon's probe asks for one sent before it again.
		sub, err := b.liveConn().Subscribe(events.LivePrefix+"."+b.cfg.Run+".ack."+strconv.FormatUint(h.Seq, 10)+"."+string(events.PhasePrepare)+".>",
			func(m *nats.Msg) {
				select {
				case rd.msgs <- ackMsg{msg: m}:
				case <-gctx.Done():
				}
			})
		if err != nil {
			return nil, 0, fmt.Errorf("bridge: the daemons' acks of seq %d: %w", h.Seq, err)
		}
		_ = sub.SetPendingLimits(-1, -1)
		r.live = sub
	}
	cons, err := b.cfg.JS.OrderedConsumer(gctx, jetstream.StreamName, natsjs.OrderedConsumerConfig{
		FilterSubjects: []string{filter}, DeliverPolicy: natsjs.DeliverAllPolicy})
	if err != nil {
		return nil, 0, fmt.Errorf("bridge: ack consumer for seq %d: %w", h.Seq, err)
	}
	r.cc, err = cons.Consume(func(m natsjs.Msg) {
		var seq uint64
		if md, err := m.Metadata(); err == nil {
			seq = md.Sequence.Stream
		}
		select {
		case rd.msgs <- ackMsg{&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}, seq}:
		case <-gctx.Done():
		}
	})
	if err != nil {
		return nil, 0, fmt.Errorf("bridge: consume acks of seq %d: %w", h.Seq, err)
	}
	return r, backlog, r.startWatch(gctx, watch, members)
}

// startWatch, when watch is set, watches the heartbeats of members: who is
// alive now (a member may have died between the member listing and the
// publish), then who dies while the phase runs.
func (r *ackReader) startWatch(ctx context.Context, watch bool, members []events.Member) error {
	if !watch {
		return nil
	}
	b := r.b
	v, err := b.view(ctx)
	if err != nil {
		return err
	}
	// The view, once it has read every heartbeat, says at once what it
	// reads later (a death since is told to the watch as it is read); a
	// view just started reads them all first.
	if !v.loaded() {
		if err := v.sync(ctx, b); err != nil {
			return err
		}
	}
	r.watch = v.watch(b.cfg.Run, members, b.cfg.Now())
	r.gone = r.watch.gone
	return nil
}

// close stops the consumer and the watcher.
func (r *ackReader) close() {
	if r == nil {
		return
	}
	r.cancel()
	if r.cc != nil {
		r.cc.Stop()
	}
	if r.live != nil {
		_ = r.live.Unsubscribe()
	}
	r.watch.close()
}

// ack decodes a message on the ack subjects; one that is not an ack is
// logged and still counts towards the backlog.
func (r *ackReader) ack(am ackMsg) machine.Input {
	_, d, err := events.Unmarshal(am.msg)
	if err != nil {
		r.b.log.Warn().Err(err).Str("subject", am.msg.Subject).Msg("refusing an ack")
		return machine.AckSeen{StreamSeq: am.seq}
	}
	ack, ok := d.(events.Ack)
	if !ok {
		r.b.log.Warn().Str("subject", am.msg.Subject).Str("type", string(d.Type())).Msg("refusing a non-ack on an ack subject")
		return machine.AckSeen{StreamSeq: am.seq}
	}
	r.b.countAck(ack)
	if r.rec != nil {
		r.rec.add(ack, r.b.cfg.Now())
	}
	return machine.AckSeen{Ack: ack, StreamSeq: am.seq}
}
