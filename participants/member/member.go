package member

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/member/feed"
)

// Member is the member runtime of one participant: it consumes the run's
// phases, drives the phase machine, calls the participant, writes records
// and manifests, and answers every phase once. Create it with New, then
// call Run.
type Member struct {
	cfg     Config
	log     zerolog.Logger
	machine *Machine
	// stream reads the last message of a subject of the stream: the bus's
	// handle, or, for a user that reads no stream info (Config.NoPull),
	// direct gets whose subject names what they read.
	stream AckGetter

	running atomic.Bool
	joined  chan struct{} // closed once Run has registered the member

	// notify is closed and replaced by Notify; a waiting prepare holds
	// the one it read before it asked the participant.
	notify atomic.Pointer[chan struct{}]

	// marks is the machine's retire marks as of its last step, published
	// by the loop for Admit; a snapshot, never changed.
	marks atomic.Pointer[map[string]int]

	infoMu  sync.Mutex // the heartbeat record: the loop and the heartbeat write it
	info    events.MemberInfo
	infoRev uint64

	liveMu   sync.Mutex // the acks published on core NATS: the loop writes, alive queries read
	liveAcks []liveAck  // the last liveAcksKept, oldest first

	ackIDs events.MsgIDs // the ids of the acks, one per phase answered (reply)

	recordsMu sync.Mutex         // the records store, opened by the first write that needs it
	records   natsjs.ObjectStore // guarded by recordsMu

	// Owned by the loop goroutine (Run's).
	started      time.Time
	startSeq     uint64 // the stream's last sequence when the process started (0: unknown)
	marksVersion uint64
	held         map[uint64]*held
	workers      map[uint64]*worker
	results      chan Input
	inbox        <-chan feed.Delivery
	feed         feed.Feed
	durable      *feed.Durable // the feed, when it is a durable consumer of the member's own; else nil
	recheckTo    uint64        // events up to this stream sequence may have been answered by an earlier consumer
	consumeErrs  chan error
	feedDown     bool // the feed's remake failed: it has no consumer until one succeeds
	repullDue    bool // a pull found no responders with the consumer there: pull again at the retry
	repulls      atomic.Int64
	lastPhase    uint64 // the highest phase sequence (header) seen, and its stream sequence
	lastPhaseAt  uint64
	gapTried     uint64 // the phase sequence whose gap before it was read again
	lastPark     uint64
	wg           sync.WaitGroup // workers
	continued    map[string]*events.PauseReport
}

// New checks cfg (after defaults) and returns a member ready to Run.
func New(cfg Config) (*Member, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	m := &Member{
		cfg:     cfg,
		log:     cfg.Logger.With().Str("run", cfg.Run).Str("member", string(cfg.Member)).Logger(),
		machine: NewMachine(cfg.Run, cfg.Member, cfg.Grace),
		info: events.MemberInfo{
			Run: cfg.Run, Member: cfg.Member, Capabilities: slices.Clone(cfg.Capabilities),
			Host: host, PID: os.Getpid(), Instance: events.NewID(),
		},
	}
	if cfg.NoPull {
		m.stream = jetstream.Direct{Conn: cfg.Conn, Stream: jetstream.StreamName}
	} else {
		m.stream = cfg.Bus.Stream
	}
	if cfg.AdoptEpoch != 0 {
		m.machine.Adopt(cfg.AdoptEpoch)
		m.info.Epoch, m.info.Served = cfg.AdoptEpoch, true
	}
	m.joined = make(chan struct{})
	ch := make(chan struct{})
	m.notify.Store(&ch)
	marks := map[string]int{}
	m.marks.Store(&marks)
	return m, nil
}

// Name returns the member's name.
func (m *Member) Name() events.Member { return m.cfg.Member }

// Instance returns the id of this process's membership, as its heartbeat
// carries it (events.MemberInfo.Instance).
func (m *Member) Instance() string { return m.info.Instance }

// Joined is closed once Run has registered the member: its MemberJoined is
// on the stream (but a sandbox daemon's, which announces none) and its
// heartbeat in its kind's bucket (jetstream.HeartbeatBucket). A Run that
// fails to start never closes it.
func (m *Member) Joined() <-chan struct{} { return m.joined }

// Notify tells the runtime that the participant's readiness may have
// changed: a waiting prepare asks again at once. It never blocks.
func (m *Member) Notify() {
	ch := make(chan struct{})
	close(*m.notify.Swap(&ch))
}

// changed returns the channel the next Notify closes.
func (m *Member) changed() <-chan struct{} { return *m.notify.Load() }

// Admit returns an error wrapping ErrStaleAttempt if ep was retired: its
// attempt is at or below the highest retired attempt of its rollout (until
// a forget). Participants call it before starting or continuing work of an
// episode; it is safe for concurrent use.
func (m *Member) Admit(ep events.Episode) error {
	if err := ep.Validate(); err != nil {
		return err
	}
	return checkMark(*m.marks.Load(), ep)
}

