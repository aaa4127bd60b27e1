package member

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

var (
	// ErrSuperseded is returned by Run when a phase of a newer epoch showed
	// that the run has moved on without this member (PROTOCOL §5, Epochs
	// fence zombies). The member stopped its handlers and touched no
	// shared state; its process should exit.
	ErrSuperseded = errors.New("member: superseded by a newer epoch")

	// ErrStaleAttempt is returned (wrapped) by Admit for an attempt at or
	// below its rollout's retire mark. Participants refuse such work with
	// events.CodeStaleAttempt.
	ErrStaleAttempt = errors.New("member: stale attempt")

	// ErrInvalidConfig is returned (wrapped, one per field, joined) by
	// Config.Validate and New.
	ErrInvalidConfig = errors.New("member: invalid config")

	// ErrAlreadyRunning is returned by a second call to Run.
	ErrAlreadyRunning = errors.New("member: Run called twice")

	// ErrConsumerLost is returned (wrapped) by Run when its consumer was
	// deleted under it: a member that cannot hear phases must not go on.
	ErrConsumerLost = errors.New("member: consumer lost")

	// ErrReplaced is returned by Run when another process has taken this
	// member's name (its heartbeat key names another instance): the one
	// that was presumed dead stops, touching nothing.
	ErrReplaced = errors.New("member: replaced by another process of the same name")
)

// CodeCorruptRecords is the ack error code of a restore whose records do
// not verify against their manifest (ErrCorruptRecords).
const CodeCorruptRecords = "corrupt_records"

// Defaults of Config.
const (
	// DefaultGrace is the lease grace: a member resumes by itself this long
	// after the deadline of the last phase it accepted.
	DefaultGrace = 10 * time.Minute
	// DefaultPollEvery is how often a waiting prepare asks the participant
	// again without a Notify.
	DefaultPollEvery = time.Second
)

// Consumer settings (PROTOCOL §3).
const (
	// AckWait is how long the server waits for a phase message to be
	// acknowledged before it delivers it again; handlers that take longer
	// send InProgress every third of it.
	AckWait = 30 * time.Second
	// MaxAckPending is how many phase messages may be unacknowledged at
	// once, so that a resume arrives while a prepare still waits.
	MaxAckPending = 256
	// ConsumerInactiveThreshold is how long the server keeps a member's
	// durable consumer after the last process using it went away; a member
	// restarted within it resumes where it was.
	ConsumerInactiveThreshold = time.Hour
	// callTimeout bounds one call to the bus.
	callTimeout = 10 * time.Second
)

// Config configures a Member.
type Config struct {
	// Run is the run id. Required.
	Run string
	// Member is this member's name, <kind>.<name>; kind agent, owner or
	// sandbox. Required.
	Member events.Member
	// Conn is the connection; optional, JS.Conn() when nil.
	Conn *nats.Conn
	// JS is the JetStream context the member uses. Required; make it with
	// jetstream.New, whose async ack timeout frees acks that never come.
	JS natsjs.JetStream
	// Bus is the provisioned bus (jetstream.Open on JS). Required.
	Bus *jetstream.Bus
	// Participant is what the member drives. Required. Its optional
	// abilities (Exporter, Resumer, Installer, Retirer, Forgetter, Releaser,
	// Parker, WriteHook) are found by type assertion.
	Participant Participant
	// Logger receives the member's logs; the zero value discards them.
	Logger zerolog.Logger
	// Grace is the lease grace (default DefaultGrace).
	Grace time.Duration
	// PollEvery is how often a waiting prepare polls (default
	// DefaultPollEvery).
	PollEvery time.Duration
	// Capabilities say what the member can do, as in events.MemberJoined.
	Capabilities []string
	// StateFile, when set, makes the member read through an ordered
	// consumer, which keeps no state on the server (PROTOCOL §3: thousands
	// of sandbox daemons), and keep its position in this file: a restarted
	// process resumes after the last event it handled. Events are then
	// never redelivered by the server; one given back is delivered again
	// locally.
	StateFile string
	// Host, when set, delivers the run's events to this member from the
	// one consumer of its process instead of a consumer of its own; Run
	// the host first.
	Host *Host
	// Now tells the time (default time.Now). The driver's timers (lease,
	// prepare reply time, polling) wait on the real clock for the durations
	// it computes with Now; the phase machine itself takes time as input.
	Now func() time.Time
}

