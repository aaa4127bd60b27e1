package member

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
)

// HostConfig configures a Host.
type HostConfig struct {
	// Run is the run id. Required.
	Run string
	// Name names the process's consumer, sp_<run>_host_<name>; use one
	// name per process (a restarted process of the same name resumes the
	// consumer). Required; a subject token.
	Name string
	// JS and Bus are as in Config. Required.
	JS  natsjs.JetStream
	Bus *jetstream.Bus
	// Logger receives the host's logs.
	Logger zerolog.Logger
}

// Host lets the members of one process share one consumer: PROTOCOL §3
// keeps one consumer per process, never one per member of a process that
// hosts many (a test fleet, a benchmark, an agent server that runs many
// sandboxes' members). It consumes the run's phases once, decodes each
// event once, and hands it to every member attached (Config.Host). The
// server's message is acknowledged when every member has answered it, and
// redelivered if any member gave it back.
type Host struct {
	cfg   HostConfig
	log   zerolog.Logger
	ready chan struct{}

	mu      sync.Mutex
	members map[*Member]chan delivery
	stopped bool
}

// NewHost checks cfg and returns a host ready to Run.
func NewHost(cfg HostConfig) (*Host, error) {
	var errs []error
	if err := events.ValidateRun(cfg.Run); err != nil {
		errs = append(errs, fmt.Errorf("%w: HostConfig.Run: %v", ErrInvalidConfig, err))
	}
	if err := events.ValidateToken("name", cfg.Name); err != nil {
		errs = append(errs, fmt.Errorf("%w: HostConfig.Name: %v", ErrInvalidConfig, err))
	}
	if cfg.JS == nil || cfg.Bus == nil || cfg.Bus.Stream == nil {
		errs = append(errs, fmt.Errorf("%w: HostConfig.JS and Bus are required", ErrInvalidConfig))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Host{cfg: cfg, ready: make(chan struct{}), members: map[*Member]chan delivery{},
		log: cfg.Logger.With().Str("run", cfg.Run).Str("host", cfg.Name).Logger()}, nil
}

// HostConsumerName returns the durable consumer name of a host.
func HostConsumerName(run, name string) string {
	esc := func(s string) string { return strings.ReplaceAll(s, "_", "__") }
	return "sp_" + esc(run) + "_host_" + esc(name)
}

// Run creates (or resumes) the host's consumer and delivers events to the
// attached members until ctx ends. Members attach once it is consuming.
func (h *Host) Run(ctx context.Context) error {
	name := HostConsumerName(h.cfg.Run, h.cfg.Name)
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	cons, err := h.cfg.Bus.Stream.CreateOrUpdateConsumer(cctx,
		durableConfig(h.cfg.Run, name, fmt.Sprintf("phases of run %s for the members of process %s", h.cfg.Run, h.cfg.Name)))
	cancel()
	if err != nil {
		return startErr(ctx, fmt.Errorf("member: host consumer %s: %w", name, err))
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
		return startErr(ctx, fmt.Errorf("member: host consume: %w", err))
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
		_ = m.TermWithReason(clipReason(err.Error()))
		return
	}
	h.mu.Lock()
	targets := make([]chan delivery, 0, len(h.members))
	for _, in := range h.members {
		targets = append(targets, in)
	}
	h.mu.Unlock()
	if len(targets) == 0 {
		_ = m.Ack()
		return
	}
	shared := &sharedMsg{Msg: m}
	shared.left.Store(int32(len(targets)))
	for _, in := range targets {
		// Never wait on one member: one whose loop is busy (a long retire,
		// a slow participant) gives its share back, and the server
		// delivers the event again to everyone; those that answered it
		// find their ack on the bus and do nothing.
		select {
		case in <- delivery{msg: shared, event: e, data: d}:
		case <-ctx.Done():
			_ = shared.Nak()
		default:
			_ = shared.NakWithDelay(time.Second)
		}
	}
}

// attach registers a member; it waits until the host consumes.
func (h *Host) attach(ctx context.Context, m *Member, in chan delivery) error {
	select {
	case <-h.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.stopped {
		return errors.New("member: host stopped")
	}
	h.members[m] = in
	return nil
}

func (h *Host) detach(m *Member) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.members, m)
}

// delivery is one event for a member's loop: the message to answer and,
// when a host decoded it, the event.
type delivery struct {
	msg   natsjs.Msg
	event cloudevent.Event
	data  events.Data
}

// sharedMsg is one server message shared by the members of a host: it is
// acknowledged once every member has, and given back (Nak) if any member
// gave it back, with the longest delay asked.
type sharedMsg struct {
	natsjs.Msg
	left  atomic.Int32
	mu    sync.Mutex
	nak   bool
	delay time.Duration
}

func (s *sharedMsg) done() error {
	if s.left.Add(-1) != 0 {
		return nil
	}
	s.mu.Lock()
	nak, delay := s.nak, s.delay
	s.mu.Unlock()
	if nak {
		return s.Msg.NakWithDelay(delay)
	}
	return s.Msg.Ack()
}

func (s *sharedMsg) Ack() error                      { return s.done() }
func (s *sharedMsg) DoubleAck(context.Context) error { return s.done() }
func (s *sharedMsg) Term() error                     { return s.done() }
func (s *sharedMsg) TermWithReason(string) error     { return s.done() }
func (s *sharedMsg) Nak() error                      { return s.NakWithDelay(0) }
func (s *sharedMsg) NakWithDelay(delay time.Duration) error {
	s.mu.Lock()
	s.nak = true
	s.delay = max(s.delay, delay)
	s.mu.Unlock()
	return s.done()
}

// JetStream returns the host's JetStream handle: members of the process
// can share its connection (Config.JS) as they share its consumer.
func (h *Host) JetStream() natsjs.JetStream { return h.cfg.JS }

// Bus returns the host's bus.
func (h *Host) Bus() *jetstream.Bus { return h.cfg.Bus }
