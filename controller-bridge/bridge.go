package bridge

import (
	"context"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// Bridge is the controller bridge of one run. Its methods are safe for
// concurrent use; operations run one at a time.
type Bridge struct {
	cfg    Config
	log    zerolog.Logger
	source events.Member
	// ids are the ids of what it publishes into the stream: a random
	// part drawn once per publish, which a publish made again by this
	// process repeats, and which no other client can tell (PROTOCOL §4).
	ids events.MsgIDs

	// op is held by the operation running (a held checkpoint's renew is
	// one too): a channel, so that waiting for it can be cancelled.
	op chan struct{}

	// roster is the last roster this bridge published (PROTOCOL §3,
	// Rosters), which a phase of the same sandbox daemons names again.
	// Phases are published by the operation holding op.
	roster   *events.RosterRef
	rosterOf string // the operation roster was published for
	// resumes are the inboxes of the run's resume acks; members the live
	// view of its heartbeats.
	resumes resumeAcks
	members memberView
	// acks is the one consumer of the run's acks that live phases are
	// gathered from.
	acks ackFeed
	// heads writes the run's head in the background (saveHead).
	heads heads
	// lastLatest is the LATEST this bridge wrote last, at lastLatestRev
	// (moveLatest); written by the operation holding op.
	lastLatest    *events.Latest
	lastLatestRev uint64
	// lastLive is the phase sequence of the last live copy this bridge
	// published (publishLive), 0 before the first.
	lastLive uint64
	// lastSeq is the sequence of the last phase this bridge published.
	lastSeq uint64
	// published is the id of the last phase this bridge published;
	// settled that of the last phase of an operation it drove to its end:
	// while the run's last phase is that one, nothing is left open to
	// replay (recoverLocked).
	published, settled string

	mu     sync.Mutex // guards held and closed
	held   *hold      // the checkpoint held prepared, if any
	closed bool       // Run is ending: nothing new starts in bg

	// bgCtx is the lifetime of bg, the goroutines that outlive the
	// operation that starts them (resume watchers, a held checkpoint's
	// renewer): Run ends it and waits for them. It is kept here because
	// those operations have no context of Run's to derive one from.
	bgCtx    context.Context
	bgCancel context.CancelFunc
	bg       sync.WaitGroup
}

// New checks cfg and returns a bridge. Call Recover (Run does) before the
// first operation after a restart.
func New(cfg Config) (*Bridge, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	src, _ := events.NewMember(events.KindBridge, cfg.Name)
	b := &Bridge{cfg: cfg, source: src, op: make(chan struct{}, 1),
		log: cfg.Logger.With().Str("run", cfg.Run).Str("member", string(src)).Logger()}
	b.resumes.Spare = resumeInboxes - 1
	b.bgCtx, b.bgCancel = context.WithCancel(context.Background())
	cfg.Metrics.InitBridge()
	return b, nil
}

// Run recovers whatever the last bridge left open, then blocks until ctx
// ends, when it abandons a held checkpoint by resuming the fleet and stops
// its background watchers. From then on an operation still running holds
// no checkpoint (it abandons it) and starts no watcher.
func (b *Bridge) Run(ctx context.Context) error {
	defer func() {
		b.close()
		b.bgCancel()
		b.bg.Wait()
		fctx, cancel := context.WithTimeout(context.Background(), publishAttemptTimeout)
		b.flushHead(fctx)
		cancel()
	}()
	if err := b.Recover(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	// Members with credentials of their own ask the bridge for their
	// records stores, and agents for their trajectories stores: they make
	// no stream themselves (docs/PERMISSIONS.md).
	stopStores, err := jetstream.ServeStores(ctx, b.cfg.JS, b.cfg.Bus, b.cfg.Run)
	if err != nil {
		return err
	}
	defer stopStores()
	<-ctx.Done()
	b.close()
	sctx, cancel := context.WithTimeout(context.Background(), b.cfg.ResumeTimeout+5*time.Second)
	defer cancel()
	if err := b.lock(sctx); err != nil {
		// The operation still running abandons its own hold, and reads
		// its acks and heartbeats until it ends: the feeds stay, and go
		// with the connection.
		return nil
	}
	defer b.unlock()
	// No operation runs: what all of them read from stops, before the
	// slot is let go, so that none starts on a feed being stopped (the
	// next starts feeds of its own). The background watches end first.
	defer func() {
		b.bgCancel()
		b.bg.Wait()
		b.stopFeeds()
	}()
	h := b.takeHold()
	if h == nil {
		return nil
	}
	fin, err := b.abandon(sctx, h.m)
	if err = firstErr(err, fin.Err); err != nil {
		b.log.Error().Err(err).Str("checkpoint", h.id).Msg("abandoning the held checkpoint")
	}
	return nil
}

// stopFeeds stops what the operations read from: the resume acks'
// subscription, the member view and the ack feed.
func (b *Bridge) stopFeeds() {
	b.stopResumeAcks()
	b.stopView()
	b.stopAckFeed()
}

// close says Run is ending: startHold and watchResume start nothing in bg
// from now on, so that nothing is added to bg while Run waits for it.
func (b *Bridge) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
}

// abandon resumes the fleet of the checkpoint m holds (an abort), as a
// bridge that stops must: nobody would renew its lease. The caller holds
// the operation slot.
func (b *Bridge) abandon(ctx context.Context, m *machine.Machine) (machine.Finish, error) {
	st, err := b.state(ctx)
	if err != nil {
		return machine.Finish{}, err
	}
	return b.drive(ctx, m, machine.Shutdown{View: st.view()})
}

// lock waits for the run's operation slot, or for ctx to end.
func (b *Bridge) lock(ctx context.Context) error {
	select {
	case b.op <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *Bridge) unlock() { <-b.op }

// machineConfig is the machine's part of the bridge's Config.
func (b *Bridge) machineConfig() machine.Config {
	return machine.Config{Run: b.cfg.Run, PhaseTimeout: b.cfg.PhaseTimeout, ResumeTimeout: b.cfg.ResumeTimeout}
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
