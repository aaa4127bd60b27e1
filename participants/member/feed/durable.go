package feed

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
)

// DurableOptions configure a member's durable consumer (OpenDurable).
type DurableOptions struct {
	// Run is the run id.
	Run string
	// Stream is the run's stream, which holds the consumer.
	Stream natsjs.Stream
	// Consumer is the consumer's configuration (member.DurableConfig),
	// Durable its name: it is created so when it does not exist, and made
	// again from the first event not handled when it disappears.
	Consumer natsjs.ConsumerConfig
	// Outcomes makes the feed hear the run's committed outcomes too, on a
	// core subscription of Conn, the newest read by Last after a reconnect:
	// for a participant that parks.
	Outcomes bool
	Conn     *nats.Conn
	Last     LastGetter
	// Errs receives the consumer's errors; a send never blocks. The
	// member's loop logs them and acts: Recreate, Lost, Repull.
	Errs chan<- error
	// Log receives the feed's logs.
	Log zerolog.Logger
}

// Durable is the feed of a member's one durable consumer (PROTOCOL §3),
// with, for a participant that parks, the committed outcomes on a core
// subscription (outcomeFeed). The server redelivers what is given back.
// When the consumer disappears, Recreate makes it again, from the first
// event the member has not handled. The methods but Stop are the member's
// loop's to call, between Start and Stop.
type Durable struct {
	opts  DurableOptions
	cons  natsjs.Consumer
	inbox chan Delivery
	out   *outcomeFeed // nil when the participant does not park
	cur   *consuming
	// handled is the events delivered and not yet handled, in memory:
	// where a new consumer starts if this one disappears.
	handled *floor
}

// OpenDurable finds the member's durable consumer, or creates it to
// deliver only what is published from now on.
func OpenDurable(ctx context.Context, opts DurableOptions) (*Durable, error) {
	d := &Durable{opts: opts, inbox: make(chan Delivery), handled: &floor{pending: map[uint64]bool{}}}
	cons, err := d.consumer(ctx, 0)
	if err != nil {
		return nil, err
	}
	d.cons = cons
	if info := cons.CachedInfo(); info != nil {
		// From the ack floor: what an earlier process was delivered and
		// did not ack is older than this process, so checked if it comes.
		d.handled.saved, d.handled.high = info.AckFloor.Stream, info.AckFloor.Stream
	}
	d.cur = d.consume()
	if opts.Outcomes {
		d.out = &outcomeFeed{nc: opts.Conn, stream: opts.Last, subject: events.OutcomeSubject(opts.Run, events.TypeCheckpointCommitted),
			inbox: d.inbox, log: opts.Log, stopping: make(chan struct{}), done: make(chan struct{})}
	}
	return d, nil
}

// Name is the consumer's name.
func (d *Durable) Name() string { return d.opts.Consumer.Durable }

// Inbox is where the consumer's messages, and the outcomes, arrive.
func (d *Durable) Inbox() <-chan Delivery { return d.inbox }

// Start subscribes to the outcomes, then consumes.
func (d *Durable) Start() error {
	if d.out != nil {
		if err := d.out.start(); err != nil {
			return err
		}
	}
	return d.cur.start()
}

// Stop stops consuming and the outcomes' subscription, and waits for them.
func (d *Durable) Stop() {
	d.cur.stop()
	if d.out != nil {
		d.out.stop()
	}
}

// Recreate replaces a consumer that disappeared (deleted, or lost with
// its server) with a new one that carries on from the first event not yet
// handled; it returns the highest stream sequence the old one delivered:
// events up to it may have been answered.
func (d *Durable) Recreate(ctx context.Context) (uint64, error) {
	d.cur.stop()
	from, seen := d.handled.next()
	cons, err := d.consumer(ctx, from)
	if err != nil {
		return seen, err
	}
	d.cons = cons
	d.cur = d.consume()
	return seen, d.cur.start()
}