// Run registers the member, answers phases until ctx ends or the member is
// superseded, then leaves. Its events come from Config.Source, with
// Config.StateFile from the core feed, else from a durable consumer of its
// own (memory state, named by ConsumerName). It opens them before it
// registers, so that no phase published after the registration is
// missed. It returns nil when ctx ends, ErrSuperseded when a newer epoch
// superseded the member, or an error when the member could not start. A
// durable consumer of its own that disappears is made again, from the
// first event not handled; only a Source's loss ends Run (ErrConsumerLost).
func (m *Member) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	m.started = m.cfg.Now()
	m.info.Started = m.started
	m.startSeq = m.streamEnd(ctx)
	m.held = map[uint64]*held{}
	m.workers = map[uint64]*worker{}
	m.continued = map[string]*events.PauseReport{}
	m.results = make(chan Input, 16)
	m.consumeErrs = make(chan error, 8)

	f, err := m.openFeed(ctx)
	if err != nil {
		return startErr(ctx, err)
	}
	m.feed, m.inbox = f, f.Inbox()
	ttl, err := m.register(ctx)
	if err != nil {
		f.Stop()
		return startErr(ctx, err)
	}
	alive, err := m.cfg.JS.Conn().Subscribe(events.AliveSubject(m.cfg.Run, m.cfg.Member), func(msg *nats.Msg) {
		// The answer is the member's instance, or the ack the request
		// asks for (events.AliveQuery), its headers and data.
		if ack := m.sayAgain(msg.Data); ack != nil {
			_ = msg.RespondMsg(&nats.Msg{Header: ack.Header, Data: ack.Data})
			return
		}
		_ = msg.Respond([]byte(m.info.Instance))
	})
	if err != nil {
		f.Stop()
		m.leave(context.WithoutCancel(ctx), "start failed")
		return startErr(ctx, fmt.Errorf("member: answer on %s: %w", events.AliveSubject(m.cfg.Run, m.cfg.Member), err))
	}
	defer func() { _ = alive.Unsubscribe() }()
	m.log.Info().Str("consumer", f.Name()).Msg("member joined")
	close(m.joined)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()

	var bg sync.WaitGroup
	bg.Go(func() { m.heartbeat(runCtx, ttl) })

	if err := f.Start(); err != nil {
		f.Stop()
		cancel()
		bg.Wait()
		m.leave(context.WithoutCancel(ctx), "start failed")
		return startErr(ctx, err)
	}

	loopErr := m.loop(runCtx)

	f.Stop()
	m.stopWorkers()
	// Events still waiting for an answer go back to the server, for the
	// next process of this member; it checks their ack subjects first.
	m.giveBackHeld()
	cancel()
	bg.Wait()

	leaveCtx := context.WithoutCancel(ctx)
	if m.machine.Superseded() {
		m.leave(leaveCtx, "superseded")
		m.log.Warn().Msg("member superseded by a newer epoch; stopped without touching shared state")
		return ErrSuperseded
	}
	reason := "shutdown"
	if loopErr != nil {
		reason = "error"
	}
	m.leave(leaveCtx, reason)
	m.log.Info().Str("reason", reason).Msg("member left")
	return loopErr
}

// startErr is what Run returns when it could not start: nil if ctx ended
// meanwhile (Run returns nil when ctx ends), else err.
func startErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// openFeed opens the member's feed: its Source, the core feed, or a
// durable consumer of its own.
func (m *Member) openFeed(ctx context.Context) (feed.Feed, error) {
	_, parks := m.cfg.Participant.(Parker)
	switch {
	case m.cfg.Source != nil:
		return feed.Attach(ctx, m.cfg.Source, m.cfg.Run, m.cfg.Member)
	case m.cfg.StateFile != "":
		opts := feed.CoreOptions{Run: m.cfg.Run, Member: m.cfg.Member, StateFile: m.cfg.StateFile, Conn: m.cfg.Conn,
			Last: m.stream, Outcomes: parks, Log: m.log}
		if !m.cfg.NoPull {
			opts.Stream = m.cfg.Bus.Stream
		}
		return feed.OpenCore(ctx, opts)
	default:
		name := ConsumerName(m.cfg.Run, m.cfg.Member)
		d, err := feed.OpenDurable(ctx, feed.DurableOptions{Run: m.cfg.Run, Stream: m.cfg.Bus.Stream,
			Consumer: DurableConfig(m.cfg.Run, name, fmt.Sprintf("phases of run %s for member %s", m.cfg.Run, m.cfg.Member)),
			Outcomes: parks, Conn: m.cfg.Conn, Last: m.stream, Errs: m.consumeErrs, Log: m.log})
		if err != nil {
			return nil, err
		}
		m.durable = d
		return d, nil
	}
}
