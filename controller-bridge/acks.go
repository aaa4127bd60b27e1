package bridge

import (
	"context"
	"errors"
	"fmt"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// ackMsg is a message on a phase's ack subjects, with its stream sequence
// (0: heard on core NATS). One a gate took (liveGate) comes decoded, with
// its event.
type ackMsg struct {
	msg *nats.Msg
	seq uint64
	ack events.Ack
	ev  *cloudevent.Event
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
	live   *nats.Subscription // the daemons' acks, when the ack feed does not hear them
	gate   *liveGate          // live's
	msgs   chan ackMsg
	// records stores the daemons' acks heard on core NATS whose phase
	// keeps them in the stream (events.AckRecorded).
	records ackRecords

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
		if last, err := jetstream.LeaderLastMsg(ctx, b.cfg.Conn, jetstream.StreamName, filter); err == nil {
			backlog = last.Sequence
		} else if !errors.Is(err, natsjs.ErrMsgNotFound) {
			return nil, 0, fmt.Errorf("bridge: acks of seq %d: %w", h.Seq, err)
		}
	}
	gctx, cancel := context.WithCancel(ctx)
	r = &ackReader{b: b, phase: p.Phase(), seq: h.Seq, ctx: gctx, cancel: cancel, msgs: make(chan ackMsg, 256),
		records: ackRecords{js: b.cfg.JS, ctx: ctx, log: b.log.With().Str("phase", string(p.Phase())).Uint64("seq", h.Seq).Logger()}}
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
	if addressesDaemons(h) {
		// No inbox in the ack feed (a replay, or a feed that could not be
		// made), so no core subscription of the daemons' acks either,
		// which travel on core NATS: one of this phase's own hears them
		// from now on, through its gate, and a silent daemon's probe asks
		// for one sent before it again (one the bridge recorded is read
		// below too).
		gate := newLiveGate(b.cfg.Run, p.Phase(), h, b.log)
		sub, err := b.liveConn().Subscribe(gate.filter(events.KindSandbox), func(m *nats.Msg) {
			ack, ev := gate.admit(m)
			if ack == nil {
				return
			}
			select {
			case rd.msgs <- ackMsg{msg: m, ack: ack, ev: &ev}:
			case <-gctx.Done():
			}
		})
		if err != nil {
			return nil, 0, fmt.Errorf("bridge: the daemons' acks of seq %d: %w", h.Seq, err)
		}
		_ = sub.SetPendingLimits(liveAcksPendingMsgs, liveAcksPendingBytes)
		r.live, r.gate = sub, gate
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
		case rd.msgs <- ackMsg{msg: &nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}, seq: seq}:
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
		r.gate.report()
	}
	r.records.close()
	r.watch.close()
}

// asked takes the answer of member m to a probe of this phase
// (events.AliveQuery): the ack m keeps of it, if the gate takes it
// (liveGate.admitAsked). It runs on the probe's goroutine.
func (r *ackReader) asked(m events.Member, reply *nats.Msg) {
	if r.gate == nil || len(reply.Header) == 0 {
		return
	}
	ack, ev := r.gate.admitAsked(m, reply)
	if ack == nil {
		return
	}
	select {
	case r.msgs <- ackMsg{msg: reply, ack: ack, ev: &ev}:
	case <-r.ctx.Done():
	}
}

// ack decodes a message on the ack subjects (one a gate took is decoded
// already); one that is not an ack is logged and still counts towards the
// backlog. A sandbox daemon's ack heard on core NATS is recorded in the
// stream if its phase keeps acks there (ackRecords).
func (r *ackReader) ack(am ackMsg) machine.Input {
	ack := am.ack
	if ack == nil {
		_, d, err := events.Unmarshal(am.msg)
		if err != nil {
			r.b.log.Warn().Err(err).Str("subject", am.msg.Subject).Msg("refusing an ack")
			return machine.AckSeen{StreamSeq: am.seq}
		}
		var ok bool
		if ack, ok = d.(events.Ack); !ok {
			r.b.log.Warn().Str("subject", am.msg.Subject).Str("type", string(d.Type())).Msg("refusing a non-ack on an ack subject")
			return machine.AckSeen{StreamSeq: am.seq}
		}
	}
	if am.ev != nil && events.AckRecorded(r.phase, ack.Header().Member) {
		r.records.add(*am.ev, ack)
	}
	r.b.countAck(ack)
	if r.rec != nil {
		r.rec.add(ack, r.b.cfg.Now())
	}
	return machine.AckSeen{Ack: ack, StreamSeq: am.seq}
}
