package member

import (
	"cmp"
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
// from after the position the state file holds; for a sandbox's own user,
// the newest of each phase kind: catchUpScoped) on start, after every
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
	if pos.StreamSeq == 0 && (!m.cfg.NoPull || !based) {
		// What is published from now on: the feed starts after the member
		// registers, and its first catch-up reads what came in between.
		// The run's newest phase, before this member, says which phase
		// comes next, so that the first one the subscription delivers needs
		// no catch-up. A sandbox's own user reads no stream info
		// (Config.NoPull): its catch-up goes by phase sequence, from there.
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		if !m.cfg.NoPull {
			info, err := m.cfg.Bus.Stream.Info(cctx)
			if err != nil {
				return nil, fmt.Errorf("member: core feed: stream info: %w", err)
			}
			pos = position{StreamSeq: info.State.LastSeq}
		}
		last, err := m.stream.GetLastMsgForSubject(cctx, events.PhaseFilter(m.cfg.Run))
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
	var next natsjs.Stream
	if !m.cfg.NoPull {
		next = m.cfg.Bus.Stream
	}
	m.inbox = make(chan Delivery)
	c := &coreReader{
		nc: m.cfg.Conn, stream: m.stream, next: next, runID: m.cfg.Run, subjects: subs, scoped: m.cfg.NoPull, inbox: m.inbox,
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
	if err := c.subscribe(); err != nil {
		return nil, err
	}
	m.core = c
	return &feed{name: "core subscription, position in " + m.cfg.StateFile, start: c.start, stop: c.stop}, nil
}

// coreReader is the core feed's subscription and the one goroutine (run)
// that turns what it receives, and what the catch-ups read, into
// deliveries, in phase order.
type coreReader struct {
	nc       *nats.Conn
	stream   AckGetter
	next     natsjs.Stream // the catch-up's next-by-subject reads; nil when scoped
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
	opened  []string                 // ids of the prepares and restores delivered that no resume delivered has ended, newest last
}

// openedKept bounds coreReader.opened: one operation runs at a time, so
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
func (c *coreReader) subscribe() error {
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

// start starts the goroutine that catches up at once: what was published
// before the subscription was up is read from the stream, and what came
// after it arrived on the subscription.
func (c *coreReader) start() error {
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
		c.track(dl)
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
			msg, err := c.next.GetMsg(gctx, c.from+1, natsjs.WithGetMsgSubject(s))
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

// track keeps which operations the phases delivered opened (a prepare,
// a restore) and did not end (a resume): the member may hold one of them
// open, and a catch-up delivers what it finds of their end.
func (c *coreReader) track(dl *coreDelivery) {
	_, data, _ := dl.Event()
	pe, ok := data.(events.PhaseEvent)
	if !ok {
		return
	}
	id := pe.Header().CheckpointID
	switch pe.Phase() {
	case events.PhasePrepare, events.PhaseRestore:
		c.opened = append(slices.DeleteFunc(c.opened, func(o string) bool { return o == id }), id)
		if len(c.opened) > openedKept {
			c.opened = c.opened[1:]
		}
	case events.PhaseResume:
		c.opened = slices.DeleteFunc(c.opened, func(o string) bool { return o == id })
	}
}

// catchUpScoped is catchUp for a sandbox's own user (Config.NoPull), whose
// direct gets must name their subject and who makes no consumer
// (docs/PERMISSIONS.md): the server reads a next-by-subject request from
// its body, which no permission can limit to one run. The newest of the
// run's phases, by a direct get whose subject names the run's phases,
// tells whether anything was missed: nothing, or only that phase, in the
// common case. When more was missed, catchUpNewest reads the newest phase
// of each kind.
func (c *coreReader) catchUpScoped(ctx context.Context) error {
	if err := c.catchUpPhasesScoped(ctx); err != nil {
		return err
	}
	if len(c.subjects) == 1 {
		return nil
	}
	// A participant that parks: the newest committed outcome, which a
	// stop commit waits for (one delivered already is known by its id).
	msg, err := c.last(ctx, events.OutcomeSubject(c.runID, events.TypeCheckpointCommitted))
	if err != nil || msg == nil {
		return err
	}
	if !c.deliver(newCoreDelivery(&nats.Msg{Subject: msg.Subject, Header: msg.Header, Data: msg.Data}, msg.Sequence, c.pos, c.again)) {
		return errStopping
	}
	return nil
}

// last reads the last message on subject: nil when there is none.
func (c *coreReader) last(ctx context.Context, subject string) (*natsjs.RawStreamMsg, error) {
	gctx, cancel := context.WithTimeout(ctx, callTimeout)
	msg, err := c.stream.GetLastMsgForSubject(gctx, subject)
	cancel()
	switch {
	case ctx.Err() != nil:
		return nil, errStopping
	case errors.Is(err, natsjs.ErrMsgNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("member: core feed: direct get of the last of %s: %w", subject, err)
	}
	return msg, nil
}

func (c *coreReader) catchUpPhasesScoped(ctx context.Context) error {
	msg, err := c.last(ctx, events.PhaseFilter(c.runID))
	if err != nil || msg == nil || msg.Sequence <= c.from {
		return err
	}
	dl := newCoreDelivery(&nats.Msg{Subject: msg.Subject, Header: msg.Header, Data: msg.Data}, msg.Sequence, c.pos, c.again)
	q, _ := dl.phaseSeq()
	// What arrived meanwhile (held back while behind) may be all that was
	// missed: then flushPending delivers it, each phase as it was.
	for _, m := range c.take() {
		c.received(m, true)
	}
	switch {
	case q <= c.lastQ || c.based && q == c.lastQ+1:
		if !c.deliver(dl) {
			return errStopping
		}
		c.from = max(c.from, msg.Sequence)
		return nil
	case c.covered(q):
		return nil
	}
	return c.catchUpNewest(ctx)
}

// covered tells whether the live copies received past the last phase
// delivered lead one after the other up to phase q (the next sequence, or
// a copy that names the one before it as its previous): nothing between
// is missing.
func (c *coreReader) covered(q uint64) bool {
	if !c.based {
		return false
	}
	at := c.lastQ
	for at < q {
		next := uint64(0)
		for p, dl := range c.pending {
			if p > at && (next == 0 || p < next) && (p == at+1 || dl.follows(at)) {
				next = p
			}
		}
		if next == 0 {
			return false
		}
		at = next
	}
	return true
}

// catchUpNewest reads the newest phase of each kind (one direct get each,
// its subject naming it) and delivers, in phase order, those past what was
// delivered that the member must act on (PROTOCOL §3, Consumers): every
// phase of the run's newest operation (that of the newest phase), every
// retire, forget and release (each whole in itself: marks to keep, work to
// stop, nothing to delete for a member that holds nothing), and the
// resume, commit or renew of an operation the member opened (track). The
// rest belongs to operations that ended, whose other phases are gone
// (only the newest of each kind is kept by subject): acting on a prepare
// or a restore of those without what followed it would close admission
// for an operation long over. Before the first phase delivered of an
// operation it did not open, the loop hears that phases were missed
// (PhasesMissed): an operation still open on the member has ended by then,
// and its resume, if not among those read, is gone.
func (c *coreReader) catchUpNewest(ctx context.Context) error {
	var got []*coreDelivery
	stop := "" // the checkpoint of the newest commit, when it had stop
	for _, p := range events.Phases {
		msg, err := c.last(ctx, events.PhaseSubject(c.runID, p))
		if err != nil {
			return err
		}
		if msg == nil {
			continue
		}
		dl := newCoreDelivery(&nats.Msg{Subject: msg.Subject, Header: msg.Header, Data: msg.Data}, msg.Sequence, c.pos, c.again)
		_, data, _ := dl.Event()
		if cm, ok := data.(events.Commit); ok && cm.Stop {
			stop = cm.CheckpointID
		}
		if q, _ := dl.phaseSeq(); q != 0 && (c.based && q > c.lastQ || !c.based && msg.Sequence > c.from) {
			got = append(got, dl)
		}
	}
	if len(got) == 0 {
		return nil
	}
	slices.SortFunc(got, func(a, b *coreDelivery) int {
		qa, _ := a.phaseSeq()
		qb, _ := b.phaseSeq()
		return cmp.Compare(qa, qb)
	})
	header := func(dl *coreDelivery) (events.PhaseHeader, events.Phase) {
		_, data, _ := dl.Event()
		pe := data.(events.PhaseEvent)
		return pe.Header(), pe.Phase()
	}
	newest, _ := header(got[len(got)-1])
	c.log.Info().Uint64("last_seen", c.lastQ).Uint64("newest", newest.Seq).Str("newest_operation", newest.CheckpointID).
		Msg("more than one phase missed; acting on the newest of each kind")
	told := false
	for _, dl := range got {
		h, p := header(dl)
		opened := slices.Contains(c.opened, h.CheckpointID)
		switch {
		case h.CheckpointID == newest.CheckpointID, p == events.PhaseRetire, p == events.PhaseForget, p == events.PhaseRelease,
			opened && (p == events.PhaseResume || p == events.PhaseCommit || p == events.PhaseRenew):
		default:
			c.log.Debug().Uint64("seq", h.Seq).Str("phase", string(p)).Str("operation", h.CheckpointID).
				Msg("a phase of an operation that ended, without the phases after it: not acted on")
			c.from = max(c.from, dl.seq)
			continue
		}
		if !opened && !told {
			told = true
			select {
			case c.inbox <- missedNotice{PhasesMissed{Next: h.CheckpointID, Epoch: h.Epoch, StopCommit: stop}}:
			case <-c.stopping:
				return errStopping
			}
		}
		if !c.deliver(dl) {
			return errStopping
		}
	}
	return nil
}

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

// missedNotice is no event: it hands the loop, in order with the phases
// around it, what a catch-up that missed phases it could not read knows
// (PhasesMissed). There is nothing to answer.
type missedNotice struct{ in PhasesMissed }

func (missedNotice) Subject() string  { return "" }
func (missedNotice) Sequence() uint64 { return 0 }
func (missedNotice) Delivered() uint64 {
	return 1
}
func (missedNotice) Event() (cloudevent.Event, events.Data, error) {
	return cloudevent.Event{}, nil, errors.New("member: a notice of missed phases, not an event")
}
func (missedNotice) Ack() error              { return nil }
func (missedNotice) Nak(time.Duration) error { return nil }
func (missedNotice) Term(string) error       { return nil }
func (missedNotice) InProgress() error       { return nil }
