package feed

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
)

// outcomeFeed is how a member on a durable consumer of its own hears the
// committed outcomes a stop commit parks on (PROTOCOL §5, commit): its
// consumer reads the run's phases alone, so that its create subject names
// its one filter and its user may create it with no other
// (docs/PERMISSIONS.md). A core subscription hands each outcome to the
// loop, among the phases. Order needs nothing more: the bridge publishes
// the outcome after the member's commit ack, so after the member has
// handled the commit. One published while the connection was down is the
// newest (a fleet parked by a stop commit commits nothing more in its
// epoch), read after every reconnect by a direct get whose subject names
// it; one missed anyway is the lease's to stand in for (§5, Lease).
type outcomeFeed struct {
	nc      *nats.Conn
	stream  LastGetter
	subject string
	inbox   chan<- Delivery
	log     zerolog.Logger

	sub      *nats.Subscription
	status   chan nats.Status
	stopping chan struct{}
	done     chan struct{} // closed when run returns
	once     sync.Once
}

// start subscribes and starts the goroutine that reads the newest outcome
// after a reconnect.
func (o *outcomeFeed) start() error {
	o.status = o.nc.StatusChanged(nats.CONNECTED)
	sub, err := o.nc.Subscribe(o.subject, func(msg *nats.Msg) { o.hand(msg) })
	if err != nil {
		o.nc.RemoveStatusListener(o.status)
		return fmt.Errorf("member: subscribe %s: %w", o.subject, err)
	}
	o.sub = sub
	go o.run()
	return nil
}

// run reads the newest outcome after each reconnect, until stop.
func (o *outcomeFeed) run() {
	defer close(o.done)
	for {
		select {
		case <-o.stopping:
			return
		case <-o.status:
		}
		ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
		msg, err := o.stream.GetLastMsgForSubject(ctx, o.subject)
		cancel()
		switch {
		case errors.Is(err, natsjs.ErrMsgNotFound):
		case err != nil:
			o.log.Warn().Err(err).Str("subject", o.subject).Msg("reconnected; cannot read the newest committed outcome")
		default:
			o.hand(&nats.Msg{Subject: msg.Subject, Header: msg.Header, Data: msg.Data})
		}
	}
}

// hand gives msg to the loop, unless the feed stops first.
func (o *outcomeFeed) hand(msg *nats.Msg) {
	select {
	case o.inbox <- &outcomeDelivery{msg: msg}:
	case <-o.stopping:
	}
}

// stop ends the subscription and the goroutine, and waits for it.
func (o *outcomeFeed) stop() {
	o.once.Do(func() {
		close(o.stopping)
		if o.sub == nil {
			return
		}
		_ = o.sub.Unsubscribe()
		o.nc.RemoveStatusListener(o.status)
		<-o.done
	})
}

// outcomeDelivery is an outcome of the outcome feed: nothing on the
// server to answer, and one given back is not wanted again (the machine
// takes an outcome once).
type outcomeDelivery struct{ msg *nats.Msg }

func (d *outcomeDelivery) Subject() string { return d.msg.Subject }
func (d *outcomeDelivery) Event() (cloudevent.Event, events.Data, error) {
	return events.Unmarshal(d.msg)
}
func (d *outcomeDelivery) Sequence() uint64        { return 0 }
func (d *outcomeDelivery) Delivered() uint64       { return 1 }
func (d *outcomeDelivery) Ack() error              { return nil }
func (d *outcomeDelivery) Nak(time.Duration) error { return nil }
func (d *outcomeDelivery) Term(string) error       { return nil }
func (d *outcomeDelivery) InProgress() error       { return nil }
