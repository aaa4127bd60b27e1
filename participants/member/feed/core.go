package feed

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

// CoreOptions configure a member's core feed (OpenCore).
type CoreOptions struct {
	// Run is the run id, Member the member's name.
	Run    string
	Member events.Member
	// StateFile is where the feed keeps its position (position.go): a
	// restarted process catches up from after it.
	StateFile string
	// Conn is the connection the feed subscribes on.
	Conn *nats.Conn
	// Stream is the run's stream: its info, and the catch-up's next by
	// subject reads. Nil for a user whose direct gets must name their
	// subject (member.Config.NoPull), which no next-by-subject request body
	// can be limited for: its catch-up reads the newest phase of each kind
	// (catchUpScoped).
	Stream natsjs.Stream
	// Last reads the last message of a subject.
	Last LastGetter
	// Outcomes makes the feed deliver the run's committed outcomes too:
	// for a participant that parks.
	Outcomes bool
	// Log receives the feed's logs.
	Log zerolog.Logger
}

// OpenCore opens the core feed (PROTOCOL §3, Consumers): a core-NATS
// subscription of the run's phases (and of the committed outcomes, with
// Outcomes), which costs the server nothing persistent, and catch-up from
// the stream by direct get (next by subject, from after the position the
// state file holds; for a scoped user, the newest of each phase kind:
// catchUpScoped) on start, after every reconnect, and when a phase's
// sequence is past the next one. The phases are numbered one by one, so
// the phase sequence tells a repeat (the subscription and the catch-up
// both deliver it) from a gap (the subscription missed one): each phase
// is delivered once, in order. It subscribes at once, so that every phase
// published once the member is registered reaches it.
func OpenCore(ctx context.Context, opts CoreOptions) (*Core, error) {
	pos, other, err := loadPosition(opts.StateFile, opts.Run, opts.Member)
	if err != nil {
		return nil, err
	}
	if other != "" {
		opts.Log.Info().Str("state_file", opts.StateFile).Str("written_by", other).Msg("position of another member: reading from the stream's end")
	}
	scoped := opts.Stream == nil
	based := pos.PhaseSeq != 0
	if pos.StreamSeq == 0 && (!scoped || !based) {
		// What is published from now on: the feed starts after the member
		// registers, and its first catch-up reads what came in between.
		// The run's newest phase, before this member, says which phase
		// comes next, so that the first one the subscription delivers needs
		// no catch-up. A sandbox's own user reads no stream info
		// (scoped): its catch-up goes by phase sequence, from there.
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		if !scoped {
			info, err := opts.Stream.Info(cctx)
			if err != nil {
				return nil, fmt.Errorf("member: core feed: stream info: %w", err)
			}
			pos = position{StreamSeq: info.State.LastSeq}
		}
		last, err := opts.Last.GetLastMsgForSubject(cctx, events.PhaseFilter(opts.Run))
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
	subs := []string{events.LivePhaseFilter(opts.Run)}
	if opts.Outcomes {
		subs = append(subs, events.OutcomeSubject(opts.Run, events.TypeCheckpointCommitted))
	}
	inbox := make(chan Delivery)
	c := &Core{
		nc: opts.Conn, stream: opts.Last, next: opts.Stream, runID: opts.Run, subjects: subs, scoped: scoped, inbox: inbox,
		name:     "core subscription, position in " + opts.StateFile,
		pos:      newPhaseFloor(opts.StateFile, opts.Run, opts.Member, pos, opts.Log),
		again:    &redeliverer{inbox: inbox, stopping: make(chan struct{})},
		log:      opts.Log,
		wake:     make(chan struct{}, 1),
		stopping: make(chan struct{}),
		done:     make(chan struct{}),
		from:     pos.StreamSeq,
		lastQ:    pos.PhaseSeq,
		based:    based,
		pending:  map[uint64]*coreDelivery{},
	}
	if err := c.subscribe(); err != nil {
		return nil, err
	}
	return c, nil
}

// Core is the core feed: its subscription and the one goroutine (run)
// that turns what it receives, and what the catch-ups read, into
// deliveries, in phase order.
type Core struct {
	nc       *nats.Conn
	stream   LastGetter
	next     natsjs.Stream // the catch-up's next-by-subject reads; nil when scoped
	runID    string
	subjects []string
	scoped   bool // its user direct-gets only by its run's phase subjects
	name     string
	inbox    chan Delivery
	pos      *phaseFloor
	again    *redeliverer
	log      zerolog.Logger

	mu       sync.Mutex // the subscriptions' goroutines append, run takes
	arrived  []*nats.Msg
	wake     chan struct{}
	lose     atomic.Int64 // messages the subscription is to lose (Lose)
	catchUps atomic.Int64 // catch-ups made (CatchUps)

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
	opened  []string                 // ids of the prepares and restores delivered that no resume delivered has ended, newest last
}

// openedKept bounds Core.opened: one operation runs at a time, so
// one is open at most, or a few a member refused while one was.
const openedKept = 4

// catchUpTries is how many catch-ups a gap gets before the phase after it
// is delivered anyway: a phase the subscription delivers may not be in the
// stream yet (a replica that answers the direct get behind its leader),
// and one that never is there (a publish the server refused) leaves a gap
// for good.
const catchUpTries = 5

// subscribe makes the subscriptions, when the feed opens (before the
// member registers): what arrives waits for run, so that every phase
// published once the member is registered reaches it on the subscription,
// and the first catch-up reads only what came before.
func (c *Core) subscribe() error {
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
	return nil
}

// Name names the feed: its state file.
func (c *Core) Name() string { return c.name }

// Inbox is where the feed hands the phases, in order.
func (c *Core) Inbox() <-chan Delivery { return c.inbox }

// Lose makes the subscription drop the next n messages it receives, as a
// subscription that was not up when they were published: a fault that
// tests of the catch-up inject.
func (c *Core) Lose(n int) { c.lose.Add(int64(n)) }

// CatchUps returns how many times the feed has read the stream to catch
// up (at start, at a reconnect, at a gap).
func (c *Core) CatchUps() int64 { return c.catchUps.Load() }

// Start starts the goroutine that catches up at once: what was published
// before the subscription was up is read from the stream, and what came
// after it arrived on the subscription.
func (c *Core) Start() error {
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go c.run(ctx)
	return nil
}

// Stop ends the subscription and the goroutine, and waits for it, then
// writes the position. Once: Run stops the feed again at its end.
func (c *Core) Stop() {
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

func (c *Core) unsubscribe() {
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
func (c *Core) arrive(msg *nats.Msg) {
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

func (c *Core) take() []*nats.Msg {
	c.mu.Lock()
	defer c.mu.Unlock()
	msgs := c.arrived
	c.arrived = nil
	return msgs
}

// run delivers what arrives, catching up first whenever the phase
// sequence says something was missed, after a reconnect, and at start.
func (c *Core) run(ctx context.Context) {
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
			retry.Reset(retryAfter)
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
func (c *Core) received(msg *nats.Msg, behind bool) bool {
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
func (c *Core) deliver(dl *coreDelivery) bool {
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
		c.track(dl)
	}
	select {
	case c.inbox <- dl:
		return true
	case <-c.stopping:
		return false
	}
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

// Missed is no event: the core feed hands it to the loop, in order with
// the phases around it, when a catch-up missed phases it cannot read
// again (a scoped user reads only the newest phase of each kind), and the
// next phase it delivers belongs to operation Next of Epoch; StopCommit
// names the newest commit when it had stop (member.PhasesMissed). There
// is nothing to answer.
type Missed struct {
	notice
	Next       string
	Epoch      uint64
	StopCommit string
}

// notice is a Delivery published nowhere, with nothing to answer.
type notice struct{}

func (notice) Subject() string   { return "" }
func (notice) Sequence() uint64  { return 0 }
func (notice) Delivered() uint64 { return 1 }
func (notice) Event() (cloudevent.Event, events.Data, error) {
	return cloudevent.Event{}, nil, errors.New("member: a notice of missed phases, not an event")
}
func (notice) Ack() error              { return nil }
func (notice) Nak(time.Duration) error { return nil }
func (notice) Term(string) error       { return nil }
func (notice) InProgress() error       { return nil }