func (c *Config) setDefaults() {
	if c.Conn == nil && c.JS != nil {
		c.Conn = c.JS.Conn()
	}
	if c.Grace == 0 {
		c.Grace = DefaultGrace
	}
	if c.PollEvery == 0 {
		c.PollEvery = DefaultPollEvery
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Validate reports every unusable field, joined, each wrapping
// ErrInvalidConfig and naming the field. Call it after defaults (New does).
func (c Config) Validate() error {
	var errs []error
	field := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: Config."+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if err := events.ValidateRun(c.Run); err != nil {
		field("Run: %v", err)
	}
	if err := c.Member.Validate(); err != nil {
		field("Member: %v", err)
	} else if c.Member.Kind() == events.KindBridge {
		field("Member %s: a bridge does not run the member runtime", c.Member)
	}
	if c.JS == nil {
		field("JS: required")
	} else if c.Conn != nil && c.JS.Conn() != c.Conn {
		field("Conn: not the connection of JS")
	}
	switch {
	case c.Bus == nil:
		field("Bus: required")
	case c.Bus.Stream == nil || c.Bus.Members == nil || c.Bus.Manifests == nil || c.Bus.Records == nil:
		field("Bus: needs Stream, Members, Manifests and Records (use jetstream.Open)")
	}
	if c.Participant == nil {
		field("Participant: required")
	}
	if c.Grace < 0 {
		field("Grace %s: must not be negative", c.Grace)
	}
	if c.PollEvery < 0 {
		field("PollEvery %s: must not be negative", c.PollEvery)
	}
	if len(c.Capabilities) > 0 && events.ValidateRun(c.Run) == nil && c.Member.Validate() == nil {
		if err := (events.MemberJoined{Run: c.Run, Member: c.Member, Capabilities: c.Capabilities}).Validate(); err != nil {
			field("Capabilities: %v", err)
		}
	}
	if c.Now == nil {
		field("Now: required")
	}
	return errors.Join(errs...)
}

// ConsumerName returns the name of a member's durable consumer: sp_, the
// run, _, the member's kind, _, its name, with every _ inside the run and
// the name doubled, so that no two (run, member) pairs share a name.
// Consumer names cannot contain dots.
func ConsumerName(run string, m events.Member) string {
	esc := func(s string) string { return strings.ReplaceAll(s, "_", "__") }
	return "sp_" + esc(run) + "_" + string(m.Kind()) + "_" + esc(m.Name())
}

// Member is the member runtime of one participant: it consumes the run's
// phases, drives the phase machine, calls the participant, writes records
// and manifests, and answers every phase once. Create it with New, then
// call Run.
type Member struct {
	cfg     Config
	log     zerolog.Logger
	machine *Machine

	running atomic.Bool

	notifyMu sync.Mutex
	notifyCh chan struct{}

	marksMu sync.RWMutex
	marks   map[string]int

	exportMu sync.Mutex
	exported map[string]export // checkpoint id -> its one export

	infoMu  sync.Mutex
	info    events.MemberInfo
	infoRev uint64

	// Owned by the loop goroutine.
	started      time.Time
	marksVersion uint64
	held         map[uint64]*held
	workers      map[uint64]*worker
	results      chan Input
	inbox        chan delivery
	consumeErrs  chan error
	superseded   bool
	lastPark     uint64
	runCtx       context.Context
	wg           sync.WaitGroup // workers
	floor        *floor         // with StateFile
	continued    map[string]*events.PauseReport
	stopping     chan struct{}
	again        sync.WaitGroup // local redeliveries
}

// export is what a checkpoint exported, and for which scope.
type export struct {
	scope   []events.Episode
	records []events.Record
}

// errScopeChanged is returned by exportOnce for a commit whose scope is
// not the one the checkpoint was exported for.
var errScopeChanged = errors.New("member: the checkpoint was exported for another scope")

// held is a phase event waiting for its answer: every delivery of it.
type held struct {
	msgs     []natsjs.Msg
	received time.Time
	log      zerolog.Logger
}

// worker is a handler running outside the loop.
type worker struct {
	id     string
	cancel context.CancelFunc
	done   chan struct{}
}

// New checks cfg (after defaults) and returns a member ready to Run.
func New(cfg Config) (*Member, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	m := &Member{
		cfg:      cfg,
		log:      cfg.Logger.With().Str("run", cfg.Run).Str("member", string(cfg.Member)).Logger(),
		machine:  NewMachine(cfg.Run, cfg.Member, cfg.Grace),
		notifyCh: make(chan struct{}),
		marks:    map[string]int{},
		exported: map[string]export{},
		info: events.MemberInfo{
			Run: cfg.Run, Member: cfg.Member, Capabilities: slices.Clone(cfg.Capabilities),
			Host: host, PID: os.Getpid(), Instance: nuid.Next(),
		},
	}
	return m, nil
}

// Name returns the member's name.
func (m *Member) Name() events.Member { return m.cfg.Member }

// Notify tells the runtime that the participant's readiness may have
// changed: a waiting prepare asks again at once. It never blocks.
func (m *Member) Notify() {
	m.notifyMu.Lock()
	close(m.notifyCh)
	m.notifyCh = make(chan struct{})
	m.notifyMu.Unlock()
}

func (m *Member) changed() <-chan struct{} {
	m.notifyMu.Lock()
	defer m.notifyMu.Unlock()
	return m.notifyCh
}

// Admit returns an error wrapping ErrStaleAttempt if ep was retired: its
// attempt is at or below the highest retired attempt of its rollout (until
// a forget). Participants call it before starting or continuing work of an
// episode; it is safe for concurrent use.
func (m *Member) Admit(ep events.Episode) error {
	if err := ep.Validate(); err != nil {
		return err
	}
	m.marksMu.RLock()
	defer m.marksMu.RUnlock()
	return checkMark(m.marks, ep)
}

// Run registers the member, answers phases until ctx ends or the member is
// superseded, then leaves. It creates one durable consumer for the process
// (memory state, named by ConsumerName) before registering, so that no
// phase published after the registration is missed. It returns nil when
// ctx ends, ErrSuperseded when a newer epoch superseded the member, or an
// error when the member could not start or lost its consumer.
func (m *Member) Run(ctx context.Context) error {
	if !m.running.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	m.started = m.cfg.Now()
	m.info.Started = m.started
	m.held = map[uint64]*held{}
	m.workers = map[uint64]*worker{}
	m.continued = map[string]*events.PauseReport{}
	m.results = make(chan Input, 16)
	m.consumeErrs = make(chan error, 8)

	var cons natsjs.Consumer
	if h := m.cfg.Host; h != nil {
		// A host hands out every event to every member without waiting on
		// any one: the buffer keeps one slow member from holding up the rest.
		m.inbox = make(chan delivery, 64)
		if err := h.attach(ctx, m, m.inbox); err != nil {
			return startErr(ctx, err)
		}
		defer h.detach(m)
	} else if m.cfg.StateFile != "" {
		m.inbox = make(chan delivery)
		var err error
		if cons, err = m.orderedConsumer(ctx); err != nil {
			return startErr(ctx, err)
		}
	} else {
		m.inbox = make(chan delivery)
		var err error
		if cons, err = m.consumer(ctx); err != nil {
			return startErr(ctx, err)
		}
	}
	ttl, err := m.register(ctx)
	if err != nil {
		return startErr(ctx, err)
	}
	consumerName := ConsumerName(m.cfg.Run, m.cfg.Member)
	if m.cfg.StateFile != "" {
		consumerName = "ordered, position in " + m.cfg.StateFile
	}
	if m.cfg.Host != nil {
		consumerName = HostConsumerName(m.cfg.Run, m.cfg.Host.cfg.Name)
	}
	m.log.Info().Str("consumer", consumerName).Msg("member joined")

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	m.runCtx = runCtx

	var bg sync.WaitGroup
	bg.Go(func() { m.heartbeat(runCtx, ttl) })

	stopping := make(chan struct{})
	m.stopping = stopping
	var cc natsjs.ConsumeContext
	if cons != nil {
		cc, err = cons.Consume(func(msg natsjs.Msg) {
			if m.floor != nil {
				msg = m.track(msg)
			}
			select {
			case m.inbox <- delivery{msg: msg}:
			case <-stopping:
				_ = msg.Nak() // for the next process of this member
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
			cancel()
			bg.Wait()
			m.leave(context.WithoutCancel(ctx), "start failed")
			return startErr(ctx, fmt.Errorf("member: consume: %w", err))
		}
	}

	loopErr := m.loop(runCtx)

	close(stopping)
	m.again.Wait()
	if cc != nil {
		cc.Stop()
		<-cc.Closed()
	} else {
		m.cfg.Host.detach(m)
		// Events the host handed over but the loop never took go back.
		for {
			select {
			case dl := <-m.inbox:
				_ = dl.msg.Nak()
				continue
			default:
			}
			break
		}
	}
	m.stopWorkers()
	// Events still waiting for an answer go back to the server, for the
	// next process of this member; it checks their ack subjects first.
	for seq, hm := range m.held {
		for _, msg := range hm.msgs {
			_ = msg.Nak()
		}
		delete(m.held, seq)
	}
	cancel()
	bg.Wait()

	leaveCtx := context.WithoutCancel(ctx)
	if m.superseded {
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

// subjects are what every member reads: the run's phases, and the
// committed outcomes that tell a stop commit to park.
func subjects(run string) []string {
	return []string{events.PhaseFilter(run), events.OutcomeSubject(run, events.TypeCheckpointCommitted)}
}

// durableConfig is the one consumer of a member process (PROTOCOL §3):
// explicit acks, state in memory (a file-state durable costs a disk write
// per ack), delivering what is published from its creation on.
func durableConfig(run, name, description string) natsjs.ConsumerConfig {
	return natsjs.ConsumerConfig{
		Durable:           name,
		Description:       description,
		FilterSubjects:    subjects(run),
		DeliverPolicy:     natsjs.DeliverNewPolicy,
		AckPolicy:         natsjs.AckExplicitPolicy,
		AckWait:           AckWait,
		MaxAckPending:     MaxAckPending,
		InactiveThreshold: ConsumerInactiveThreshold,
		MemoryStorage:     true,
	}
}

// consumer finds the member's durable consumer, or creates it to deliver
// only what is published from now on.
func (m *Member) consumer(ctx context.Context) (natsjs.Consumer, error) {
	name := ConsumerName(m.cfg.Run, m.cfg.Member)
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	cons, err := m.cfg.Bus.Stream.Consumer(cctx, name)
	if err == nil {
		return cons, nil
	}
	if !errors.Is(err, natsjs.ErrConsumerNotFound) {
		return nil, fmt.Errorf("member: look up consumer %s: %w", name, err)
	}
	cons, err = m.cfg.Bus.Stream.CreateConsumer(cctx,
		durableConfig(m.cfg.Run, name, fmt.Sprintf("phases of run %s for member %s", m.cfg.Run, m.cfg.Member)))
	if errors.Is(err, natsjs.ErrConsumerExists) {
		cons, err = m.cfg.Bus.Stream.Consumer(cctx, name)
	}
	if err != nil {
		return nil, fmt.Errorf("member: create consumer %s: %w", name, err)
	}
	return cons, nil
}

// orderedConsumer makes the member's ordered consumer, starting after the
// position its state file holds (or with what is published from now on).
func (m *Member) orderedConsumer(ctx context.Context) (natsjs.Consumer, error) {
	pos, err := loadPosition(m.cfg.StateFile)
	if err != nil {
		return nil, err
	}
	cfg := natsjs.OrderedConsumerConfig{FilterSubjects: subjects(m.cfg.Run), DeliverPolicy: natsjs.DeliverNewPolicy}
	if pos > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = natsjs.DeliverByStartSequencePolicy, pos+1
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	cons, err := m.cfg.JS.OrderedConsumer(cctx, jetstream.StreamName, cfg)
	if err != nil {
		return nil, fmt.Errorf("member: ordered consumer: %w", err)
	}
	m.floor = &floor{path: m.cfg.StateFile, run: m.cfg.Run, member: string(m.cfg.Member), pending: map[uint64]bool{}, saved: pos, high: pos}
	return cons, nil
}

// track wraps a message of the ordered consumer so that its ack moves the
// saved position.
func (m *Member) track(msg natsjs.Msg) natsjs.Msg {
	md, err := msg.Metadata()
	if err != nil {
		return msg
	}
	m.floor.delivered(md.Sequence.Stream)
	return &orderedMsg{Msg: msg, seq: md.Sequence.Stream, delivered: 1, floor: m.floor, again: m.redeliver}
}

// redeliver hands a message given back to the loop again after d.
func (m *Member) redeliver(o *orderedMsg, d time.Duration) {
	o.delivered++
	stopping := m.stopping
	select {
	case <-stopping:
		return // stopping: the next process resumes from the saved position
	default:
	}
	m.again.Go(func() {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-stopping:
			return
		}
		select {
		case m.inbox <- delivery{msg: o}:
		case <-stopping:
		}
	})
}

// register announces the member and puts its heartbeat; it returns the
// members bucket's TTL.
func (m *Member) register(ctx context.Context) (time.Duration, error) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	st, err := m.cfg.Bus.Members.Status(cctx)
	if err != nil {
		return 0, fmt.Errorf("member: members bucket: %w", err)
	}
	// Joined first: the audit log shows the member before anything can be
	// addressed to it through its heartbeat.
	joined := events.MemberJoined{Run: m.cfg.Run, Member: m.cfg.Member, Capabilities: m.info.Capabilities,
		Host: m.info.Host, PID: m.info.PID}
	if err := m.announce(cctx, joined); err != nil {
		return 0, err
	}
	if err := m.putInfo(cctx); err != nil {
		return 0, err
	}
	return st.TTL(), nil
}

func (m *Member) announce(ctx context.Context, d events.Data) error {
	msg, err := events.Marshal(m.cfg.Member, d)
	if err != nil {
		return fmt.Errorf("member: %s: %w", d.Type(), err)
	}
	if _, err := jetstream.PublishDedup(ctx, m.cfg.JS, msg); err != nil {
		return fmt.Errorf("member: %s: %w", d.Type(), err)
	}
	return nil
}

func (m *Member) putInfo(ctx context.Context) error {
	m.infoMu.Lock()
	defer m.infoMu.Unlock()
	m.info.Heartbeat = m.cfg.Now().UTC()
	b, err := json.Marshal(m.info)
	if err != nil {
		return fmt.Errorf("member: heartbeat: %w", err)
	}
	key := events.MemberKey(m.cfg.Run, m.cfg.Member)
	if m.infoRev == 0 {
		// Registration takes the name, from any earlier process of it.
		rev, err := m.cfg.Bus.Members.Put(ctx, key, b)
		if err != nil {
			return fmt.Errorf("member: heartbeat: %w", err)
		}
		m.infoRev = rev
		return nil
	}
	// Later beats only update what this process wrote: if another process
	// of the same name has written since, this one was replaced.
	rev, err := m.cfg.Bus.Members.Update(ctx, key, b, m.infoRev)
	if err == nil {
		m.infoRev = rev
		return nil
	}
	cur, gerr := m.cfg.Bus.Members.Get(ctx, key)
	switch {
	case errors.Is(gerr, natsjs.ErrKeyNotFound):
		// Expired (a long pause, a slow heartbeat): register again.
		rev, err = m.cfg.Bus.Members.Create(ctx, key, b)
	case gerr != nil:
		return fmt.Errorf("member: heartbeat: %w", gerr)
	default:
		var other events.MemberInfo
		if json.Unmarshal(cur.Value(), &other) == nil && other.Instance != m.info.Instance {
			return fmt.Errorf("%w: instance %s holds %s", ErrReplaced, other.Instance, key)
		}
		rev, err = m.cfg.Bus.Members.Update(ctx, key, b, cur.Revision())
	}
	if err != nil {
		return fmt.Errorf("member: heartbeat: %w", err)
	}
	m.infoRev = rev
	return nil
}

// heartbeat refreshes the member's key every third of the bucket's TTL.
func (m *Member) heartbeat(ctx context.Context, ttl time.Duration) {
	every := ttl / 3
	if every <= 0 {
		every = 10 * time.Second
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			err := m.putInfo(cctx)
			cancel()
			if err != nil && ctx.Err() == nil {
				m.heartbeatFailed(err)
			}
		}
	}
}

// heartbeatFailed logs a failed heartbeat; a replaced member tells its
// loop to stop.
func (m *Member) heartbeatFailed(err error) {
	if errors.Is(err, ErrReplaced) {
		select {
		case m.consumeErrs <- err:
		default:
		}
		return
	}
	m.log.Warn().Err(err).Msg("heartbeat")
}

// leave publishes MemberLeft. On a clean stop it deletes the heartbeat
// key, unless another process has written it since; a superseded member
// leaves the key to expire, since it may now belong to its successor.
func (m *Member) leave(ctx context.Context, reason string) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	epoch, _ := m.machine.Epoch()
	if err := m.announce(cctx, events.MemberLeft{Run: m.cfg.Run, Member: m.cfg.Member, Epoch: epoch, Reason: reason}); err != nil {
		m.log.Warn().Err(err).Msg("leave")
	}
	if reason == "superseded" {
		return
	}
	m.infoMu.Lock()
	rev := m.infoRev
	m.infoMu.Unlock()
	err := m.cfg.Bus.Members.Delete(cctx, events.MemberKey(m.cfg.Run, m.cfg.Member), natsjs.LastRevision(rev))
	if err != nil {
		m.log.Debug().Err(err).Msg("heartbeat key left in place")
	}
}

// loop is the member's one goroutine: it owns the machine and does every
// transition, every ack and every manifest create, in order.
func (m *Member) loop(ctx context.Context) error {
	lease := time.NewTimer(time.Hour)
	lease.Stop()
	defer lease.Stop()
	var leaseAt time.Time
	progress := time.NewTicker(AckWait / 3)
	defer progress.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-m.consumeErrs:
			if errors.Is(err, ErrReplaced) {
				m.log.Warn().Err(err).Msg("another process took this member's name; stopping without touching shared state")
				return err
			}
			if errors.Is(err, natsjs.ErrConsumerDeleted) || errors.Is(err, natsjs.ErrConsumerNotFound) {
				return fmt.Errorf("%w: %w", ErrConsumerLost, err)
			}
			m.log.Warn().Err(err).Msg("consume")
		case dl := <-m.inbox:
			m.receive(ctx, dl)
		case in := <-m.results:
			m.step(ctx, in)
		case <-lease.C:
			leaseAt = time.Time{}
			m.step(ctx, LeaseTick{})
		case <-progress.C:
			m.inProgress(m.allHeld())
		}
		if m.superseded {
			return nil
		}
		if l := m.machine.Lease(); !l.Equal(leaseAt) {
			leaseAt = l
			if l.IsZero() {
				lease.Stop()
			} else {
				lease.Reset(max(l.Sub(m.cfg.Now()), 0))
			}
		}
	}
}

