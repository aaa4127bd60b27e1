package feed

import (
	"context"
	"fmt"
	"sync"
	"time"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
)

// Delivery is one event handed to a member's loop, and the way to answer
// the server for it. The loop answers every delivery once, with Ack, Nak
// or Term; InProgress it may send any number of times before. Adapters
// exist for a durable consumer's message and for the core feed's (which
// the server never redelivers, so a Nak delivers it again locally); a
// Source brings its own.
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
// own (member.Config.Source): a process that hosts many members keeps one
// consumer for all of them (PROTOCOL §3). membertest.Host is one.
type Source interface {
	// Attach starts handing member name of run the events a member reads
	// (the run's phases, as member.DurableConfig filters them, and its
	// checkpoint.committed outcomes) and returns once every event published
	// from then on will be handed over. It must never block on inbox: an
	// event that does not fit goes back to the server. After detach
	// returns, nothing more is sent to inbox; the member gives back what
	// is left in it.
	Attach(ctx context.Context, run string, name events.Member, inbox chan<- Delivery) (detach func(), err error)
}

// Feed is where the events of one member's Run come from: opened before
// the member registers, started once it has, stopped when its loop has
// returned. After Stop returns nothing more arrives on Inbox. Durable,
// Core and Shared are the three.
type Feed interface {
	// Name names the feed in the member's logs.
	Name() string
	// Inbox is where the feed hands its deliveries.
	Inbox() <-chan Delivery
	// Start starts handing deliveries.
	Start() error
	// Stop stops the feed and waits for what it started; a second call
	// does nothing.
	Stop()
}

// LastGetter reads the last message of a subject of the stream: the
// stream's handle, or, for a user that reads no stream info, direct gets
// whose subject names what they read (jetstream.Direct).
type LastGetter interface {
	GetLastMsgForSubject(ctx context.Context, subject string) (*natsjs.RawStreamMsg, error)
}

// callTimeout bounds one call to the bus.
const callTimeout = 10 * time.Second

// retryAfter is how soon the core feed tries again a catch-up that could
// not read the stream (the server is away).
const retryAfter = time.Second

// Shared is a member's feed from a Source that its process shares among
// its members. A source hands every event to every member without waiting
// on any one: the inbox's buffer keeps one slow member from holding the
// rest up.
type Shared struct {
	src    Source
	inbox  chan Delivery
	detach func()
	once   sync.Once
}

// Attach attaches member name of run to src.
func Attach(ctx context.Context, src Source, run string, name events.Member) (*Shared, error) {
	s := &Shared{src: src, inbox: make(chan Delivery, 64)}
	detach, err := src.Attach(ctx, run, name, s.inbox)
	if err != nil {
		return nil, fmt.Errorf("member: attach to the source: %w", err)
	}
	s.detach = detach
	return s, nil
}

// Name names the source.
func (s *Shared) Name() string { return fmt.Sprintf("%v", s.src) }

// Inbox is where the source hands the member its events.
func (s *Shared) Inbox() <-chan Delivery { return s.inbox }

// Start does nothing: the source hands events from Attach on.
func (s *Shared) Start() error { return nil }

// Stop detaches the member; events handed over but never taken go back.
func (s *Shared) Stop() {
	s.once.Do(func() {
		s.detach()
		for {
			select {
			case dl := <-s.inbox:
				_ = dl.Nak(0)
			default:
				return
			}
		}
	})
}