// Repull consumes the same consumer again: a pull request that found no
// responders (a consumer just made on a cluster, before its leader serves
// it) is lost, and nats.go sends the next one only when it has missed two
// heartbeats, 30 s on, while the phases wait.
func (d *Durable) Repull() error {
	d.cur.stop()
	d.cur = d.consume()
	return d.cur.start()
}

// Rewind replaces the consumer with one that delivers from stream
// sequence from on, whatever the old one delivered: for phases it skipped
// (a delivery lost while a stream elected a leader, which a durable
// consumer redelivers only after AckWait, behind what follows it). It
// returns the highest stream sequence the old one delivered.
func (d *Durable) Rewind(ctx context.Context, from uint64) (uint64, error) {
	d.cur.stop()
	_, seen := d.handled.next()
	name := d.Name()
	dctx, cancel := context.WithTimeout(ctx, callTimeout)
	err := d.opts.Stream.DeleteConsumer(dctx, name)
	cancel()
	if err != nil && !errors.Is(err, natsjs.ErrConsumerNotFound) {
		return seen, fmt.Errorf("member: delete consumer %s to read again from %d: %w", name, from, err)
	}
	cons, err := d.consumer(ctx, from)
	if err != nil {
		return seen, err
	}
	d.cons = cons
	d.cur = d.consume()
	return seen, d.cur.start()
}

// Lost tells whether the consumer is gone though nothing said it was
// deleted: asked after errors that a server restarted without it gives
// (no heartbeat, no responders: a durable consumer keeps its state in
// memory, PROTOCOL-HISTORY §31). An error means it cannot tell yet (the
// server is away).
func (d *Durable) Lost(ctx context.Context) (bool, error) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	_, err := d.opts.Stream.Consumer(cctx, d.Name())
	if errors.Is(err, natsjs.ErrConsumerNotFound) {
		return true, nil
	}
	return false, err
}

