package member

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

	"github.com/stillpoint/stillpoint/events"
)

// subjects are what every member reads: the run's phases, and the
// committed outcomes that tell a stop commit to park.
func subjects(run string) []string {
	return []string{events.PhaseFilter(run), events.OutcomeSubject(run, events.TypeCheckpointCommitted)}
}

// DurableConfig returns the configuration of the one durable consumer of a
// member process (PROTOCOL §3), named name: the run's phases, its one
// filter, explicit acks, state in memory (a file-state durable costs a
// disk write per ack), delivering what is published from its creation on.
// With one filter its create subject names it, and a member's own user may
// create its consumer with that filter only (docs/PERMISSIONS.md): the
// committed outcomes a stop commit parks on come on a core subscription
// (outcomeFeed). A Source that feeds many members starts from it too.
func DurableConfig(run, name, description string) natsjs.ConsumerConfig {
	return natsjs.ConsumerConfig{
		Durable:           name,
		Description:       description,
		FilterSubject:     events.PhaseFilter(run),
		DeliverPolicy:     natsjs.DeliverNewPolicy,
		AckPolicy:         natsjs.AckExplicitPolicy,
		AckWait:           AckWait,
		MaxAckPending:     MaxAckPending,
		InactiveThreshold: ConsumerInactiveThreshold,
		MemoryStorage:     true,
	}
}

// durableFeed finds the member's durable consumer, or creates it to
// deliver only what is published from now on. If the consumer disappears
// later, the feed's recreate makes it again, from the first event the
// member has not handled.
func (m *Member) durableFeed(ctx context.Context) (*feed, error) {
	name := ConsumerName(m.cfg.Run, m.cfg.Member)
	cons, err := m.durableConsumer(ctx, name, 0)
	if err != nil {
		return nil, err
	}
	// The events delivered and not yet handled, in memory: where a new
	// consumer starts if this one disappears.
	tr := &floor{pending: map[uint64]bool{}}
	if info := cons.CachedInfo(); info != nil {
		// From the ack floor: what an earlier process was delivered and
		// did not ack is older than this process, so checked if it comes.
		tr.saved, tr.high = info.AckFloor.Stream, info.AckFloor.Stream
	}
	wrap := func(msg natsjs.Msg) Delivery { return newDurableDelivery(msg, tr) }
	m.inbox = make(chan Delivery)
	cur := m.consume(name, cons, wrap, nil)
	f := &feed{name: name}
	f.start = func() error { return cur.start() }
	f.stop = func() { cur.stop() }
	if _, parks := m.cfg.Participant.(Parker); parks {
		out := &outcomeFeed{nc: m.cfg.Conn, stream: m.stream, subject: events.OutcomeSubject(m.cfg.Run, events.TypeCheckpointCommitted),
			inbox: m.inbox, log: m.log, stopping: make(chan struct{}), done: make(chan struct{})}
		f.start = func() error {
			if err := out.start(); err != nil {
				return err
			}
			return cur.start()
		}
		f.stop = func() {
			cur.stop()
			out.stop()
		}
	}
	f.recreate = func(ctx context.Context) (uint64, error) {
		cur.stop()
		from, seen := tr.next()
		var err error
		cons, err = m.durableConsumer(ctx, name, from)
		if err != nil {
			return seen, err
		}
		cur = m.consume(name, cons, wrap, nil)
		return seen, cur.start()
	}
	f.repull = func() error {
		cur.stop()
		cur = m.consume(name, cons, wrap, nil)
		return cur.start()
	}
	f.rewind = func(ctx context.Context, from uint64) (uint64, error) {
		cur.stop()
		_, seen := tr.next()
		dctx, cancel := context.WithTimeout(ctx, callTimeout)
		err := m.cfg.Bus.Stream.DeleteConsumer(dctx, name)
		cancel()
		if err != nil && !errors.Is(err, natsjs.ErrConsumerNotFound) {
			return seen, fmt.Errorf("member: delete consumer %s to read again from %d: %w", name, from, err)
		}
		cons, err = m.durableConsumer(ctx, name, from)
		if err != nil {
			return seen, err
		}
		cur = m.consume(name, cons, wrap, nil)
		return seen, cur.start()
	}
	f.lost = func(ctx context.Context) (bool, error) {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		defer cancel()
		_, err := m.cfg.Bus.Stream.Consumer(cctx, name)
		if errors.Is(err, natsjs.ErrConsumerNotFound) {
			return true, nil
		}
		return false, err
	}
	return f, nil
}

