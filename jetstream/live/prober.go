package live

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
)

// SilenceLimit is how long a member's requests must find no responder,
// asked again in between, before the silence rule finds it gone:
// events.AliveUnanswered, which this package applies for every asker.
const SilenceLimit = events.AliveUnanswered

// Silence is the silence rule for one member (PROTOCOL §3, Liveness): a
// member whose requests find no responder, asked again in between, for
// SilenceLimit is gone, its connection closed and not coming back; one
// such answer may be a member reconnecting, which a client does in a
// second or two. The zero value is a member heard from. Time is passed in.
type Silence struct {
	since time.Time // the first request that found no responder; zero: none
}

// Heard takes the outcome of one request to the member, made at now: one
// that found no responder starts the silence (if it has not started) and
// reports whether the member is gone (Gone); an answer ends the silence;
// anything else (a timeout: the request may have been lost on the way)
// proves nothing and leaves it as it is. Only a request that found no
// responder reports the member gone.
func (s *Silence) Heard(err error, now time.Time) bool {
	switch {
	case err == nil:
		s.since = time.Time{}
	case NoResponders(err):
		if s.since.IsZero() {
			s.since = now
		}
		return s.Gone(now)
	}
	return false
}

// Gone reports whether the silence has lasted SilenceLimit at now.
func (s *Silence) Gone(now time.Time) bool {
	return !s.since.IsZero() && now.Sub(s.since) >= SilenceLimit
}

// Reset ends the silence, as an answer does.
func (s *Silence) Reset() { s.since = time.Time{} }

// Prober asks members of a run whether they are there, on their alive
// subjects (events.AliveSubject), where a member's runtime answers for as
// long as it runs; its heartbeat lives long after it died (a sandbox
// daemon's, minutes), so asking is how a waiter finds it gone sooner.
type Prober struct {
	// Conn is the connection the requests go on.
	Conn *nats.Conn
	// Run is the members' run.
	Run string
	// Every is the pause between two asks of Answers and Watch (default a
	// second).
	Every time.Duration
	// Timeout bounds one request (default Every).
	Timeout time.Duration
	// Rounds is the pause between two rounds of Watch (default
	// SilenceLimit: a member silent since the last round may be gone by
	// now).
	Rounds time.Duration
}

func (p *Prober) every() time.Duration {
	if p.Every > 0 {
		return p.Every
	}
	return time.Second
}

// Ask asks m once whether it is there, and returns its answer. q names
// the phase whose ack the asker waits for (events.AliveQuery): a member
// that answered it on core NATS says that ack again and answers with it
// (its headers and data); a zero q asks nothing more.
func (p *Prober) Ask(ctx context.Context, m events.Member, q events.AliveQuery) (*nats.Msg, error) {
	if p.Conn == nil {
		return nil, nats.ErrConnectionClosed
	}
	var body []byte
	if q.Seq > 0 {
		body, _ = json.Marshal(q)
	}
	timeout := p.Timeout
	if timeout <= 0 {
		timeout = p.every()
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return p.Conn.RequestWithContext(rctx, events.AliveSubject(p.Run, m), body)
}

// Answers asks m whether it is there, with q, at once and then every
// Every, until it answers (true), or the silence rule finds it gone
// (false), or ctx ends (true: nothing proved it gone). Each answer is
// given to answered, if not nil.
func (p *Prober) Answers(ctx context.Context, m events.Member, q events.AliveQuery, answered func(*nats.Msg)) bool {
	var s Silence
	gone := false
	_, _ = Retry(ctx, Policy{Interval: poll.Every(p.every()), Again: func(err error) bool {
		gone = s.Heard(err, time.Now())
		return err != nil && !gone
	}}, func(ctx context.Context) (*nats.Msg, error) {
		reply, err := p.Ask(ctx, m, q)
		if err == nil && answered != nil {
			answered(reply)
		}
		return reply, err
	})
	return !gone
}

// Gone asks m whether it is there until it answers or is found gone, as
// Answers does, for at most twice SilenceLimit (time for the
// rule to find it gone after a request that timed out), and reports
// whether it was found gone; not if ctx ended first.
func (p *Prober) Gone(ctx context.Context, m events.Member) bool {
	qctx, cancel := context.WithTimeout(ctx, 2*SilenceLimit)
	defer cancel()
	return !p.Answers(qctx, m, events.AliveQuery{}, nil) && ctx.Err() == nil
}

// Watch asks m whether it is there, with q, once every Rounds (each round
// as Answers asks), the first Rounds in, until ctx ends or stop is called,
// and closes gone once m is found gone. Each answer is given to answered,
// if not nil, on Watch's goroutine; stop ends it and waits for it.
func (p *Prober) Watch(ctx context.Context, m events.Member, q events.AliveQuery, answered func(*nats.Msg)) (gone <-chan struct{}, stop func()) {
	dead := make(chan struct{})
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(ctx)
	rounds := p.Rounds
	if rounds <= 0 {
		rounds = SilenceLimit
	}
	go func() {
		defer close(done)
		first := true
		_ = poll.Until(ctx, poll.Every(rounds), func() (bool, error) {
			switch {
			case first:
				first = false
				return false, nil
			case ctx.Err() != nil:
				return true, nil
			case !p.Answers(ctx, m, q, answered):
				close(dead)
				return true, nil
			}
			return false, nil
		})
	}()
	return dead, func() {
		cancel()
		<-done
	}
}
