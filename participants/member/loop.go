package member

import (
	"context"
	"errors"
	"fmt"
	"time"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/member/feed"
)

// held is a phase event waiting for its answer: every delivery of it.
type held struct {
	dls      []feed.Delivery
	received time.Time
	log      *lazyLog
}

// lazyLog is a logger whose context (with) is added on the first event it
// writes: a phase's (checkpoint, phase, seq, epoch) writes none at the
// levels that are on for most phases, and a zerolog context allocates
// for every phase and member.
type lazyLog struct {
	base *zerolog.Logger
	with func(zerolog.Context) zerolog.Context
	made *zerolog.Logger
}

// phaseLog is the lazyLog of phase p with header h.
func phaseLog(base *zerolog.Logger, h events.PhaseHeader, p events.Phase) *lazyLog {
	return &lazyLog{base: base, with: func(c zerolog.Context) zerolog.Context {
		return c.Str("checkpoint", h.CheckpointID).Str("phase", string(p)).Uint64("seq", h.Seq).Uint64("epoch", h.Epoch)
	}}
}

// plainLog is a lazyLog of base as it is.
func plainLog(base *zerolog.Logger) *lazyLog { return &lazyLog{base: base, made: base} }

func (l *lazyLog) logger() *zerolog.Logger {
	if l.made == nil {
		lg := l.with(l.base.With()).Logger()
		l.made = &lg
	}
	return l.made
}

// level starts an event at lvl, nil (which writes nothing) when the
// logger is not on at lvl.
func (l *lazyLog) level(lvl zerolog.Level) *zerolog.Event {
	if l.base.GetLevel() > lvl || zerolog.GlobalLevel() > lvl {
		return nil
	}
	return l.logger().WithLevel(lvl)
}

// Debug, Info, Warn and Error start an event at their level.
func (l *lazyLog) Debug() *zerolog.Event { return l.level(zerolog.DebugLevel) }
func (l *lazyLog) Info() *zerolog.Event  { return l.level(zerolog.InfoLevel) }
func (l *lazyLog) Warn() *zerolog.Event  { return l.level(zerolog.WarnLevel) }
func (l *lazyLog) Error() *zerolog.Event { return l.level(zerolog.ErrorLevel) }

// loop is the member's one goroutine: it owns the machine and does every
// transition, every ack and every manifest create, in order.
func (m *Member) loop(ctx context.Context) error {
	lease := time.NewTimer(time.Hour)
	lease.Stop()
	defer lease.Stop()
	var leaseAt time.Time
	progress := time.NewTicker(AckWait / 3)
	defer progress.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
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
				if m.durable == nil {
					return fmt.Errorf("%w: %w", ErrConsumerLost, err)
				}
				m.log.Warn().Err(err).Str("consumer", m.feed.Name()).Msg("consumer lost; making it again")
				if !m.recreateFeed(ctx) {
					retry.Reset(recreateRetry)
				}
				continue
			}
			m.log.Warn().Err(err).Msg("consume")
			switch {
			case errors.Is(err, nats.ErrNoResponders) && m.durable != nil:
				// The pull is lost (feed.Durable.Repull): at the retry the consumer
				// is checked and pulled from again; not at once, as one
				// without a leader answers every pull so.
				m.repullDue = true
				retry.Reset(recreateRetry)
			case mayBeLost(err) && !m.checkFeed(ctx):
				retry.Reset(recreateRetry)
			}
		case <-retry.C:
			// A feed left without a consumer (its remake failed) is made
			// again; one that could not be checked is checked again.
			again := m.checkFeed
			if m.feedDown {
				again = m.recreateFeed
			}
			if !again(ctx) {
				retry.Reset(recreateRetry)
			}
		case dl := <-m.inbox:
			m.receive(ctx, dl)
			if m.feedDown {
				retry.Reset(recreateRetry)
			}
		case in := <-m.results:
			m.step(ctx, in)
		case <-lease.C:
			leaseAt = time.Time{}
			m.step(ctx, LeaseTick{})
		case <-progress.C:
			m.inProgress(m.allHeld())
		}
		if m.machine.Superseded() {
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

// recreateRetry is how soon the loop tries again to make a lost consumer
// that could not be made (the server is away).
const recreateRetry = time.Second

// mayBeLost tells the consume errors that a consumer lost with its server
// gives, without saying it is gone: its pulls find no one to answer them,
// and no heartbeat comes.
func mayBeLost(err error) bool {
	return errors.Is(err, natsjs.ErrNoHeartbeat) || errors.Is(err, nats.ErrNoResponders)
}

// checkFeed asks the feed whether its consumer is still there (once the
// server answers again) and makes it again if not; one that is there
// after a pull found no responders (repullDue) is pulled from again. It
// reports false, having logged why, if it must be asked again later: the
// server cannot tell yet, or the consumer could not be made.
func (m *Member) checkFeed(ctx context.Context) bool {
	if m.durable == nil {
		return true
	}
	lost, err := m.durable.Lost(ctx)
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn().Err(err).Str("consumer", m.feed.Name()).Msg("cannot tell whether the consumer is still there; will ask again")
		}
		return false
	}
	if !lost {
		if m.repullDue {
			return m.repullFeed(ctx)
		}
		return true
	}
	m.log.Warn().Str("consumer", m.feed.Name()).Msg("consumer gone (the server restarted without it?); making it again")
	return m.recreateFeed(ctx)
}