// receive decodes one message from the consumer and feeds it in.
func (m *Member) receive(ctx context.Context, dl delivery) {
	msg, e, d := dl.msg, dl.event, dl.data
	var err error
	if d == nil {
		e, d, err = events.Unmarshal(&nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()})
	}
	if err != nil {
		m.log.Error().Err(err).Str("subject", msg.Subject()).Msg("malformed event refused")
		if terr := msg.TermWithReason(clipReason(err.Error())); terr != nil {
			m.log.Warn().Err(terr).Msg("term")
		}
		return
	}
	if c, ok := d.(events.CheckpointCommitted); ok {
		m.step(ctx, OutcomeReceived{Committed: c})
		m.ackMsgs(msg)
		return
	}
	pe, ok := d.(events.PhaseEvent)
	if !ok {
		m.log.Warn().Str("type", string(d.Type())).Str("subject", msg.Subject()).Msg("unexpected event refused")
		_ = msg.TermWithReason("not a phase event")
		return
	}
	h, p := pe.Header(), pe.Phase()
	log := m.log.With().Str("checkpoint", h.CheckpointID).Str("phase", string(p)).Uint64("seq", h.Seq).Uint64("epoch", h.Epoch).Logger()
	if hm, ok := m.held[h.Seq]; ok {
		hm.msgs = append(hm.msgs, msg) // delivered again while its answer is pending
		return
	}
	meta, _ := msg.Metadata()
	if (meta != nil && meta.NumDelivered > 1) || e.Time().Before(m.started) {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		_, err := m.cfg.Bus.Stream.GetLastMsgForSubject(cctx, events.AckSubject(m.cfg.Run, h.Seq, p, m.cfg.Member))
		cancel()
		switch {
		case err == nil:
			log.Debug().Msg("already answered; redelivery ignored")
			m.ackMsgs(msg)
			return
		case !errors.Is(err, natsjs.ErrMsgNotFound):
			log.Warn().Err(err).Msg("cannot check for an earlier answer; will retry")
			_ = msg.NakWithDelay(time.Second)
			return
		}
	}
	m.held[h.Seq] = &held{msgs: []natsjs.Msg{msg}, received: m.cfg.Now(), log: log}
	log.Debug().Msg("phase received")
	m.step(ctx, PhaseReceived{Data: pe})
}

