package membertest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/feed"
)

// HostConfig configures a Host.
type HostConfig struct {
	// Run is the run id. Required.
	Run string
	// Name names the process's consumer, sp_<run>_host_<name>; use one
	// name per process (a restarted process of the same name resumes the
	// consumer). Required; a subject token.
	Name string
	// JS and Bus are as in member.Config. Required.
	JS  natsjs.JetStream
	Bus *jetstream.Bus
	// Logger receives the host's logs.
	Logger zerolog.Logger
}

// ErrHostStopped is returned by Host.Attach once the host has stopped.
var ErrHostStopped = errors.New("membertest: host stopped")

// callTimeout bounds the host's calls to the bus.
const callTimeout = 10 * time.Second

// Host lets the members of one process share one consumer: PROTOCOL §3
// keeps one consumer per process, never one per member of a process that
// hosts many (a test fleet, a benchmark). It consumes the run's phases
// once, decodes each event once, and hands it to every member attached:
// it is a feed.Source (member.Config.Source). The server's message is
// acknowledged when every member has answered it, and redelivered if any
// member gave it back.
type Host struct {
	cfg   HostConfig
	log   zerolog.Logger
	ready chan struct{}

	mu      sync.Mutex
	members map[events.Member]chan<- feed.Delivery
	stopped bool
}

var _ feed.Source = (*Host)(nil)

// NewHost checks cfg and returns a host ready to Run.
func NewHost(cfg HostConfig) (*Host, error) {
	var errs []error
	if err := events.ValidateRun(cfg.Run); err != nil {
		errs = append(errs, fmt.Errorf("%w: HostConfig.Run: %v", member.ErrInvalidConfig, err))
	}
	if err := events.ValidateToken("name", cfg.Name); err != nil {
		errs = append(errs, fmt.Errorf("%w: HostConfig.Name: %v", member.ErrInvalidConfig, err))
	}
	if cfg.JS == nil || cfg.Bus == nil || cfg.Bus.Stream == nil {
		errs = append(errs, fmt.Errorf("%w: HostConfig.JS and Bus are required", member.ErrInvalidConfig))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Host{cfg: cfg, ready: make(chan struct{}), members: map[events.Member]chan<- feed.Delivery{},
		log: cfg.Logger.With().Str("run", cfg.Run).Str("host", cfg.Name).Logger()}, nil
}

// HostConsumerName returns the durable consumer name of a host.
func HostConsumerName(run, name string) string {
	esc := func(s string) string { return strings.ReplaceAll(s, "_", "__") }
	return "sp_" + esc(run) + "_host_" + esc(name)
}

// String names the host's consumer, for the members' logs.
func (h *Host) String() string { return HostConsumerName(h.cfg.Run, h.cfg.Name) }

// Run creates (or resumes) the host's consumer and delivers events to the
// attached members until ctx ends. Members attach once it is consuming.
func (h *Host) Run(ctx context.Context) error {
	name := HostConsumerName(h.cfg.Run, h.cfg.Name)
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	// A process of many members hands them the committed outcomes too
	// (feed.Source): its one consumer reads both.
	cfg := member.DurableConfig(h.cfg.Run, name, fmt.Sprintf("phases of run %s for the members of process %s", h.cfg.Run, h.cfg.Name))
	cfg.FilterSubject, cfg.FilterSubjects = "", []string{cfg.FilterSubject, events.OutcomeSubject(h.cfg.Run, events.TypeCheckpointCommitted)}
	cons, err := h.cfg.Bus.Stream.CreateOrUpdateConsumer(cctx, cfg)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("membertest: host consumer %s: %w", name, err)
	}
	msgs := make(chan natsjs.Msg, 64)
	cc, err := cons.Consume(func(m natsjs.Msg) {
		select {
		case msgs <- m:
		case <-ctx.Done():
		}
	}, natsjs.ConsumeErrHandler(func(_ natsjs.ConsumeContext, err error) {
		h.log.Debug().Err(err).Msg("consume")
	}))
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("membertest: host consume: %w", err)
	}
	defer func() { cc.Stop(); <-cc.Closed() }()
	close(h.ready)
	defer func() {
		h.mu.Lock()
		h.stopped = true
		h.mu.Unlock()
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-msgs:
			h.dispatch(ctx, m)
		}
	}
}