// repullFeed consumes the feed's consumer again (feed.Durable.Repull); it
// reports false, having logged why, if it could not (make it again later).
func (m *Member) repullFeed(ctx context.Context) bool {
	m.repullDue = false
	if err := m.durable.Repull(); err != nil {
		m.feedDown = true
		if ctx.Err() == nil {
			m.log.Warn().Err(err).Str("consumer", m.feed.Name()).Msg("cannot pull from the consumer again; will make it again")
		}
		return false
	}
	m.repulls.Add(1)
	m.log.Info().Str("consumer", m.feed.Name()).Msg("a pull found no responders and the consumer is there; pulled again")
	return true
}

// recreateFeed replaces the feed's lost consumer; it reports false, having
// logged why, if it could not (try again later).
func (m *Member) recreateFeed(ctx context.Context) bool {
	seen, err := m.durable.Recreate(ctx)
	m.feedDown, m.repullDue = err != nil, false
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn().Err(err).Str("consumer", m.feed.Name()).Msg("cannot make the consumer again; will retry")
		}
		return false
	}
	// Events the old consumer delivered may come again, each once: the
	// ones answered already are recognised by their ack subject.
	m.recheckTo = max(m.recheckTo, seen)
	m.log.Info().Str("consumer", m.feed.Name()).Uint64("rechecked_to", seen).Msg("consumer made again; carrying on from the stream")
	return true
}

// skipped tells whether phases are missing before phase seq, delivery dl:
// the bridge numbers phases one by one and the member reads them all, so a
// sequence past the next means the consumer skipped some (a delivery lost
// while the stream elected a leader, redelivered only after AckWait, behind
// the phases that follow it: a resume so lost would leave the member
// refusing every later checkpoint and the release). The feed then reads again from
// after the last phase seen, and dl comes again behind what it skipped; a
// gap that is still there after that (nothing was skipped) is taken as it
// is.
func (m *Member) skipped(ctx context.Context, log *lazyLog, seq uint64, dl feed.Delivery) bool {
	at := dl.Sequence()
	if at == 0 || seq <= m.lastPhase {
		return false
	}
	last, lastAt := m.lastPhase, m.lastPhaseAt
	m.lastPhase, m.lastPhaseAt = seq, at
	if m.durable == nil || last == 0 || seq == last+1 || at <= lastAt || m.gapTried == seq {
		return false
	}
	m.gapTried = seq
	log.Warn().Uint64("last_seen", last).Uint64("from_stream_seq", lastAt+1).
		Msg("phases missing before this one (a delivery lost?); reading the stream again after the last phase seen")
	m.lastPhase, m.lastPhaseAt = last, lastAt
	m.ackAll(dl) // its consumer goes: the new one delivers it again
	seen, err := m.durable.Rewind(ctx, lastAt+1)
	m.feedDown = err != nil
	if err != nil {
		if ctx.Err() == nil {
			m.log.Warn().Err(err).Str("consumer", m.feed.Name()).Msg("cannot read the stream again; will make the consumer again")
		}
		return true
	}
	m.recheckTo = max(m.recheckTo, seen)
	return true
}

// receive decodes one delivery and feeds it in.
func (m *Member) receive(ctx context.Context, dl feed.Delivery) {
	if n, ok := dl.(feed.Missed); ok {
		m.log.Info().Str("next", n.Next).Str("open", m.machine.Open()).Msg("phases missed that the stream no longer holds by subject")
		m.step(ctx, PhasesMissed{Next: n.Next, Epoch: n.Epoch, StopCommit: n.StopCommit})
		return
	}
	e, d, err := dl.Event()
	if err != nil {
		m.log.Error().Err(err).Str("subject", dl.Subject()).Msg("malformed event refused")
		if terr := dl.Term(clipReason(err.Error())); terr != nil {
			m.log.Warn().Err(terr).Msg("term")
		}
		return
	}
	if c, ok := d.(events.CheckpointCommitted); ok {
		m.step(ctx, OutcomeReceived{Committed: c})
		m.ackAll(dl)
		return
	}
	pe, ok := d.(events.PhaseEvent)
	if !ok {
		m.log.Warn().Str("type", string(d.Type())).Str("subject", dl.Subject()).Msg("unexpected event refused")
		_ = dl.Term("not a phase event")
		return
	}
	h, p := pe.Header(), pe.Phase()
	log := phaseLog(&m.log, h, p)
	if hm, ok := m.held[h.Seq]; ok {
		hm.dls = append(hm.dls, dl) // delivered again while its answer is pending
		return
	}
	if m.skipped(ctx, log, h.Seq, dl) {
		return
	}
	// PROTOCOL §5, Idempotence: an event that comes again, or that is older
	// than this process, may have been answered already. Its ack is on the
	// stream (a sandbox daemon's as the bridge recorded it) but a resume's
	// and a daemon's prepare's (events.AckRecorded), and both phases are
	// idempotent: it is handled.
	if events.AckRecorded(p, m.cfg.Member) && (dl.Delivered() > 1 || e.Time().Before(m.started) || (m.recheckTo > 0 && dl.Sequence() <= m.recheckTo)) {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		_, err := m.stream.GetLastMsgForSubject(cctx, events.AckSubject(m.cfg.Run, h.Seq, p, m.cfg.Member))
		cancel()
		switch {
		case err == nil:
			log.Debug().Msg("already answered; redelivery ignored")
			m.ackAll(dl)
			return
		case !errors.Is(err, natsjs.ErrMsgNotFound):
			log.Warn().Err(err).Msg("cannot check for an earlier answer; will retry")
			_ = dl.Nak(time.Second)
			return
		}
	}
	m.held[h.Seq] = &held{dls: []feed.Delivery{dl}, received: m.cfg.Now(), log: log}
	log.Debug().Uint64("stream_seq", dl.Sequence()).Msg("phase received")
	m.step(ctx, PhaseReceived{Data: pe, BeforeStart: m.beforeStart(e, dl)})
}