func clipReason(s string) string {
	if len(s) > 200 {
		return s[:200]
	}
	return s
}

// step feeds one input to the machine and does what it says.
func (m *Member) step(ctx context.Context, in Input) {
	effects := m.machine.Step(m.cfg.Now(), in)
	m.sync(ctx)
	for _, eff := range effects {
		m.do(ctx, eff)
	}
}

// sync publishes what the machine changed that others read: the retire
// marks (before any retire stops work) and the heartbeat's served flag and
// epoch (before the ack that follows).
func (m *Member) sync(ctx context.Context) {
	if v := m.machine.MarksVersion(); v != m.marksVersion {
		m.marksVersion = v
		marks := m.machine.Marks()
		m.marksMu.Lock()
		m.marks = marks
		m.marksMu.Unlock()
	}
	epoch, _ := m.machine.Epoch()
	served := m.machine.Served()
	m.infoMu.Lock()
	changed := m.info.Epoch != epoch || m.info.Served != served
	m.info.Epoch, m.info.Served = epoch, served
	m.infoMu.Unlock()
	if changed {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		if err := m.putInfo(cctx); err != nil {
			m.heartbeatFailed(err)
		}
		cancel()
	}
}

func (m *Member) do(ctx context.Context, eff Effect) {
	switch e := eff.(type) {
	case Reply:
		m.reply(ctx, e)
	case Drop:
		if hm := m.take(e.Seq); hm != nil {
			hm.log.Debug().Str("reason", e.Reason).Msg("phase ignored")
			m.ackMsgs(hm.msgs...)
		}
	case Supersede:
		m.superseded = true
		m.log.Warn().Uint64("epoch", e.Epoch).Uint64("newer", e.Newer).Uint64("seq", e.Seq).Msg("a phase of a newer epoch arrived")
		for seq, hm := range m.held {
			for _, msg := range hm.msgs {
				_ = msg.Nak() // for whoever serves the new epoch
			}
			delete(m.held, seq)
		}
		m.stopWorkers()
	case WaitReady:
		m.spawn(e.Op, e.Checkpoint.ID, func(wctx context.Context) { m.waitReady(wctx, e) })
	case WriteCommit:
		m.spawn(e.Op, e.Commit.CheckpointID, func(wctx context.Context) { m.writeCommit(wctx, e) })
	case CommitManifest:
		var res ManifestCreated
		res.Op = e.Op
		m.withProgress(func() {
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			defer cancel()
			if err := CreateManifest(cctx, m.cfg.Bus.Manifests, e.Manifest); err != nil {
				code := events.CodeExportFailed
				if errors.Is(err, ErrManifestExists) {
					code = events.CodeCheckpointConflict
				}
				res.Err = &events.AckError{Code: code, Detail: err.Error()}
			}
		})
		m.step(ctx, res)
	case InstallRestore:
		m.spawn(e.Op, e.Restore.CheckpointID, func(wctx context.Context) { m.installRestore(wctx, e) })
	case CallParticipant:
		m.step(ctx, m.call(ctx, e))
	case Reopen:
		m.reopen(ctx, e)
	case Park:
		m.park(e)
	}
}

