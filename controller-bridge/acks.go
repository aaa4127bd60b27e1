package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

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

// kvUpdate is a heartbeat change; nil marks the end of the initial values.
type kvUpdate = natsjs.KeyValueEntry

// ackReader reads the acks of one phase event with an ordered consumer
// (those already recorded first) and, when asked, watches the heartbeats
// of the phase's members, turning both into the machine's inputs.
type ackReader struct {
	b      *Bridge
	phase  events.Phase
	cancel context.CancelFunc
	cc     natsjs.ConsumeContext
	msgs   chan ackMsg

	watcher  natsjs.KeyWatcher // nil without watching
	updates  <-chan kvUpdate   // nil without watching: never ready
	memberOf map[string]events.Member
	alive    map[string]bool
	instance map[string]string
	initial  bool
}

// openAcks starts reading the acks of p. backlog is the stream sequence
// of the last ack already recorded, 0 if there is none. A phase with no
// members has nothing to read.
func (b *Bridge) openAcks(ctx context.Context, p events.PhaseEvent, watch bool) (r *ackReader, backlog uint64, err error) {
	h := p.Header()
	if len(h.Members) == 0 {
		return nil, 0, nil
	}
	filter := events.AckFilter(b.cfg.Run, h.Seq)
	if last, err := b.cfg.Bus.Stream.GetLastMsgForSubject(ctx, filter); err == nil {
		backlog = last.Sequence
	} else if !errors.Is(err, natsjs.ErrMsgNotFound) {
		return nil, 0, fmt.Errorf("bridge: acks of seq %d: %w", h.Seq, err)
	}
	gctx, cancel := context.WithCancel(ctx)
	r = &ackReader{b: b, phase: p.Phase(), cancel: cancel, msgs: make(chan ackMsg, 256), initial: true}
	// The reader as made here: a return with an error sets r to nil, and
	// both the close below and the consumer's handler, which may still
	// run until then, need it.
	rd := r
	defer func() {
		if err != nil {
			rd.close()
		}
	}()
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
	if watch {
		// The watcher's initial values say who is alive now (a member may
		// have died between the member listing and the publish); its
		// updates, who dies while the phase runs.
		if r.watcher, err = b.cfg.Bus.Members.Watch(gctx, events.MemberKeyFilter(b.cfg.Run)); err != nil {
			return nil, 0, fmt.Errorf("bridge: watch members: %w", err)
		}
		r.updates = r.watcher.Updates()
		r.memberOf, r.alive, r.instance = map[string]events.Member{}, map[string]bool{}, map[string]string{}
		for _, m := range h.Members {
			r.memberOf[events.MemberKey(b.cfg.Run, m)] = m
		}
	}
	return r, backlog, nil
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
	if r.watcher != nil {
		_ = r.watcher.Stop()
	}
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
	return machine.AckSeen{Ack: ack, StreamSeq: am.seq}
}

// update turns a heartbeat change into the members it shows gone.
func (r *ackReader) update(ctx context.Context, e kvUpdate) []machine.Input {
	switch {
	case e == nil && r.initial:
		r.initial = false
		var gone []machine.Input
		for k, m := range r.memberOf {
			if r.alive[k] {
				continue
			}
			// A key written while the watcher loaded can come after its
			// marker: ask for the few not seen.
			if _, err := r.b.cfg.Bus.Members.Get(ctx, k); errors.Is(err, natsjs.ErrKeyNotFound) {
				gone = append(gone, machine.MemberGone{Member: m, Why: machine.GoneNotAlive})
			}
		}
		return gone
	case e == nil:
		return nil
	case e.Operation() == natsjs.KeyValuePut:
		var info events.MemberInfo
		_ = json.Unmarshal(e.Value(), &info)
		m, tracked := r.memberOf[e.Key()]
		was, seen := r.instance[e.Key()]
		r.alive[e.Key()], r.instance[e.Key()] = true, info.Instance
		if tracked && seen && !r.initial && was != info.Instance {
			// Another process took the name: the one asked is gone.
			return []machine.Input{machine.MemberGone{Member: m, Why: machine.GoneReplaced}}
		}
		return nil
	case r.initial:
		return nil
	}
	if m, ok := r.memberOf[e.Key()]; ok {
		return []machine.Input{machine.MemberGone{Member: m, Why: machine.GoneLeft}}
	}
	return nil
}

// watchResume checks in the background that every member acks resume r
// within its deadline, and logs those that do not: resume acks never block
// a result (a member that misses the resume reopens when its lease runs
// out). It reads acks only, not every heartbeat once more. Once Run is
// ending it does not start.
func (b *Bridge) watchResume(r events.Resume) {
	if len(r.Members) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return // Run is ending: nothing is added to what it waits for
	}
	b.bg.Go(func() {
		ctx := b.bgCtx
		rd, backlog, err := b.openAcks(ctx, r, false)
		if err != nil {
			if ctx.Err() == nil {
				b.log.Warn().Err(err).Str("checkpoint", r.CheckpointID).Msg("cannot watch the resume acks")
			}
			return
		}
		defer rd.close()
		if missing := b.unresumed(ctx, r, rd, backlog); len(missing) > 0 {
			b.log.Warn().Str("checkpoint", r.CheckpointID).Strs("not_resumed", missing).
				Msg("members did not ack the resume in time; their leases will reopen them")
		}
	})
}

// unresumed reads the acks of resume r from rd until every member acked
// or the deadline passed, and returns the members that did not ack (none
// once ctx ends). Acks already recorded (up to stream sequence backlog)
// count whatever the time, but a read back that never reaches the last of
// them (it left the stream meanwhile) gives up a phase timeout after the
// start, as the machine's does, and decides on what it read.
func (b *Bridge) unresumed(ctx context.Context, r events.Resume, rd *ackReader, backlog uint64) []string {
	h := r.PhaseHeader
	began := b.cfg.Now()
	h.Deadline = machine.GatherDeadline(began, h.Deadline)
	readBy := b.cfg.Now().Add(b.cfg.PhaseTimeout)
	t := machine.NewTally(events.PhaseResume, h)
	timer := time.NewTimer(h.Deadline.Sub(b.cfg.Now()))
	defer timer.Stop()
	for {
		now := b.cfg.Now()
		if backlog > 0 && !now.Before(readBy) {
			b.log.Warn().Str("checkpoint", r.CheckpointID).Uint64("seq", h.Seq).Int("read", len(t.Acks())).
				Msg("reading back the resume acks: the last recorded one never came; going on with what was read")
			backlog = 0
		}
		if backlog > 0 && !now.Before(h.Deadline) {
			now = h.Deadline.Add(-time.Nanosecond) // the recorded acks are not read yet
		}
		if v := t.Decide(now); v == machine.Complete {
			b.cfg.Metrics.PhaseDone(string(events.PhaseResume), b.cfg.Now().Sub(began))
			return nil
		} else if v == machine.Failed {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
			if backlog > 0 {
				timer.Reset(machine.BacklogPoll)
			}
		case am := <-rd.msgs:
			if am.seq >= backlog {
				backlog = 0
			}
			if in, ok := rd.ack(am).(machine.AckSeen); ok && in.Ack != nil {
				t.Add(in.Ack)
			}
		}
	}
	errs, _, _ := t.Failure(b.cfg.Now())
	missing := make([]string, 0, len(errs))
	for _, e := range errs {
		missing = append(missing, string(e.Member))
	}
	return missing
}
