package member

import (
	"context"
	"fmt"
	"time"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"

	"github.com/stillpoint/stillpoint/events"
)

// Delivery is one event handed to a member's loop, and the way to answer
// the server for it. The loop answers every delivery once, with Ack, Nak
// or Term; InProgress it may send any number of times before. Adapters
// exist for a durable consumer's message and for an ordered consumer's
// (which the server never redelivers, so a Nak delivers it again
// locally); a Source brings its own.
type Delivery interface {
	// Subject is the subject the event was published on.
	Subject() string
	// Event decodes the event; a Source that feeds many members decodes
	// it once for all of them.
	Event() (cloudevent.Event, events.Data, error)
	// Sequence is the event's stream sequence.
	Sequence() uint64
	// Delivered counts this delivery: 1 the first time the member gets
	// the event, more when it comes again.
	Delivered() uint64
	// Ack says the event is handled.
	Ack() error
	// Nak gives the event back, to be delivered again after delay.
	Nak(delay time.Duration) error
	// Term refuses the event for good; reason says why.
	Term(reason string) error
	// InProgress asks for more time before the event is delivered again.
	InProgress() error
}

// Source feeds members the run's events in place of a consumer of their
// own (Config.Source): a process that hosts many members keeps one
// consumer for all of them (PROTOCOL §3). membertest.Host is one.
type Source interface {
	// Attach starts handing member name of run the events a member reads
	// (the run's phases, as DurableConfig filters them, and its
	// checkpoint.committed outcomes) and returns once every event published
	// from then on will be handed over. It must never block on inbox: an
	// event that does not fit goes back to the server. After detach
	// returns, nothing more is sent to inbox; the member gives back what
	// is left in it.
	Attach(ctx context.Context, run string, name events.Member, inbox chan<- Delivery) (detach func(), err error)
}

// feed is where the events of one Run come from: opened before the member
// registers, started once it has, stopped when the loop has returned.
// After stop returns nothing more arrives on the inbox.
type feed struct {
	name  string
	start func() error
	stop  func()
	// recreate, when set, replaces a consumer that disappeared (deleted,
	// or lost with its server) with a new one that carries on from the
	// first event not yet handled; it returns the highest stream sequence
	// the old one delivered: events up to it may have been answered. It
	// is called by the loop, between start and stop.
	recreate func(ctx context.Context) (uint64, error)
	// lost, when set, tells whether the consumer is gone though nothing
	// said it was deleted: asked after errors that a server restarted
	// without it gives (no heartbeat, no responders: a durable consumer
	// keeps its state in memory, PROTOCOL-HISTORY §31). An error means it cannot
	// tell yet (the server is away).
	lost func(ctx context.Context) (bool, error)
	// repull, when set, consumes the same consumer again: a pull request
	// that found no responders (a consumer just made on a cluster, before
	// its leader serves it) is lost, and nats.go sends the next one only
	// when it has missed two heartbeats, 30 s on, while the phases wait.
	repull func() error
	// rewind, when set, replaces the consumer with one that delivers from
	// stream sequence from on, whatever the old one delivered: for phases
	// it skipped (a delivery lost while a stream elected a leader, which a
	// durable consumer redelivers only after AckWait, behind what follows
	// it). It returns the highest stream sequence the old one delivered.
	rewind func(ctx context.Context, from uint64) (uint64, error)
}

// openFeed opens the member's feed: its Source, its core subscription, or
// a consumer of its own.
func (m *Member) openFeed(ctx context.Context) (*feed, error) {
	switch {
	case m.cfg.Source != nil:
		return m.sourceFeed(ctx)
	case m.cfg.StateFile != "" && m.cfg.CoreFeed:
		return m.coreFeed(ctx)
	case m.cfg.StateFile != "":
		return m.orderedFeed(ctx)
	default:
		return m.durableFeed(ctx)
	}
}

// sourceFeed attaches the member to its Source. A source hands every event
// to every member without waiting on any one: the inbox's buffer keeps one
// slow member from holding the rest up.
func (m *Member) sourceFeed(ctx context.Context) (*feed, error) {
	m.inbox = make(chan Delivery, 64)
	detach, err := m.cfg.Source.Attach(ctx, m.cfg.Run, m.cfg.Member, m.inbox)
	if err != nil {
		return nil, fmt.Errorf("member: attach to the source: %w", err)
	}
	return &feed{
		name:  fmt.Sprintf("%v", m.cfg.Source),
		start: func() error { return nil },
		stop: func() {
			detach()
			// Events handed over but never taken go back.
			for {
				select {
				case dl := <-m.inbox:
					_ = dl.Nak(0)
				default:
					return
				}
			}
		},
	}, nil
}