// take removes and returns the held event with sequence seq.
func (m *Member) take(seq uint64) *held {
	hm := m.held[seq]
	delete(m.held, seq)
	return hm
}

func (m *Member) ackMsgs(msgs ...natsjs.Msg) {
	for _, msg := range msgs {
		if err := msg.Ack(); err != nil {
			m.log.Warn().Err(err).Msg("ack")
		}
	}
}

func (m *Member) allHeld() []natsjs.Msg {
	var out []natsjs.Msg
	for _, hm := range m.held {
		out = append(out, hm.msgs...)
	}
	return out
}

func (m *Member) inProgress(msgs []natsjs.Msg) {
	for _, msg := range msgs {
		_ = msg.InProgress()
	}
}

// withProgress runs fn, a call that blocks the loop, and keeps every held
// message alive meanwhile.
func (m *Member) withProgress(fn func()) {
	msgs := m.allHeld()
	if len(msgs) == 0 {
		fn()
		return
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				m.inProgress(msgs)
			}
		}
	})
	defer wg.Wait()
	defer close(stop)
	fn()
}

// reply publishes an ack once and acknowledges the event it answers.
func (m *Member) reply(ctx context.Context, r Reply) {
	seq := r.Header.Seq
	hm := m.take(seq)
	log, took := m.log, time.Duration(0)
	if hm != nil {
		log, took = hm.log, m.cfg.Now().Sub(hm.received)
	}
	ack := r.Ack(took)
	if ra, ok := ack.(events.ResumeAck); ok {
		if rep := m.continued[r.Header.CheckpointID]; rep != nil {
			ra.Pause = rep
			ack = ra
			delete(m.continued, r.Header.CheckpointID)
		}
	}
	id := m.cfg.Run + "." + strconv.FormatUint(seq, 10) + "." + string(r.Phase) + "." + string(m.cfg.Member)
	msg, err := events.Marshal(m.cfg.Member, ack, events.WithID(id), events.WithTime(m.cfg.Now()))
	if err != nil {
		log.Error().Err(err).Msg("cannot build the ack; event dropped")
		if hm != nil {
			for _, mm := range hm.msgs {
				_ = mm.TermWithReason("member cannot build its ack")
			}
		}
		return
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	_, err = jetstream.PublishOnce(cctx, m.cfg.JS, msg)
	cancel()
	if err != nil && !errors.Is(err, jetstream.ErrAlreadyDone) {
		log.Warn().Err(err).Msg("cannot publish the ack; the event will come again")
		if hm != nil {
			for _, mm := range hm.msgs {
				_ = mm.NakWithDelay(time.Second)
			}
		}
		return
	}
	ev := log.Info()
	if !r.Header.OK {
		ev = log.Warn().Str("code", r.Header.Error.Code).Str("detail", r.Header.Error.Detail)
	}
	ev.Str("state", string(r.Header.State)).Dur("took", took).Bool("repeat", err != nil).Msg("answered")
	if hm != nil {
		m.ackMsgs(hm.msgs...)
	}
}

// spawn runs fn in a worker goroutine for checkpoint id; Reopen of id or
// the end of Run cancels it and waits for it.
func (m *Member) spawn(op uint64, id string, fn func(ctx context.Context)) {
	for k, w := range m.workers {
		select {
		case <-w.done:
			delete(m.workers, k)
		default:
		}
	}
	wctx, cancel := context.WithCancel(m.runCtx)
	w := &worker{id: id, cancel: cancel, done: make(chan struct{})}
	m.workers[op] = w
	m.wg.Go(func() {
		defer close(w.done)
		defer cancel()
		fn(wctx)
	})
}

// post hands a worker's result to the loop, unless the worker was
// cancelled.
func (m *Member) post(ctx context.Context, in Input) {
	select {
	case m.results <- in:
	case <-ctx.Done():
	}
}

// cancelWorkers cancels every worker of checkpoint id and waits for each.
func (m *Member) cancelWorkers(id string) {
	for k, w := range m.workers {
		if w.id == id {
			w.cancel()
			<-w.done
			delete(m.workers, k)
		}
	}
}

func (m *Member) stopWorkers() {
	for _, w := range m.workers {
		w.cancel()
	}
	m.wg.Wait()
	clear(m.workers)
}

func (m *Member) reopen(ctx context.Context, e Reopen) {
	log := m.log.With().Str("checkpoint", e.CheckpointID).Logger()
	m.withProgress(func() {
		m.cancelWorkers(e.CheckpointID)
		m.exportMu.Lock()
		delete(m.exported, e.CheckpointID)
		m.exportMu.Unlock()
		switch r := m.cfg.Participant.(type) {
		case Continuer:
			rep, err := r.Continue(ctx, e.CheckpointID)
			if err != nil {
				log.Error().Err(err).Str("reason", e.Reason).Msg("continuing failed")
			}
			if rep != nil && e.Reason == reasonResume {
				m.continued[e.CheckpointID] = rep // for the resume ack that follows
			}
		case Resumer:
			if err := r.Resume(ctx, e.CheckpointID); err != nil {
				log.Error().Err(err).Str("reason", e.Reason).Msg("reopening admission failed")
			}
		}
	})
	ev := log.Info()
	if e.Reason == "lease expired" {
		ev = log.Warn()
	}
	ev.Str("reason", e.Reason).Msg("admission reopened")
}

// waitReady asks the participant until it is ready or the reply time
// comes.
func (m *Member) waitReady(ctx context.Context, e WaitReady) {
	for {
		changed := m.changed()
		rep, err := m.cfg.Participant.Prepare(ctx, e.Checkpoint)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = rep.validate()
		}
		if err != nil {
			m.post(ctx, ReadinessReported{Op: e.Op, Err: err})
			return
		}
		if rep.Ready && len(rep.Blockers) > 0 {
			rep.Ready = false
		}
		left := e.ReplyAt.Sub(m.cfg.Now())
		if rep.Ready || left <= 0 {
			m.post(ctx, ReadinessReported{Op: e.Op, Report: rep})
			return
		}
		t := time.NewTimer(min(m.cfg.PollEvery, left))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}

// writeCommit re-checks readiness, exports once, writes the records and
// reports the manifest to create.
func (m *Member) writeCommit(ctx context.Context, e WriteCommit) {
	c := e.Commit
	fail := func(code, format string, args ...any) {
		m.post(ctx, RecordsWritten{Op: e.Op, Err: &events.AckError{Code: code, Detail: fmt.Sprintf(format, args...)}})
	}
	cp := Checkpoint{Run: c.Run, ID: c.CheckpointID, Seq: c.Seq, Epoch: c.Epoch, Deadline: c.Deadline}
	rep, err := m.cfg.Participant.Prepare(ctx, cp)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		fail(events.CodeInternal, "readiness re-check: %v", err)
		return
	}
	// Readiness can regress after prepare; never commit such a cut.
	if !rep.Ready || len(rep.Blockers) > 0 {
		b := rep.Blockers
		if len(b) > 10 {
			b = b[:10]
		}
		fail(events.CodeInvalidPhase, "no longer ready to commit: %d blockers %v", len(rep.Blockers), b)
		return
	}
	// Fail closed: a restart in scope would continue a rollout whose state
	// this member never captured.
	restarts := map[string]bool{}
	for _, k := range append(slices.Clone(e.Restarts), rep.Restarts...) {
		restarts[k] = true
	}
	var inScope []string
	for _, ep := range c.Scope {
		if restarts[ep.String()] {
			inScope = append(inScope, ep.String())
		}
	}
	if len(inScope) > 0 {
		slices.Sort(inScope)
		fail(events.CodeRestartInScope, "the scope names episodes that restart here: %v", inScope)
		return
	}
	records, err := m.exportOnce(ctx, c)
	if ctx.Err() != nil {
		return
	}
	if errors.Is(err, errScopeChanged) {
		fail(events.CodeCheckpointConflict, "%v", err)
		return
	}
	if err != nil {
		fail(events.CodeExportFailed, "export: %v", err)
		return
	}
	man, err := m.write(ctx, c.CheckpointID, records)
	if ctx.Err() != nil {
		return // stopped by a resume or a lease expiry: no manifest, ever
	}
	if err != nil {
		code := events.CodeExportFailed
		if errors.Is(err, ErrManifestExists) {
			code = events.CodeCheckpointConflict
		}
		fail(code, "%v", err)
		return
	}
	m.post(ctx, RecordsWritten{Op: e.Op, Manifest: man})
}

