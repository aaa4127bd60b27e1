package bridge

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/live"
)

// resumeAcks are the inboxes of the bridge's resumes, each with a
// core-NATS subscription of its resume's acks (PROTOCOL §3: they are not
// stored): each is opened before its resume is published, so that no ack
// comes before it, and hands each member's first valid ack (liveGate) to
// the inbox; it ends with the inbox. A sandbox daemon's credentials may
// publish on its resume ack subjects at will: what the bridge hears of them
// is bounded to the resumes it watches, and what it reads of them to the
// gate's. Inboxes no watch took are bounded (resumeInboxes); a taken inbox
// is kept until its watch closes it, by the resume's deadline.
type resumeAcks = live.Inboxes[*resumeInbox]

// resumeInbox holds the acks of one resume as they arrive.
type resumeInbox struct {
	published time.Time
	sub       *nats.Subscription // spl.<run>.ack.<seq>.resume.>
	gate      *liveGate
	mu        sync.Mutex
	acks      []heardAck
	wake      chan struct{}
}

// heardAck is an ack and when the bridge heard it.
type heardAck struct {
	msg *nats.Msg
	ack events.Ack
	at  time.Time
}

// resumeInboxes bounds the inboxes kept that no watch took (a resume
// published, its watch not started: the bridge ending, a publish lost).
const resumeInboxes = 8

// openResumeInbox opens the inbox of resume p and subscribes it to p's
// acks: call it before the resume is published.
func (b *Bridge) openResumeInbox(p events.PhaseEvent) error {
	h := p.Header()
	return b.resumes.Open(h.Seq, func() (*resumeInbox, error) {
		in := &resumeInbox{published: b.cfg.Now(), wake: make(chan struct{}, 1), gate: newLiveGate(b.cfg.Run, events.PhaseResume, h, b.log)}
		// On the live connection: a fleet's acks at once on the bridge's
		// own would queue the answers to what it asks next behind them.
		sub, err := live.Listen(context.Background(), b.liveConn(), in.gate.filter(""), func(m *nats.Msg) { b.heardResumeAck(in, m) },
			liveAcksPendingMsgs, liveAcksPendingBytes)
		if err != nil {
			return nil, fmt.Errorf("bridge: the resume acks: %w", err)
		}
		in.sub = sub
		return in, nil
	})
}

// Close ends the inbox's subscription.
func (in *resumeInbox) Close() {
	_ = in.sub.Unsubscribe()
	in.gate.report()
}

// takeResumeInbox returns the inbox of resume seq, which the watch of that
// resume reads from now on, and keeps it until the watch closes it (acks
// heard from now on still reach it). Nil if none was opened.
func (b *Bridge) takeResumeInbox(seq uint64) *resumeInbox {
	in, _ := b.resumes.Take(seq)
	return in
}

// closeResumeInbox forgets the inbox of resume seq and ends its
// subscription.
func (b *Bridge) closeResumeInbox(seq uint64) { b.resumes.Close(seq) }

// stopResumeAcks ends every subscription (Run is ending).
func (b *Bridge) stopResumeAcks() { b.resumes.CloseAll() }

// heardResumeAck runs on the subscription's goroutine: it files msg in in,
// if the gate takes it.
func (b *Bridge) heardResumeAck(in *resumeInbox, msg *nats.Msg) {
	ack, _ := in.gate.admit(msg)
	if ack == nil {
		return
	}
	in.mu.Lock()
	in.acks = append(in.acks, heardAck{msg: msg, ack: ack, at: b.cfg.Now()})
	in.mu.Unlock()
	select {
	case in.wake <- struct{}{}:
	default:
	}
}

func (in *resumeInbox) take() []heardAck {
	in.mu.Lock()
	defer in.mu.Unlock()
	acks := in.acks
	in.acks = nil
	return acks
}

