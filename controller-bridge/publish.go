package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/live"
)

// publishPhase publishes p fenced on the run's last phase, whose stream
// sequence is fence: if another bridge published in between, the server
// refuses it and an error wrapping bridgeapi.ErrFenced is returned. What
// listens for p's acks is opened first (the resume's inbox on core NATS,
// or p's inbox in the ack feed), and closed again if p is not published.
func (b *Bridge) publishPhase(ctx context.Context, fence uint64, p events.PhaseEvent) (machine.PhasePublished, error) {
	p, err := b.withRoster(ctx, p)
	if err != nil {
		return machine.PhasePublished{}, err
	}
	seq := p.Header().Seq
	switch {
	case p.Phase() == events.PhaseResume:
		// Its acks come on core NATS, at once: listen first.
		if err := b.openResumeInbox(p); err != nil {
			return machine.PhasePublished{}, err
		}
	case gathersLive(p.Phase()):
		// Its acks come through the ack feed: its inbox first. Without
		// one (the feed cannot be made: the server is away) its gathering
		// reads its acks with a consumer of its own, from the first.
		if err := b.openAckInbox(ctx, p); err != nil {
			b.log.Debug().Err(err).Uint64("seq", seq).Msg("no ack feed; the phase's acks will be read by a consumer of their own")
		}
	}
	pub, err := b.publishStored(ctx, fence, p)
	switch {
	case err == nil:
	case p.Phase() == events.PhaseResume:
		b.closeResumeInbox(seq)
	case gathersLive(p.Phase()):
		b.closeAckInbox(seq)
	}
	return pub, err
}

// publishStored publishes p into the stream, fenced, then its live copy.
func (b *Bridge) publishStored(ctx context.Context, fence uint64, p events.PhaseEvent) (machine.PhasePublished, error) {
	h := p.Header()
	// The id's random part is drawn once for this phase by this process
	// (PROTOCOL §4): our own retry, and the same phase published again
	// after a publish that failed but landed, is a duplicate or is
	// recognised by its id below; a second bridge publishing the same
	// sequence draws another, and is fenced. No one can tell the id
	// before it is sent and publish it first: the server would answer our
	// publish as a duplicate of theirs, and we would take a stranger's
	// stream sequence for our phase's.
	id := b.ids.For(b.cfg.Run + "." + strconv.FormatUint(h.Seq, 10) + "." + string(p.Phase()) + "." + h.CheckpointID)
	msg, err := events.Marshal(b.source, p, events.WithID(id))
	if err != nil {
		return machine.PhasePublished{}, fmt.Errorf("bridge: build %s: %w", p.Phase(), err)
	}
	ack, err := b.publishFenced(ctx, msg, fence, p)
	if jetstream.IsWrongLastSequence(err) {
		// Our own earlier attempt may have landed: then the last phase is
		// ours, by its id.
		now, serr := b.state(ctx)
		if serr == nil && now.lastID == id {
			b.publishLive(msg, now.streamSeq, p)
			b.published, b.lastSeq = id, h.Seq
			return machine.PhasePublished{Event: p, StreamSeq: now.streamSeq, ID: id, At: now.lastAt}, nil
		}
		return machine.PhasePublished{}, fmt.Errorf("%w: publishing %s seq %d: %w", bridgeapi.ErrFenced, p.Phase(), h.Seq, err)
	}
	if err != nil {
		return machine.PhasePublished{}, fmt.Errorf("bridge: publish %s seq %d: %w", p.Phase(), h.Seq, err)
	}
	b.publishLive(msg, ack.Sequence, p)
	b.saveHead(ctx, h)
	b.published, b.lastSeq = id, h.Seq
	return machine.PhasePublished{Event: p, StreamSeq: ack.Sequence, ID: id, At: b.cfg.Now()}, nil
}

// liveConn is the connection of the live copies and the resume acks
// (Config.LiveConn).
func (b *Bridge) liveConn() *nats.Conn {
	if b.cfg.LiveConn != nil {
		return b.cfg.LiveConn
	}
	return b.cfg.JS.Conn()
}