// exportOnce returns the records of checkpoint c, exporting them on the
// first call only.
func (m *Member) exportOnce(ctx context.Context, c events.Commit) ([]events.Record, error) {
	m.exportMu.Lock()
	ex, ok := m.exported[c.CheckpointID]
	m.exportMu.Unlock()
	if ok {
		if !sameEpisodes(ex.scope, c.Scope) {
			return nil, fmt.Errorf("%w: %d episodes, this commit names %d", errScopeChanged, len(ex.scope), len(c.Scope))
		}
		return ex.records, nil
	}
	var recs []events.Record
	if e, ok := m.cfg.Participant.(Exporter); ok {
		var err error
		recs, err = e.Export(ctx, c)
		if err != nil {
			return nil, err
		}
	}
	recs = slices.Clip(recs)
	if ctx.Err() == nil {
		m.exportMu.Lock()
		m.exported[c.CheckpointID] = export{scope: slices.Clone(c.Scope), records: recs}
		m.exportMu.Unlock()
	}
	return recs, nil
}

// write stores the records of checkpoint id unless its manifest already
// exists: then the records must be the ones it describes, and the object
// is left alone.
func (m *Member) write(ctx context.Context, id string, records []events.Record) (events.MemberManifest, error) {
	if len(records) == 0 {
		// No object to overwrite: CreateManifest alone tells a repeat
		// (the same manifest) from a conflict.
		return Digest(m.cfg.Run, id, m.cfg.Member, nil)
	}
	have, err := GetManifest(ctx, m.cfg.Bus.Manifests, m.cfg.Run, id, m.cfg.Member)
	switch {
	case err == nil:
		want, derr := Digest(m.cfg.Run, id, m.cfg.Member, records)
		if derr != nil {
			return events.MemberManifest{}, derr
		}
		if diff := manifestDiff(have, want); diff != "" {
			return events.MemberManifest{}, fmt.Errorf("%w: %s: %s", ErrManifestExists, events.MemberManifestKey(m.cfg.Run, id, m.cfg.Member), diff)
		}
		return want, nil
	case !errors.Is(err, ErrNoManifest):
		return events.MemberManifest{}, err
	}
	var before func(context.Context, string, int)
	if h, ok := m.cfg.Participant.(WriteHook); ok {
		before = h.BeforeRecord
	}
	return WriteRecords(ctx, m.cfg.Bus.Records, m.cfg.Run, id, m.cfg.Member, records, before)
}