// beforeStart tells that a phase was published before this process
// started, for a member without a state file (PhaseReceived.BeforeStart):
// by its stream sequence against the stream's last when the process
// started, or, when either is unknown, by its time against the start (an
// event without a time is never taken for one).
func (m *Member) beforeStart(e cloudevent.Event, dl feed.Delivery) bool {
	if m.cfg.StateFile != "" {
		return false
	}
	if at := dl.Sequence(); m.startSeq > 0 && at > 0 {
		return at <= m.startSeq
	}
	t := e.Time()
	return !t.IsZero() && t.Before(m.started)
}

// streamEnd returns the stream's last sequence, for a member without a
// state file (beforeStart); 0 when it has one, or the stream cannot say.
func (m *Member) streamEnd(ctx context.Context) uint64 {
	if m.cfg.StateFile != "" || m.cfg.Bus == nil || m.cfg.Bus.Stream == nil {
		return 0
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	info, err := m.cfg.Bus.Stream.Info(cctx)
	if err != nil {
		m.log.Warn().Err(err).Msg("the stream's last sequence is unknown: a prepare from before this process is told by its time")
		return 0
	}
	return info.State.LastSeq
}

func clipReason(s string) string {
	if len(s) > 200 {
		return s[:200]
	}
	return s
}

// step feeds one input to the machine and does what it says.
func (m *Member) step(ctx context.Context, in Input) {
	effects, err := m.machine.Step(m.cfg.Now(), in)
	if err != nil {
		m.log.Debug().Err(err).Msg("input not taken")
		return
	}
	m.sync(ctx)
	for _, eff := range effects {
		m.do(ctx, eff)
	}
}

// sync publishes what the machine changed that others read: the retire
// marks, as a new snapshot for Admit (before any retire stops work), and
// the heartbeat's served flag and epoch (before the ack that follows).
func (m *Member) sync(ctx context.Context) {
	if v := m.machine.MarksVersion(); v != m.marksVersion {
		m.marksVersion = v
		marks := m.machine.Marks()
		m.marks.Store(&marks)
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

// do carries out one effect of the machine.
func (m *Member) do(ctx context.Context, eff Effect) {
	switch e := eff.(type) {
	case Reply:
		m.reply(ctx, e)
	case Drop:
		if hm := m.take(e.Seq); hm != nil {
			hm.log.Debug().Str("reason", e.Reason).Msg("phase ignored")
			m.ackAll(hm.dls...)
		}
	case Supersede:
		m.log.Warn().Uint64("epoch", e.Epoch).Uint64("newer", e.Newer).Uint64("seq", e.Seq).Msg("a phase of a newer epoch arrived")
		m.giveBackHeld() // for whoever serves the new epoch
		m.stopWorkers()
	case WaitReady:
		m.spawn(ctx, e.Op, e.Checkpoint.ID, func(wctx context.Context) { m.waitReady(wctx, e) })
	case WriteCommit:
		m.spawn(ctx, e.Op, e.Commit.CheckpointID, func(wctx context.Context) { m.writeCommit(wctx, e) })
	case InstallRestore:
		m.spawn(ctx, e.Op, e.Restore.CheckpointID, func(wctx context.Context) { m.installRestore(wctx, e) })
	case CallParticipant:
		m.step(ctx, m.call(ctx, e))
	case Reopen:
		m.reopen(ctx, e)
	case Park:
		m.park(ctx, e)
	}
}

// take removes and returns the held event with sequence seq.
func (m *Member) take(seq uint64) *held {
	hm := m.held[seq]
	delete(m.held, seq)
	return hm
}

// giveBackHeld gives every event still waiting for an answer back to the
// server.
func (m *Member) giveBackHeld() {
	for seq, hm := range m.held {
		for _, dl := range hm.dls {
			_ = dl.Nak(0)
		}
		delete(m.held, seq)
	}
}