// watchResume checks in the background that every member acks resume r
// within its deadline, logs those that do not (resume acks never block a
// result: a member that misses the resume reopens when its lease runs
// out), and records what it heard in the stream (events.ResumeAcked).
// Once Run is ending it does not start.
func (b *Bridge) watchResume(r events.Resume) {
	in := b.takeResumeInbox(r.Seq)
	if in == nil {
		b.log.Warn().Str("checkpoint", r.CheckpointID).Uint64("seq", r.Seq).Msg("no inbox for the resume acks; not watching them")
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		b.closeResumeInbox(r.Seq)
		return // Run is ending: nothing is added to what it waits for
	}
	b.bg.Go(func() {
		defer b.closeResumeInbox(r.Seq)
		rec := b.gatherResume(b.bgCtx, r, in)
		if rec == nil {
			return
		}
		if rec.MissingCount > 0 {
			b.log.Warn().Str("checkpoint", r.CheckpointID).Int("not_resumed", rec.MissingCount).Strs("first", memberStrings(rec.Missing)).
				Msg("members did not ack the resume in time; their leases will reopen them")
		}
		// Its id is drawn once (PROTOCOL §4): no one can publish it first
		// to have the record dropped as a duplicate.
		msg, err := events.Marshal(b.source, *rec, events.WithID(b.ids.For(b.cfg.Run+"."+strconv.FormatUint(r.Seq, 10)+".resume.acked")))
		if err == nil {
			ctx, cancel := context.WithTimeout(b.bgCtx, publishAttemptTimeout)
			_, err = jetstream.PublishDedup(ctx, b.cfg.JS, msg)
			cancel()
		}
		if err != nil && b.bgCtx.Err() == nil {
			b.log.Warn().Err(err).Str("checkpoint", r.CheckpointID).Msg("cannot record the resume's acks in the stream")
		}
	})
}

// gatherResume reads the acks of resume r from its inbox until every
// member acked or the deadline passed, and returns what it heard; nil once
// ctx ends.
func (b *Bridge) gatherResume(ctx context.Context, r events.Resume, in *resumeInbox) *events.ResumeAcked {
	h := r.PhaseHeader
	began := in.published
	h.Deadline = machine.GatherDeadline(began, h.Deadline)
	t := machine.NewTally(events.PhaseResume, h)
	t.WaitAll = true // an ack with an error does not end the wait for the others
	var took []float64
	held := 0
	timer := time.NewTimer(h.Deadline.Sub(b.cfg.Now()))
	defer timer.Stop()
	for {
		for _, a := range in.take() {
			ack, ok := a.ack.(events.ResumeAck)
			if !ok || !t.Add(ack) {
				continue
			}
			b.countAck(ack)
			took = append(took, float64(a.at.Sub(began).Microseconds())/1000)
			if ack.Pause != nil {
				held += ack.Pause.HeldCalls
			}
		}
		if v := t.Decide(b.cfg.Now()); v != machine.Waiting {
			break
		}
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		case <-in.wake:
		}
	}
	expected, _ := h.Expected()
	rec := &events.ResumeAcked{Run: b.cfg.Run, CheckpointID: h.CheckpointID, Seq: h.Seq, Epoch: h.Epoch,
		Expected: len(expected), Answered: len(t.Acks()), HeldCalls: held}
	for _, m := range expected {
		ack, ok := t.Acks()[m]
		switch {
		case !ok:
			rec.MissingCount++
			if len(rec.Missing) < events.MaxListed {
				rec.Missing = append(rec.Missing, m)
			}
		case ack.Header().Error != nil:
			rec.ErrorCount++
			if len(rec.Errors) < events.MaxListed {
				e := ack.Header().Error
				rec.Errors = append(rec.Errors, events.MemberError{Member: m, Code: e.Code, Detail: e.Detail})
			}
		}
	}
	if len(took) > 0 {
		slices.Sort(took)
		rec.P50MS, rec.MaxMS = took[len(took)/2], took[len(took)-1]
	}
	if rec.MissingCount == 0 {
		b.cfg.Metrics.PhaseDone(string(events.PhaseResume), b.cfg.Now().Sub(began))
	}
	return rec
}

func memberStrings(ms []events.Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = string(m)
	}
	return out
}