// installRestore reads and verifies the member's own records in the
// source checkpoint and installs those in scope, all or none.
func (m *Member) installRestore(ctx context.Context, e InstallRestore) {
	r := e.Restore
	fail := func(code string, err error) {
		m.post(ctx, RestoreFinished{Op: e.Op, Err: &events.AckError{Code: code, Detail: err.Error()}})
	}
	scope := map[events.Episode]bool{}
	for _, ep := range r.Scope {
		scope[ep] = true
	}
	keep := func(rec events.Record) bool {
		ep, err := events.ParseEpisode(rec.Key)
		return err != nil || scope[ep]
	}
	_, records, err := ReadRecords(ctx, m.cfg.Bus.Manifests, m.cfg.Bus.Records, m.cfg.Run, r.Source, m.cfg.Member, keep)
	if ctx.Err() != nil {
		return
	}
	switch {
	case errors.Is(err, ErrNoManifest):
		m.log.Info().Str("checkpoint", r.CheckpointID).Str("source", r.Source).Msg("no records of this member in the source checkpoint; nothing to restore")
		m.post(ctx, RestoreFinished{Op: e.Op})
		return
	case errors.Is(err, ErrCorruptRecords):
		fail(CodeCorruptRecords, err)
		return
	case err != nil:
		fail(events.CodeInstallFailed, err)
		return
	}
	inst, ok := m.cfg.Participant.(Installer)
	if !ok {
		if len(records) > 0 {
			fail(events.CodeInstallFailed, fmt.Errorf("member: %d records in scope and the participant cannot install (no Installer)", len(records)))
			return
		}
		m.post(ctx, RestoreFinished{Op: e.Op})
		return
	}
	installed, err := inst.Install(ctx, r, records)
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		fail(events.CodeInstallFailed, fmt.Errorf("install: %w", err))
		return
	}
	keys := make([]string, 0, len(installed))
	for _, ep := range installed {
		if err := ep.Validate(); err != nil {
			fail(events.CodeInstallFailed, fmt.Errorf("install returned an invalid episode: %w", err))
			return
		}
		keys = append(keys, ep.Next().String())
	}
	m.post(ctx, RestoreFinished{Op: e.Op, Restored: keys})
}