// publishLive publishes the live copy of phase p, which the stream stored
// as msg at streamSeq, for the sandbox daemons' core subscriptions
// (PROTOCOL §3, live phases): only once the stream took it, so a fenced
// phase never reaches them; only when p addresses them, so a commit that
// does not is not delivered 10,000 times to be dropped. The copy names the
// bridge's live copy before it (events.HeaderLivePrev): a daemon that saw
// that one missed nothing. A bridge that has published none names the
// phase before p, and a daemon that did not see it reads the stream. A
// copy lost (a bridge that dies before it, a publish that fails) breaks
// the chain: the next copy names the phase before it, so the daemons find
// the gap and read the lost phase from the stream.
func (b *Bridge) publishLive(msg *nats.Msg, streamSeq uint64, p events.PhaseEvent) {
	h := p.Header()
	// The live copy before p is this bridge's last only if no other
	// bridge published since this one's last phase (phases are numbered
	// one by one): another bridge's phases in between may have addressed
	// the daemons, and their copies may be lost.
	if b.lastSeq != h.Seq-1 {
		b.lastLive = 0
	}
	if h.Sandboxes == nil && !slices.ContainsFunc(h.Members, func(m events.Member) bool { return m.Kind() == events.KindSandbox }) {
		return
	}
	prev := b.lastLive
	if prev == 0 || prev >= h.Seq {
		prev = h.Seq - 1
	}
	if err := b.liveConn().PublishMsg(events.LiveCopy(msg, streamSeq, prev)); err != nil {
		b.log.Warn().Err(err).Str("phase", string(p.Phase())).Uint64("seq", h.Seq).
			Msg("cannot publish the phase's live copy; the sandbox daemons will read it from the stream")
		// The next copy must not name one before this: a daemon that
		// saw that would take the next for following and never read p.
		b.lastLive = 0
		return
	}
	b.lastLive = h.Seq
}

// publishRetry is how a phase publish that goes unanswered is published
// again: 500 ms apart, each attempt bounded by 5 s, for up to a minute (a
// stream electing a new leader, a node of a cluster lost, takes seconds;
// a restarted server about as long).
var publishRetry = live.Policy{
	Interval: poll.Every(500 * time.Millisecond),
	Within:   time.Minute,
	Timeout:  publishAttemptTimeout,
}

// publishAttemptTimeout bounds one attempt of a phase publish.
const publishAttemptTimeout = 5 * time.Second

// publishFenced publishes msg, phase p, with the expected last sequence
// fence on the run's phase subjects; an attempt that goes unanswered (a
// timeout, no responders: the stream has no leader) is made again, the
// same message with the same id and fence, before anything else is
// published: it lands once whichever attempt the stream stored (a later
// one is a duplicate of it, or refused by the fence, which the caller
// checks by id). Without this a publish that timed out but landed later
// would come after what the bridge published next.
func (b *Bridge) publishFenced(ctx context.Context, msg *nats.Msg, fence uint64, p events.PhaseEvent) (*natsjs.PubAck, error) {
	opt := natsjs.WithExpectLastSequenceForSubject(fence, events.PhaseFilter(b.cfg.Run))
	policy := publishRetry
	policy.Again = func(err error) bool { return unanswered(ctx, err) }
	attempt := 0
	var last error
	ack, err := live.Retry(ctx, policy, func(actx context.Context) (*natsjs.PubAck, error) {
		attempt++
		if attempt > 1 {
			b.log.Warn().Err(last).Str("phase", string(p.Phase())).Uint64("seq", p.Header().Seq).Int("attempt", attempt).
				Msg("phase publish unanswered (a stream without a leader?); publishing the same again")
		}
		ack, err := b.cfg.JS.PublishMsg(actx, msg, opt)
		if err == nil && ack.Duplicate && attempt > 1 {
			b.log.Info().Str("phase", string(p.Phase())).Uint64("seq", p.Header().Seq).Uint64("stream_seq", ack.Sequence).
				Msg("an earlier attempt of the phase publish had landed")
		}
		last = err
		return ack, err
	})
	switch {
	case err == nil:
		return ack, nil
	case ctx.Err() != nil && !errors.Is(err, ctx.Err()):
		return nil, fmt.Errorf("%w (then %w)", err, ctx.Err())
	case unanswered(ctx, err):
		return nil, fmt.Errorf("%w (unanswered for %s)", err, publishRetry.Within)
	}
	return ack, err
}

