package bridge

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// ackRecords stores in the stream the acks of sandbox daemons that a
// gathering heard on core NATS and whose phase keeps its acks there
// (events.AckRecorded: commit, restore, retire, forget, release), each on
// its ack subject, once (expected last subject sequence 0), as the
// daemon's own event. The audit log, a bridge that replays the phase and a
// daemon that sees the phase again then find it on the stream, where a
// daemon, whose credentials write nothing there, cannot put it (PROTOCOL
// §3, live acks). A gathering records only the acks its
// gate took: one a daemon, at most. It is used on the driver's goroutine;
// its workers publish, and close waits for them.
type ackRecords struct {
	js     natsjs.JetStream
	ctx    context.Context // the publishes'
	log    zerolog.Logger
	queue  chan *nats.Msg
	wg     sync.WaitGroup
	failed atomic.Int64
	first  atomic.Pointer[error] // the first publish that failed
	closed bool
}

// recordWorkers is how many records are published at once: a release to
// 10,000 daemons stores 10,000 acks, as many as the daemons stored before.
const recordWorkers = 16

// add queues ev, the event of ack, for the stream. Its Nats-Msg-Id would
// be its ce-id, which the daemon chose: an id it chose could take another
// message's place in the stream's duplicate window, so the record has
// none; the once-only subject keeps a second one out instead.
func (r *ackRecords) add(ev cloudevent.Event, ack events.Ack) {
	if r.closed {
		return
	}
	h := ack.Header()
	msg, err := events.Encode(events.AckSubject(h.Run, h.Seq, ack.Answers(), h.Member), ev)
	if err != nil {
		r.log.Warn().Err(err).Str("member", string(h.Member)).Msg("cannot record a sandbox daemon's ack")
		return
	}
	delete(msg.Header, events.HeaderMsgID)
	if r.queue == nil {
		r.queue = make(chan *nats.Msg, 1024)
		for range recordWorkers {
			r.wg.Go(r.work)
		}
	}
	r.queue <- msg
}

// work publishes queued records until the queue is closed.
func (r *ackRecords) work() {
	for msg := range r.queue {
		ctx, cancel := context.WithTimeout(r.ctx, publishAttemptTimeout)
		_, err := jetstream.PublishOnce(ctx, r.js, msg)
		cancel()
		if err != nil && !errors.Is(err, jetstream.ErrAlreadyDone) {
			r.failed.Add(1)
			r.first.CompareAndSwap(nil, &err)
		}
	}
}

// close waits until every record queued is published (or failed), and
// logs the failures: a record that is missing costs the audit log that
// ack, and a replaying bridge asks the daemon for it again (PROTOCOL §3,
// Liveness).
func (r *ackRecords) close() {
	if r.closed {
		return
	}
	r.closed = true
	if r.queue == nil {
		return
	}
	close(r.queue)
	r.wg.Wait()
	if n := r.failed.Load(); n > 0 {
		r.log.Warn().Err(*r.first.Load()).Int64("failed", n).Msg("cannot record sandbox daemons' acks in the stream")
	}
}