// call runs a retire, forget or release on the participant, bounded by
// the phase's deadline.
func (m *Member) call(ctx context.Context, e CallParticipant) CallFinished {
	h := e.Data.Header()
	res := CallFinished{Op: e.Op}
	cctx, cancel := context.WithDeadline(ctx, h.Deadline)
	defer cancel()
	var err error
	m.withProgress(func() {
		switch d := e.Data.(type) {
		case events.Retire:
			if r, ok := m.cfg.Participant.(Retirer); ok {
				err = r.Retire(cctx, d.Episodes)
			}
		case events.Forget:
			if f, ok := m.cfg.Participant.(Forgetter); ok {
				err = f.Forget(cctx, d.Rollouts)
			}
		case events.Release:
			if r, ok := m.cfg.Participant.(Releaser); ok {
				res.Deleted, err = r.Release(cctx, slices.Clone(d.Keep))
			}
		}
	})
	switch {
	case err != nil && errors.Is(cctx.Err(), context.DeadlineExceeded):
		res.Err = &events.AckError{Code: events.CodeDeadlineExceeded, Detail: err.Error()}
	case err != nil:
		res.Err = &events.AckError{Code: events.CodeInternal, Detail: err.Error()}
	}
	return res
}

// park frees what a stop commit exported, best effort, in a worker.
func (m *Member) park(e Park) {
	p, ok := m.cfg.Participant.(Parker)
	if !ok {
		return
	}
	m.exportMu.Lock()
	records := m.exported[e.CheckpointID].records
	m.exportMu.Unlock()
	m.lastPark++
	m.spawn(^m.lastPark, e.CheckpointID, func(ctx context.Context) {
		log := m.log.With().Str("checkpoint", e.CheckpointID).Logger()
		if err := p.Park(ctx, records); err != nil {
			log.Warn().Err(err).Msg("parking the exported work failed; the checkpoint is durable")
			return
		}
		log.Info().Int("records", len(records)).Msg("exported work parked")
	})
}