// unanswered tells an error of a publish that may or may not have landed
// and is worth making again: the request timed out (ctx itself did not
// end), no one answered it, or the stream is still storing an earlier
// attempt of it (a replicated stream's 10158, "duplicate message id is in
// process", which a 3-node cluster under load answers).
func unanswered(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil {
		return false
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, natsjs.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		jetstream.IsDuplicateInProcess(err)
}

// saveHead records the run's head after a phase publish, in the
// background: the stream holds the phase until it ages out (MaxAge, days),
// so the head is not on the path of an operation, which has three phases
// to publish and each head write two round trips. A later head replaces
// one not written yet. The next operation does not wait for it either (its
// round trips queue behind the resume's acks): a head in flight names a
// phase the stream holds, which state reads first. Status and Run's end
// wait for it (flushHead). Best effort: a failed write is logged.
func (b *Bridge) saveHead(ctx context.Context, h events.PhaseHeader) {
	b.heads.mu.Lock()
	b.heads.next = &h
	if b.heads.busy != nil {
		b.heads.mu.Unlock()
		return // the writer takes it next
	}
	done := make(chan struct{})
	b.heads.busy = done
	b.heads.mu.Unlock()
	go func() {
		defer close(done)
		for {
			b.heads.mu.Lock()
			next := b.heads.next
			b.heads.next = nil
			if next == nil {
				b.heads.busy = nil
				b.heads.mu.Unlock()
				return
			}
			b.heads.mu.Unlock()
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), publishAttemptTimeout)
			b.writeHead(wctx, *next)
			cancel()
		}
	}()
}

// flushHead waits until the head writes asked so far are done, or ctx
// ends.
func (b *Bridge) flushHead(ctx context.Context) {
	b.heads.mu.Lock()
	busy := b.heads.busy
	b.heads.mu.Unlock()
	if busy == nil {
		return
	}
	select {
	case <-busy:
	case <-ctx.Done():
	}
}

// heads is the background writer of the run's head.
type heads struct {
	mu   sync.Mutex
	next *events.PhaseHeader // waiting to be written
	busy chan struct{}       // closed when the writer is done; nil when none runs
}

// writeHead moves the run's head to h, never backwards.
func (b *Bridge) writeHead(ctx context.Context, h events.PhaseHeader) {
	v, _ := json.Marshal(events.Head{Seq: h.Seq, Epoch: h.Epoch, Updated: b.cfg.Now().UTC()})
	key := events.HeadKey(b.cfg.Run)
	// Compare-and-set, never backwards: a delayed write of another bridge
	// must not lower the head.
	for range 3 {
		e, err := b.cfg.Bus.Manifests.Get(ctx, key)
		switch {
		case errors.Is(err, natsjs.ErrKeyNotFound):
			_, err = b.cfg.Bus.Manifests.Create(ctx, key, v)
		case err == nil:
			var cur events.Head
			if json.Unmarshal(e.Value(), &cur) == nil && cur.Seq >= h.Seq {
				return
			}
			_, err = b.cfg.Bus.Manifests.Update(ctx, key, v, e.Revision())
		}
		if err == nil {
			return
		}
		b.log.Debug().Err(err).Uint64("seq", h.Seq).Msg("record the run's head; trying again")
	}
	b.log.Warn().Uint64("seq", h.Seq).Msg("could not record the run's head")
}

// publishOutcomeOnce publishes outcome o of operation opID once: its id,
// drawn once by this process for the operation and the outcome's type
// (PROTOCOL §4), makes a repeat of this process inside the duplicate
// window a no-op, and for a replayed operation (another process's, or
// this one's after a failure) a look at the stream covers the rest. No
// id derived from the operation alone: anyone could publish it first and
// have the outcome dropped as a duplicate.
func (b *Bridge) publishOutcomeOnce(ctx context.Context, o events.Data, opID string, replayed bool) error {
	if replayed {
		if have, err := b.outcomeOf(ctx, o.Type(), opID); err != nil || have != nil {
			return err
		}
	}
	msg, err := events.Marshal(b.source, o, events.WithID(b.ids.For(b.cfg.Run+"."+opID+"."+o.Type().Noun())))
	if err != nil {
		return fmt.Errorf("bridge: build outcome: %w", err)
	}
	if _, err := jetstream.PublishDedup(ctx, b.cfg.JS, msg); err != nil {
		return fmt.Errorf("bridge: publish outcome %s: %w", o.Type().Noun(), err)
	}
	b.countOutcome(o)
	return nil
}

// outcomeOf returns the last outcome of type t if it belongs to opID,
// read from the stream's leader: a replica behind it would have a
// recovering bridge publish an outcome the stream holds again.
func (b *Bridge) outcomeOf(ctx context.Context, t events.Type, opID string) (events.Data, error) {
	raw, err := jetstream.LeaderLastMsg(ctx, b.cfg.Conn, jetstream.StreamName, events.OutcomeSubject(b.cfg.Run, t))
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bridge: read outcome %s: %w", t.Noun(), err)
	}
	e, d, err := events.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
	if err != nil {
		return nil, fmt.Errorf("bridge: outcome at stream sequence %d: %w", raw.Sequence, err)
	}
	if e.Subject() != opID {
		return nil, nil
	}
	return d, nil
}