// dispatch decodes one event and hands it to every member.
func (h *Host) dispatch(ctx context.Context, m natsjs.Msg) {
	e, d, err := events.Unmarshal(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
	if err != nil {
		h.log.Error().Err(err).Str("subject", m.Subject()).Msg("malformed event refused")
		reason := err.Error()
		if len(reason) > 200 {
			reason = reason[:200]
		}
		_ = m.TermWithReason(reason)
		return
	}
	h.mu.Lock()
	targets := make([]chan<- feed.Delivery, 0, len(h.members))
	for _, in := range h.members {
		targets = append(targets, in)
	}
	h.mu.Unlock()
	if len(targets) == 0 {
		_ = m.Ack()
		return
	}
	shared := &sharedDelivery{msg: m, event: e, data: d, delivered: 1}
	if md, err := m.Metadata(); err == nil {
		shared.seq, shared.delivered = md.Sequence.Stream, md.NumDelivered
	}
	shared.left.Store(int32(len(targets)))
	for _, in := range targets {
		// Never wait on one member: one whose loop is busy (a long retire,
		// a slow participant) gives its share back, and the server
		// delivers the event again to everyone; those that answered it
		// find their ack on the bus and do nothing.
		select {
		case in <- shared:
		case <-ctx.Done():
			_ = shared.Nak(0)
		default:
			_ = shared.Nak(time.Second)
		}
	}
}

// Attach implements feed.Source: it waits until the host consumes, then
// hands member name every event.
func (h *Host) Attach(ctx context.Context, run string, name events.Member, inbox chan<- feed.Delivery) (func(), error) {
	if run != h.cfg.Run {
		return nil, fmt.Errorf("%w: member %s of run %s attached to the host of run %s", member.ErrInvalidConfig, name, run, h.cfg.Run)
	}
	select {
	case <-h.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return nil, ErrHostStopped
	}
	if _, ok := h.members[name]; ok {
		return nil, fmt.Errorf("membertest: member %s is attached to host %s already", name, h.cfg.Name)
	}
	h.members[name] = inbox
	return func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		if h.members[name] == inbox {
			delete(h.members, name)
		}
	}, nil
}

// JetStream returns the host's JetStream handle: members of the process
// can share its connection (member.Config.JS) as they share its consumer.
func (h *Host) JetStream() natsjs.JetStream { return h.cfg.JS }

// Bus returns the host's bus.
func (h *Host) Bus() *jetstream.Bus { return h.cfg.Bus }

// sharedDelivery is one server message shared by the members of a host,
// decoded once: it is acknowledged once every member has answered it, and
// given back if any member gave it back, with the longest delay asked.
type sharedDelivery struct {
	msg       natsjs.Msg
	event     cloudevent.Event
	data      events.Data
	seq       uint64
	delivered uint64

	left  atomic.Int32
	mu    sync.Mutex
	nak   bool
	delay time.Duration
}

func (s *sharedDelivery) Subject() string { return s.msg.Subject() }
func (s *sharedDelivery) Event() (cloudevent.Event, events.Data, error) {
	return s.event, s.data, nil
}
func (s *sharedDelivery) Sequence() uint64  { return s.seq }
func (s *sharedDelivery) Delivered() uint64 { return s.delivered }
func (s *sharedDelivery) InProgress() error { return s.msg.InProgress() }
func (s *sharedDelivery) Ack() error        { return s.done() }
func (s *sharedDelivery) Term(string) error { return s.done() }

func (s *sharedDelivery) Nak(delay time.Duration) error {
	s.mu.Lock()
	s.nak = true
	s.delay = max(s.delay, delay)
	s.mu.Unlock()
	return s.done()
}

// done counts one member's answer; the last answers the server.
func (s *sharedDelivery) done() error {
	if s.left.Add(-1) != 0 {
		return nil
	}
	s.mu.Lock()
	nak, delay := s.nak, s.delay
	s.mu.Unlock()
	if nak {
		return s.msg.NakWithDelay(delay)
	}
	return s.msg.Ack()
}
