package member

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
)

// coreFeed is the feed of Config.CoreFeed (PROTOCOL §3, Consumers): a
// core-NATS subscription of the run's phases (and of the committed
// outcomes, for a participant that parks), which costs the server nothing
// persistent, and catch-up from the stream by direct get (next by subject,
// from after the position the state file holds) on start, after every
// reconnect, and when a phase's sequence is past the next one. The phases
// are numbered one by one, so the phase sequence tells a repeat (the
// subscription and the catch-up both deliver it) from a gap (the
// subscription missed one): each phase is delivered once, in order.
func (m *Member) coreFeed(ctx context.Context) (*feed, error) {
	pos, other, err := loadPosition(m.cfg.StateFile, m.cfg.Run, m.cfg.Member)
	if err != nil {
		return nil, err
	}
	if other != "" {
		m.log.Info().Str("state_file", m.cfg.StateFile).Str("written_by", other).Msg("position of another member: reading from the stream's end")
	}
	based := pos.PhaseSeq != 0
	if pos.StreamSeq == 0 {
		// What is published from now on: the feed starts after the member
		// registers, and its first catch-up reads what came in between.
		// The run's newest phase, before this member, says which phase
		// comes next, so that the first one the subscription delivers needs
		// no catch-up.
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		info, err := m.cfg.Bus.Stream.Info(cctx)
		if err != nil {
			return nil, fmt.Errorf("member: core feed: stream info: %w", err)
		}
		pos = position{StreamSeq: info.State.LastSeq}
		last, err := m.cfg.Bus.Stream.GetLastMsgForSubject(cctx, events.PhaseFilter(m.cfg.Run))
		switch {
		case errors.Is(err, natsjs.ErrMsgNotFound):
			based = true // none yet: the first is 1
		case err != nil:
			return nil, fmt.Errorf("member: core feed: the run's last phase: %w", err)
		default:
			dl := newCoreDelivery(&nats.Msg{Subject: last.Subject, Header: last.Header, Data: last.Data}, last.Sequence, nil, nil)
			if q, _ := dl.phaseSeq(); q != 0 {
				pos.PhaseSeq, pos.StreamSeq, based = q, max(pos.StreamSeq, last.Sequence), true
			}
		}
	}
	// The phases as the stream republishes what it stored (never one it
	// refused: a fenced publish of a zombie bridge), and, for a
	// participant that parks, the committed outcomes.
	subs := []string{events.LivePhaseFilter(m.cfg.Run)}
	if _, parks := m.cfg.Participant.(Parker); parks {
		subs = append(subs, events.OutcomeSubject(m.cfg.Run, events.TypeCheckpointCommitted))
	}
	m.inbox = make(chan Delivery)
	c := &coreReader{
		nc: m.cfg.Conn, stream: m.cfg.Bus.Stream, runID: m.cfg.Run, subjects: subs, scoped: m.cfg.NoPull, inbox: m.inbox,
		pos:      newPhaseFloor(m.cfg.StateFile, m.cfg.Run, m.cfg.Member, pos, m.log),
		again:    &redeliverer{inbox: m.inbox, stopping: make(chan struct{})},
		log:      m.log,
		wake:     make(chan struct{}, 1),
		stopping: make(chan struct{}),
		done:     make(chan struct{}),
		from:     pos.StreamSeq,
		lastQ:    pos.PhaseSeq,
		based:    based,
		pending:  map[uint64]*coreDelivery{},
	}
	m.core = c
	return &feed{name: "core subscription, position in " + m.cfg.StateFile, start: c.start, stop: c.stop}, nil
}

// coreReader is the core feed's subscription and the one goroutine (run)
// that turns what it receives, and what the catch-ups read, into
// deliveries, in phase order.
type coreReader struct {
	nc       *nats.Conn
	stream   natsjs.Stream
	runID    string
	subjects []string
	scoped   bool // Config.NoPull: its user direct-gets only by its run's phase subjects
	inbox    chan<- Delivery
	pos      *phaseFloor
	again    *redeliverer
	log      zerolog.Logger

	mu       sync.Mutex // the subscriptions' goroutines append, run takes
	arrived  []*nats.Msg
	wake     chan struct{}
	lose     atomic.Int64 // messages the subscription is to lose, for a test (LoseCoreArrivals)
	catchUps atomic.Int64 // catch-ups made, for a test

	subs     []*nats.Subscription
	status   chan nats.Status
	stopping chan struct{}
	cancel   context.CancelFunc // ends run's direct gets; set once run is started
	done     chan struct{}      // closed when run returns
	once     sync.Once

	// Owned by run.
	from    uint64                   // the stream sequence the next catch-up reads after
	lastQ   uint64                   // the highest phase sequence delivered, or known to be before the member
	based   bool                     // lastQ is known: the next phase is lastQ+1
	pending map[uint64]*coreDelivery // phases received past a gap, waiting for the catch-up
	seen    []string                 // ids of the last outcomes delivered
}