// durableConsumer finds the durable consumer name, or creates it: to
// deliver what is published from now on when from is 0, else from stream
// sequence from on. One an earlier build made, with the committed outcomes
// as a second filter, takes the run's phases alone (update keeps where it
// was): the member's own user may create it with that one filter only.
func (m *Member) durableConsumer(ctx context.Context, name string, from uint64) (natsjs.Consumer, error) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	cons, err := m.cfg.Bus.Stream.Consumer(cctx, name)
	if err == nil && slices.Equal(cons.CachedInfo().Config.FilterSubjects, subjects(m.cfg.Run)) {
		cfg := cons.CachedInfo().Config
		cfg.FilterSubject, cfg.FilterSubjects = events.PhaseFilter(m.cfg.Run), nil
		if cons, err = m.cfg.Bus.Stream.UpdateConsumer(cctx, cfg); err != nil {
			return nil, fmt.Errorf("member: consumer %s of an earlier build to the run's phases alone: %w", name, err)
		}
		m.log.Info().Str("consumer", name).Msg("consumer of an earlier build now filters the run's phases alone")
	}
	if errors.Is(err, natsjs.ErrConsumerNotFound) {
		cfg := DurableConfig(m.cfg.Run, name, fmt.Sprintf("phases of run %s for member %s", m.cfg.Run, m.cfg.Member))
		if from > 0 {
			cfg.DeliverPolicy, cfg.OptStartSeq = natsjs.DeliverByStartSequencePolicy, from
		}
		cons, err = m.cfg.Bus.Stream.CreateConsumer(cctx, cfg)
		if errors.Is(err, natsjs.ErrConsumerExists) {
			cons, err = m.cfg.Bus.Stream.Consumer(cctx, name)
		}
		if err != nil {
			return nil, fmt.Errorf("member: create consumer %s: %w", name, err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("member: look up consumer %s: %w", name, err)
	}
	return cons, nil
}

// consume is the feed of a consumer of the member's own: wrap makes each
// message a Delivery, and again (when set) waits for the local
// redeliveries a stop must not outlive.
func (m *Member) consume(name string, cons natsjs.Consumer, wrap func(natsjs.Msg) Delivery, again func()) *feed {
	stopping := make(chan struct{})
	var cc natsjs.ConsumeContext
	f := &feed{name: name}
	f.start = func() error {
		var err error
		cc, err = cons.Consume(func(msg natsjs.Msg) {
			dl := wrap(msg)
			select {
			case m.inbox <- dl:
			case <-stopping:
				_ = dl.Nak(0) // for the next process of this member
			}
		}, natsjs.ConsumeErrHandler(func(_ natsjs.ConsumeContext, err error) {
			// Runs on a nats.go goroutine: hand the error to the loop, which
			// logs it, so that nothing logs once Run has returned.
			select {
			case m.consumeErrs <- err:
			default:
			}
		}))
		if err != nil {
			return fmt.Errorf("member: consume: %w", err)
		}
		return nil
	}
	var once sync.Once
	f.stop = func() {
		// Once: a remake that failed stopped this feed already, and Run
		// stops it again at its end.
		once.Do(func() {
			// Local redeliveries end first: a message the handler gives
			// back once stopping is closed then finds them stopped, and no
			// new one starts.
			if again != nil {
				again()
			}
			close(stopping)
			if cc != nil {
				cc.Stop()
				<-cc.Closed()
			}
		})
	}
	return f
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
		_ = d.handled.done(d.seq) // no state file: nothing to fail
	}
}
func (d *durableDelivery) InProgress() error { return d.msg.InProgress() }

func (d *durableDelivery) Nak(delay time.Duration) error {
	if delay <= 0 {
		return d.msg.Nak()
	}
	return d.msg.NakWithDelay(delay)
}