// consumer finds the durable consumer, or creates it: to deliver what is
// published from now on when from is 0, else from stream sequence from
// on. One an earlier build made, with the committed outcomes as a second
// filter, takes the run's phases alone (update keeps where it was): the
// member's own user may create it with that one filter only.
func (d *Durable) consumer(ctx context.Context, from uint64) (natsjs.Consumer, error) {
	name, stream := d.Name(), d.opts.Stream
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	cons, err := stream.Consumer(cctx, name)
	earlier := []string{events.PhaseFilter(d.opts.Run), events.OutcomeSubject(d.opts.Run, events.TypeCheckpointCommitted)}
	if err == nil && slices.Equal(cons.CachedInfo().Config.FilterSubjects, earlier) {
		cfg := cons.CachedInfo().Config
		cfg.FilterSubject, cfg.FilterSubjects = events.PhaseFilter(d.opts.Run), nil
		if cons, err = stream.UpdateConsumer(cctx, cfg); err != nil {
			return nil, fmt.Errorf("member: consumer %s of an earlier build to the run's phases alone: %w", name, err)
		}
		d.opts.Log.Info().Str("consumer", name).Msg("consumer of an earlier build now filters the run's phases alone")
	}
	if errors.Is(err, natsjs.ErrConsumerNotFound) {
		cfg := d.opts.Consumer
		if from > 0 {
			cfg.DeliverPolicy, cfg.OptStartSeq = natsjs.DeliverByStartSequencePolicy, from
		}
		cons, err = stream.CreateConsumer(cctx, cfg)
		if errors.Is(err, natsjs.ErrConsumerExists) {
			cons, err = stream.Consumer(cctx, name)
		}
		if err != nil {
			return nil, fmt.Errorf("member: create consumer %s: %w", name, err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("member: look up consumer %s: %w", name, err)
	}
	return cons, nil
}

// consuming is one Consume of the consumer: Recreate, Repull and Rewind
// stop it and start another.
type consuming struct {
	start func() error
	stop  func()
}

// consume makes each message of the consumer a Delivery for the inbox.
func (d *Durable) consume() *consuming {
	cons := d.cons
	stopping := make(chan struct{})
	var cc natsjs.ConsumeContext
	c := &consuming{}
	c.start = func() error {
		var err error
		cc, err = cons.Consume(func(msg natsjs.Msg) {
			dl := newDurableDelivery(msg, d.handled)
			select {
			case d.inbox <- dl:
			case <-stopping:
				_ = dl.Nak(0) // for the next process of this member
			}
		}, natsjs.ConsumeErrHandler(func(_ natsjs.ConsumeContext, err error) {
			// Runs on a nats.go goroutine: hand the error to the loop, which
			// logs it, so that nothing logs once Run has returned.
			select {
			case d.opts.Errs <- err:
			default:
			}
		}))
		if err != nil {
			return fmt.Errorf("member: consume: %w", err)
		}
		return nil
	}
	var once sync.Once
	c.stop = func() {
		// Once: a remake that failed stopped this one already, and Run
		// stops the feed again at its end.
		once.Do(func() {
			close(stopping)
			if cc != nil {
				cc.Stop()
				<-cc.Closed()
			}
		})
	}
	return c
}

// floor tracks which delivered events are handled: a new consumer starts
// after the highest stream sequence below which all are.
type floor struct {
	mu      sync.Mutex // the consumer's goroutine delivers, the loop handles
	pending map[uint64]bool
	high    uint64 // highest sequence delivered
	saved   uint64
}

func (f *floor) delivered(seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending[seq] = true
	f.high = max(f.high, seq)
}

// done marks seq handled and moves the floor.
func (f *floor) done(seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pending, seq)
	at := f.high
	for s := range f.pending {
		at = min(at, s-1)
	}
	f.saved = max(f.saved, at)
}

// next returns the first stream sequence not known to be handled, and the
// highest sequence delivered.
func (f *floor) next() (from, high uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	at := max(f.high, f.saved)
	for s := range f.pending {
		at = min(at, s-1)
	}
	return at + 1, f.high
}

// decode decodes a JetStream message as an event.
func decode(msg natsjs.Msg) (cloudevent.Event, events.Data, error) {
	return events.Unmarshal(&nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()})
}

// durableDelivery is a message of a durable consumer: the server
// redelivers what is given back, or not acknowledged within AckWait.
type durableDelivery struct {
	msg       natsjs.Msg
	seq       uint64
	delivered uint64
	handled   *floor
}

func newDurableDelivery(msg natsjs.Msg, handled *floor) *durableDelivery {
	d := &durableDelivery{msg: msg, delivered: 1, handled: handled}
	if md, err := msg.Metadata(); err == nil {
		d.seq, d.delivered = md.Sequence.Stream, md.NumDelivered
		handled.delivered(d.seq)
	}
	return d
}

func (d *durableDelivery) Subject() string                               { return d.msg.Subject() }
func (d *durableDelivery) Event() (cloudevent.Event, events.Data, error) { return decode(d.msg) }
func (d *durableDelivery) Sequence() uint64                              { return d.seq }
func (d *durableDelivery) Delivered() uint64                             { return d.delivered }

// Ack and Term mark the event handled (a new consumer would not start
// before it), whether or not the server still has the consumer.
func (d *durableDelivery) Ack() error {
	d.done()
	return d.msg.Ack()
}

func (d *durableDelivery) Term(reason string) error {
	d.done()
	return d.msg.TermWithReason(reason)
}

func (d *durableDelivery) done() {
	if d.seq != 0 {
		d.handled.done(d.seq)
	}
}
func (d *durableDelivery) InProgress() error { return d.msg.InProgress() }

func (d *durableDelivery) Nak(delay time.Duration) error {
	if delay <= 0 {
		return d.msg.Nak()
	}
	return d.msg.NakWithDelay(delay)
}