// catchUpTries is how many catch-ups a gap gets before the phase after it
// is delivered anyway: a phase the subscription delivers may not be in the
// stream yet (a replica that answers the direct get behind its leader),
// and one that never is there (a publish the server refused) leaves a gap
// for good.
const catchUpTries = 5

// start subscribes, then starts the goroutine that catches up at once:
// what was published before the subscription was up is read from the
// stream, and what comes after it arrives on the subscription.
func (c *coreReader) start() error {
	c.status = c.nc.StatusChanged(nats.CONNECTED)
	for _, s := range c.subjects {
		sub, err := c.nc.Subscribe(s, c.arrive)
		if err != nil {
			c.unsubscribe()
			return fmt.Errorf("member: core feed: subscribe %s: %w", s, err)
		}
		// Nothing is dropped: a phase missed is one the catch-up reads.
		_ = sub.SetPendingLimits(-1, -1)
		c.subs = append(c.subs, sub)
	}
	if err := c.nc.Flush(); err != nil {
		c.unsubscribe()
		return fmt.Errorf("member: core feed: subscribe: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go c.run(ctx)
	return nil
}

// stop ends the subscription and the goroutine, and waits for it. Once:
// Run stops the feed again at its end.
func (c *coreReader) stop() {
	c.once.Do(func() {
		close(c.stopping)
		if c.cancel != nil {
			c.cancel()
			<-c.done
		}
		c.unsubscribe()
		c.again.stop()
		if err := c.pos.flush(); err != nil {
			c.log.Warn().Err(err).Msg("cannot write the position at the feed's end")
		}
	})
}

func (c *coreReader) unsubscribe() {
	for _, sub := range c.subs {
		_ = sub.Unsubscribe()
	}
	c.subs = nil
	if c.status != nil {
		c.nc.RemoveStatusListener(c.status)
	}
}

// arrive runs on a subscription's goroutine: it queues msg for run, and
// never blocks.
func (c *coreReader) arrive(msg *nats.Msg) {
	if c.lose.Load() > 0 && c.lose.Add(-1) >= 0 {
		return
	}
	c.mu.Lock()
	c.arrived = append(c.arrived, msg)
	c.mu.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *coreReader) take() []*nats.Msg {
	c.mu.Lock()
	defer c.mu.Unlock()
	msgs := c.arrived
	c.arrived = nil
	return msgs
}

// run delivers what arrives, catching up first whenever the phase
// sequence says something was missed, after a reconnect, and at start.
func (c *coreReader) run(ctx context.Context) {
	defer close(c.done)
	retry := time.NewTimer(0) // the first catch-up, at once
	defer retry.Stop()
	behind, tries := true, 0
	for {
		select {
		case <-c.stopping:
			return
		case <-c.status:
			c.log.Info().Uint64("from_stream_seq", c.from+1).Msg("reconnected; catching up from the stream")
			behind = true
		case <-retry.C:
		case <-c.wake:
			for _, msg := range c.take() {
				if !c.received(msg, behind) {
					behind = true
				}
			}
		}
		if !behind {
			continue
		}
		if err := c.catchUp(ctx); err != nil {
			if errors.Is(err, errStopping) {
				return
			}
			c.log.Warn().Err(err).Msg("cannot catch up from the stream; will try again")
			retry.Reset(recreateRetry)
			continue
		}
		gap, ok := c.flushPending(tries+1 >= catchUpTries)
		if !ok {
			return
		}
		behind = gap
		if !gap {
			tries = 0
			continue
		}
		tries++
		retry.Reset(time.Duration(tries) * 100 * time.Millisecond)
	}
}

// errStopping ends a catch-up that the feed's stop interrupted.
var errStopping = errors.New("member: core feed stopping")

// received takes one message of the subscription: it is delivered if it is
// the next phase, dropped if it was delivered already, and kept for after
// the catch-up otherwise (or while behind). It reports false when a
// catch-up is needed.
func (c *coreReader) received(msg *nats.Msg, behind bool) bool {
	var seq uint64
	if s := msg.Header.Get(natsjs.SequenceHeader); s != "" {
		// Republished by the stream: the subject it was stored on, and its
		// stream sequence.
		seq, _ = strconv.ParseUint(s, 10, 64)
		if subject := msg.Header.Get(natsjs.SubjectHeader); subject != "" {
			msg.Subject = subject
		}
	}
	dl := newCoreDelivery(msg, seq, c.pos, c.again)
	q, outcome := dl.phaseSeq()
	// A live copy names the bridge's live copy before it: one this member
	// saw (or one before what it has seen) means nothing was missed, the
	// phases in between addressing no sandbox daemon (PROTOCOL §3).
	chained := c.based && q > c.lastQ && dl.follows(c.lastQ)
	switch {
	case outcome && !behind, !outcome && q == 0, !outcome && !behind && c.based && (q == c.lastQ+1 || chained):
		// An outcome; something malformed or not a phase, which the loop
		// refuses; the next phase. (A stop ends run at its next select.)
		c.deliver(dl)
		return true
	case outcome:
		c.pending[0] = dl // an outcome waits for the catch-up, which reads it from the stream too
		return false
	case q <= c.lastQ:
		return true // delivered already (the catch-up read it, or a publish repeated)
	}
	c.pending[q] = dl
	return false
}

// deliver hands dl to the loop unless it repeats what was delivered; it
// reports false only when the feed stops first.
func (c *coreReader) deliver(dl *coreDelivery) bool {
	q, outcome := dl.phaseSeq()
	switch {
	case outcome:
		id := dl.eventID()
		if slices.Contains(c.seen, id) {
			return true
		}
		if c.seen = append(c.seen, id); len(c.seen) > 64 {
			c.seen = c.seen[1:]
		}
	case q != 0:
		if q <= c.lastQ {
			return true
		}
		c.lastQ, c.based = q, true
		c.from = max(c.from, dl.seq)
		c.pos.delivered(q, dl.seq)
	}
	select {
	case c.inbox <- dl:
		return true
	case <-c.stopping:
		return false
	}
}

// catchUp reads from the stream, by direct get of the next message on the
// feed's subjects after c.from, everything up to the stream's end, and
// delivers in stream order what was not delivered yet.
func (c *coreReader) catchUp(ctx context.Context) error {
	c.catchUps.Add(1)
	if c.scoped {
		return c.catchUpScoped(ctx)
	}
	filters := []string{events.PhaseFilter(c.runID)}
	if len(c.subjects) > 1 {
		filters = append(filters, c.subjects[1:]...)
	}
	next := make([]*natsjs.RawStreamMsg, len(filters))
	done := make([]bool, len(filters))
	for {
		for i, s := range filters {
			if next[i] != nil || done[i] {
				continue
			}
			gctx, cancel := context.WithTimeout(ctx, callTimeout)
			msg, err := c.stream.GetMsg(gctx, c.from+1, natsjs.WithGetMsgSubject(s))
			cancel()
			switch {
			case ctx.Err() != nil:
				return errStopping
			case errors.Is(err, natsjs.ErrMsgNotFound):
				done[i] = true
			case err != nil:
				return fmt.Errorf("member: core feed: direct get of %s after %d: %w", s, c.from, err)
			default:
				next[i] = msg
			}
		}
		first := -1
		for i, msg := range next {
			if msg != nil && (first < 0 || msg.Sequence < next[first].Sequence) {
				first = i
			}
		}
		if first < 0 {
			return nil
		}
		msg := next[first]
		next[first] = nil
		c.from = msg.Sequence
		dl := newCoreDelivery(&nats.Msg{Subject: msg.Subject, Header: msg.Header, Data: msg.Data}, msg.Sequence, c.pos, c.again)
		if !c.deliver(dl) {
			return errStopping
		}
	}
}

// catchUpScoped is catchUp for a user whose direct gets name the subject
// (a sandbox with a user of its own, Config.NoPull): the server reads a
// next-by-subject request from its body, which no permission can limit to
// one run (docs/PERMISSIONS.md). The newest phase of the run, by a direct
// get whose subject names the run's phases, tells whether anything was
// missed: nothing, or only that phase, in the common case. When more was
// missed, an ordered push consumer filtered on the run's phases reads them
// from after c.from, and goes once it has.
func (c *coreReader) catchUpScoped(ctx context.Context) error {
	if err := c.catchUpPhasesScoped(ctx); err != nil {
		return err
	}
	if len(c.subjects) == 1 {
		return nil
	}
	// A participant that parks: the newest committed outcome, which a
	// stop commit waits for (one delivered already is known by its id).
	subject := events.OutcomeSubject(c.runID, events.TypeCheckpointCommitted)
	gctx, cancel := context.WithTimeout(ctx, callTimeout)
	msg, err := c.stream.GetLastMsgForSubject(gctx, subject)
	cancel()
	switch {
	case ctx.Err() != nil:
		return errStopping
	case errors.Is(err, natsjs.ErrMsgNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("member: core feed: direct get of the last of %s: %w", subject, err)
	}
	if !c.deliver(newCoreDelivery(&nats.Msg{Subject: msg.Subject, Header: msg.Header, Data: msg.Data}, msg.Sequence, c.pos, c.again)) {
		return errStopping
	}
	return nil
}

func (c *coreReader) catchUpPhasesScoped(ctx context.Context) error {
	gctx, cancel := context.WithTimeout(ctx, callTimeout)
	msg, err := c.stream.GetLastMsgForSubject(gctx, events.PhaseFilter(c.runID))
	cancel()
	switch {
	case ctx.Err() != nil:
		return errStopping
	case errors.Is(err, natsjs.ErrMsgNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("member: core feed: direct get of the last of %s: %w", events.PhaseFilter(c.runID), err)
	case msg.Sequence <= c.from:
		return nil
	}
	dl := newCoreDelivery(&nats.Msg{Subject: msg.Subject, Header: msg.Header, Data: msg.Data}, msg.Sequence, c.pos, c.again)
	if q, _ := dl.phaseSeq(); q <= c.lastQ || (c.based && q == c.lastQ+1) {
		if !c.deliver(dl) {
			return errStopping
		}
		c.from = msg.Sequence
		return nil
	}
	return c.readThrough(ctx, msg.Sequence)
}

// readThrough reads the run's phases after c.from up to stream sequence
// last through a push consumer filtered on them, the one a sandbox's own
// user may create (docs/PERMISSIONS.md), and delivers what was not
// delivered yet. It deletes no consumer (a sandbox may not): the server
// drops it once its subscription is gone for readThroughInactive.
func (c *coreReader) readThrough(ctx context.Context, last uint64) error {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	cons, err := c.stream.CreatePushConsumer(cctx, natsjs.ConsumerConfig{
		Name: "sp_" + events.NewID(), DeliverSubject: c.nc.NewInbox(), FilterSubject: events.PhaseFilter(c.runID),
		DeliverPolicy: natsjs.DeliverByStartSequencePolicy, OptStartSeq: c.from + 1, AckPolicy: natsjs.AckNonePolicy,
		InactiveThreshold: readThroughInactive, MemoryStorage: true, Replicas: 1,
	})
	cancel()
	if err != nil {
		return fmt.Errorf("member: core feed: a consumer to read the missed phases: %w", err)
	}
	got := make(chan natsjs.Msg, 64)
	quit := make(chan struct{})
	cc, err := cons.Consume(func(msg natsjs.Msg) {
		select {
		case got <- msg:
		case <-quit:
		}
	})
	if err != nil {
		return fmt.Errorf("member: core feed: read the missed phases: %w", err)
	}
	defer cc.Stop()
	defer close(quit) // before Stop: a handler waiting to hand over returns
	c.log.Info().Uint64("from_stream_seq", c.from+1).Uint64("to_stream_seq", last).Msg("more than one phase missed; reading them through a consumer")
	idle := time.NewTimer(callTimeout)
	defer idle.Stop()
	for c.from < last {
		select {
		case <-ctx.Done():
			return errStopping
		case <-idle.C:
			return fmt.Errorf("member: core feed: no phase from the consumer within %s (at stream sequence %d of %d)", callTimeout, c.from, last)
		case msg := <-got:
			md, err := msg.Metadata()
			if err != nil {
				continue
			}
			idle.Reset(callTimeout)
			c.from = md.Sequence.Stream
			dl := newCoreDelivery(&nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()}, md.Sequence.Stream, c.pos, c.again)
			if !c.deliver(dl) {
				return errStopping
			}
		}
	}
	return nil
}

// readThroughInactive is how long the server keeps a catch-up's consumer
// after its subscription went.
const readThroughInactive = 5 * time.Second

// flushPending delivers, in phase order, what the subscription received
// past a gap and the catch-up did not read. A gap that is still there is
// waited for (it reports gap), unless anyway: then what follows it is
// delivered as it is. ok is false when the feed stops first.
func (c *coreReader) flushPending(anyway bool) (gap, ok bool) {
	if dl := c.pending[0]; dl != nil {
		delete(c.pending, 0)
		if !c.deliver(dl) {
			return false, false
		}
	}
	qs := make([]uint64, 0, len(c.pending))
	for q := range c.pending {
		qs = append(qs, q)
	}
	slices.Sort(qs)
	for _, q := range qs {
		if q <= c.lastQ {
			delete(c.pending, q)
			continue
		}
		missing := c.based && q > c.lastQ+1 && !c.pending[q].follows(c.lastQ)
		if missing && !anyway {
			return true, true
		}
		if missing {
			c.log.Warn().Uint64("last_seen", c.lastQ).Uint64("seq", q).
				Msg("phases missing before this one are not in the stream; taking it as it is")
		}
		dl := c.pending[q]
		delete(c.pending, q)
		if !c.deliver(dl) {
			return false, false
		}
	}
	return false, true
}

// coreDelivery is a message of the core feed, received on its subscription
// (no stream sequence) or read from the stream: acknowledging it moves the
// saved position, and giving it back delivers it again locally.
type coreDelivery struct {
	msg       *nats.Msg
	seq       uint64 // the stream sequence, when it was read from the stream
	delivered uint64
	pos       *phaseFloor
	again     *redeliverer

	decoded bool
	e       cloudevent.Event
	d       events.Data
	err     error
}

func newCoreDelivery(msg *nats.Msg, seq uint64, pos *phaseFloor, again *redeliverer) *coreDelivery {
	return &coreDelivery{msg: msg, seq: seq, delivered: 1, pos: pos, again: again}
}

// Event decodes the event once: the feed reads its phase sequence, the
// loop the rest.
func (d *coreDelivery) Event() (cloudevent.Event, events.Data, error) {
	if !d.decoded {
		d.e, d.d, d.err = events.Unmarshal(d.msg)
		d.decoded = true
	}
	return d.e, d.d, d.err
}

// phaseSeq returns the phase sequence of a phase (0 for anything else) and
// whether it is a committed outcome.
func (d *coreDelivery) phaseSeq() (q uint64, outcome bool) {
	_, data, err := d.Event()
	if err != nil {
		return 0, false
	}
	if _, ok := data.(events.CheckpointCommitted); ok {
		return 0, true
	}
	if pe, ok := data.(events.PhaseEvent); ok {
		return pe.Header().Seq, false
	}
	return 0, false
}

// follows reports whether d is a live copy whose previous live copy is at
// or before phase sequence q: nothing for a sandbox daemon lies between.
func (d *coreDelivery) follows(q uint64) bool {
	prev, err := strconv.ParseUint(d.msg.Header.Get(events.HeaderLivePrev), 10, 64)
	return err == nil && prev <= q
}

func (d *coreDelivery) eventID() string {
	e, _, _ := d.Event()
	return e.ID()
}

func (d *coreDelivery) Subject() string   { return d.msg.Subject }
func (d *coreDelivery) Sequence() uint64  { return d.seq }
func (d *coreDelivery) Delivered() uint64 { return d.delivered }
func (d *coreDelivery) InProgress() error { return nil }
func (d *coreDelivery) Term(string) error { return d.Ack() }

// Ack moves the saved position past the phase once every phase before it
// is handled too. Past a prepare it is written at once: a daemon's prepare
// ack is not on the stream (PROTOCOL §3, live acks), so a restarted daemon
// cannot tell one it answered, and would pause its launches again for a
// checkpoint long over.
func (d *coreDelivery) Ack() error {
	q, _ := d.phaseSeq()
	if q == 0 {
		return nil
	}
	_, data, _ := d.Event()
	_, prepare := data.(events.Prepare)
	return d.pos.done(q, prepare)
}

// Nak delivers the event again, locally, after delay (at least 100 ms);
// the count of deliveries goes up, so the loop checks its ack subject.
func (d *coreDelivery) Nak(delay time.Duration) error {
	d.delivered++
	d.again.after(d, max(delay, 100*time.Millisecond))
	return nil
}
