package bridge

import (
	"context"
	"errors"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/controller-bridge/internal/failpoint"
	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
)

// driving carries out one machine's effects and feeds it what the bus
// shows: the acks and heartbeats of the phase it gathers, and its timer.
type driving struct {
	b *Bridge
	m *machine.Machine

	acks  *ackReader // the phase gathered, nil when none
	timer *time.Timer
	// probe is when to look at the phase's silent members again: whose
	// heartbeat has expired (memberWatch.expire), and which sandbox daemons
	// to ask whether they are there (members.go, probeAfter); probing is
	// closed once a probe in flight is done.
	probe   *time.Timer
	probing chan struct{}
	lastAck time.Time     // when the gathered phase's last ack came
	armed   bool          // the timer runs
	after   time.Duration // the last SetTimer

	fin *machine.Finish // the operation's end, once the machine said it

	clock phaseClock // when each phase gathered went out, for its duration
}

func (b *Bridge) newDriving(m *machine.Machine) *driving {
	return &driving{b: b, m: m, clock: phaseClock{}}
}

// close stops what the driving started.
func (d *driving) close() {
	if d.acks != nil {
		d.acks.close()
		d.acks = nil
	}
	if d.timer != nil {
		d.timer.Stop()
	}
	d.stopProbe()
}

// stopProbe stops probing the gathered phase's silent members.
func (d *driving) stopProbe() {
	if d.probe != nil {
		d.probe.Stop()
		d.probe = nil
	}
}

// probed has the watch of the gathered phase tell of the members whose
// heartbeat has expired (a key expires without a marker), asks its silent
// sandbox daemons whether they are there, in the background, unless a
// probe is in flight, and arms the next.
func (d *driving) probed() {
	d.probe.Reset(probeEvery)
	if d.acks != nil && d.acks.watch != nil {
		d.acks.watch.expire(d.b.cfg.Now())
	}
	if time.Since(d.lastAck) < probeQuiet {
		return // acks still come: the fleet is answering
	}
	if d.probing != nil {
		select {
		case <-d.probing:
		default:
			return // the last probe still waits for answers
		}
	}
	silent := d.m.Silent()
	if len(silent) == 0 || d.acks == nil || d.acks.watch == nil {
		return
	}
	done := make(chan struct{})
	d.probing = done
	r := d.acks
	go func() {
		defer close(done)
		d.b.probe(r.ctx, r.watch, silent, events.AliveQuery{Seq: r.seq, Phase: r.phase}, r.asked)
	}()
}

// drive feeds in to m and carries out its effects, waiting for what the
// bus shows, until the operation finishes or the machine waits for
// nothing (a replay that has read what it needs, a closed operation).
// A machine left holding a checkpoint prepared is kept, renewing; once
// Run is ending it is abandoned instead, and drive returns that finish.
func (b *Bridge) drive(ctx context.Context, m *machine.Machine, in machine.Input) (machine.Finish, error) {
	d := b.newDriving(m)
	defer d.close()
	if err := d.step(ctx, in); err != nil {
		return machine.Finish{}, err
	}
	for d.fin == nil {
		ins, err := d.wait(ctx)
		if errors.Is(err, errNothingPending) {
			return machine.Finish{}, nil
		}
		if err != nil {
			ins = []machine.Input{machine.EffectFailed{Err: err}}
		}
		for _, in := range ins {
			if err := d.step(ctx, in); err != nil {
				return machine.Finish{}, err
			}
		}
	}
	if m.Held() != "" && !b.startHold(m, d.after) {
		b.log.Warn().Str("checkpoint", m.Held()).Msg("the bridge is stopping: abandoning the checkpoint instead of holding it")
		return b.abandon(ctx, m)
	}
	if d.fin.Err == nil && m.Held() == "" && m.Open() == "" {
		b.settled = b.published
	}
	return *d.fin, nil
}

// step feeds in to the machine and carries out the effects, and the
// effects of the answers, that need no waiting.
func (d *driving) step(ctx context.Context, in machine.Input) error {
	effs, err := d.m.Step(d.b.cfg.Now(), in)
	for err == nil && len(effs) > 0 {
		e := effs[0]
		effs = effs[1:]
		if ans := d.carry(ctx, e); ans != nil {
			var more []machine.Effect
			more, err = d.m.Step(d.b.cfg.Now(), ans)
			effs = append(effs, more...)
		}
	}
	return err
}

var errNothingPending = errors.New("bridge: the machine waits for nothing")

// wait blocks until an ack, a member gone or the timer, and returns what
// the machine is to be told.
func (d *driving) wait(ctx context.Context) ([]machine.Input, error) {
	var timer <-chan time.Time
	if d.armed {
		timer = d.timer.C
	}
	if d.acks == nil && timer == nil {
		return nil, errNothingPending
	}
	for {
		var (
			acks  <-chan ackMsg
			gone  <-chan machine.Input
			probe <-chan time.Time
		)
		if d.acks != nil {
			acks, gone = d.acks.msgs, d.acks.gone
		}
		if d.probe != nil {
			probe = d.probe.C
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer:
			d.armed = false
			return []machine.Input{machine.Tick{}}, nil
		case am := <-acks:
			d.lastAck = time.Now()
			return []machine.Input{d.acks.ack(am)}, nil
		case in := <-gone:
			return []machine.Input{in}, nil
		case <-probe:
			d.probed()
		}
	}
}

// carry carries out one effect and returns the machine's answer to it,
// nil for an effect that has none. An error of the bus is the answer
// EffectFailed: the machine decides what it means.
func (d *driving) carry(ctx context.Context, e machine.Effect) machine.Input {
	b := d.b
	failed := func(err error) machine.Input { return machine.EffectFailed{Err: err} }
	switch e := e.(type) {
	case machine.PublishPhase:
		p, err := b.publishPhase(ctx, e.Fence, e.Event)
		if err != nil {
			return failed(err)
		}
		b.logPublished(d.m, e.Event)
		d.clock.published(e.Event.Phase(), b.cfg.Now())
		if name := publishFailpoint(d.m, e.Event.Phase()); name != "" {
			failpoint.Hit(name)
		}
		return p
	case machine.StartGathering:
		r, backlog, err := b.openAcks(ctx, e.Event, e.Watch, e.Fresh)
		if err != nil {
			return failed(err)
		}
		d.acks = r
		if e.Watch {
			d.stopProbe()
			d.probe, d.lastAck = time.NewTimer(probeAfter), time.Time{}
		}
		return machine.GatherStarted{Seq: e.Event.Header().Seq, Backlog: backlog}
	case machine.StopGathering:
		d.clock.stopped(b.cfg.Metrics, e.Phase, b.cfg.Now())
		d.stopProbe()
		if d.acks != nil {
			if e.Decided {
				b.recordPrepare(ctx, d.acks.rec)
			}
			d.acks.close()
			d.acks = nil
		}
		switch e.Phase {
		case events.PhasePrepare, events.PhaseCommit, events.PhaseRestore, events.PhaseBranch:
			if e.Decided {
				failpoint.Hit("bridge/after-" + string(e.Phase) + "-acks")
			}
		}
	case machine.SetTimer:
		if d.timer == nil {
			d.timer = time.NewTimer(e.After)
		} else {
			d.timer.Reset(e.After)
		}
		d.armed, d.after = true, e.After
	case machine.WriteMemberList:
		if err := b.writeMemberList(ctx, e.Object, e.Data); err != nil {
			return failed(err)
		}
		failpoint.Hit("bridge/after-member-list")
		return machine.MemberListWritten{}
	case machine.CreateManifest:
		have, created, err := b.createManifest(ctx, e.Manifest)
		if err != nil {
			return failed(err)
		}
		switch {
		case !have.Aborted:
			failpoint.Hit("bridge/after-manifest")
		case e.Manifest.Aborted:
			b.log.Warn().Str("checkpoint", have.CheckpointID).Str("reason", have.Reason).Msg("checkpoint aborted")
			failpoint.Hit("bridge/after-abort-marker")
		}
		return machine.ManifestCreated{Manifest: *have, Created: created}
	case machine.MoveLatest:
		if err := b.moveLatest(ctx, e.Latest); err != nil {
			return failed(err)
		}
		failpoint.Hit("bridge/after-latest")
		return machine.LatestMoved{}
	case machine.PublishOutcome:
		if err := b.publishOutcomeOnce(ctx, e.Outcome, e.ID, e.Replayed); err != nil {
			return failed(err)
		}
		switch e.Outcome.Type() {
		case events.TypeCheckpointCommitted:
			failpoint.Hit("bridge/after-outcome")
		case events.TypeReleaseCompleted, events.TypeReleaseFailed:
			failpoint.Hit("bridge/after-release-outcome")
		}
		return machine.OutcomePublished{Type: e.Outcome.Type()}
	case machine.ListCheckpoints:
		all, purged, err := b.listCheckpoints(ctx, e.Release)
		if err != nil {
			return failed(err)
		}
		return machine.CheckpointsListed{Checkpoints: all, Purged: purged}
	case machine.DeleteCheckpoints:
		if err := b.deleteCheckpoints(ctx, e.Delete, e.Keep, e.Mark); err != nil {
			return failed(err)
		}
		return machine.CheckpointsDeleted{}
	case machine.MarkReleased:
		if err := b.markReleased(ctx, e.Keep, e.Mark); err != nil {
			return failed(err)
		}
		return machine.ReleasedMarked{}
	case machine.ReadManifest:
		m, _, err := b.manifest(ctx, e.CheckpointID)
		if err != nil {
			return failed(err)
		}
		return machine.ManifestFound{Manifest: m}
	case machine.ReadOutcome:
		o, err := b.outcomeOf(ctx, e.Type, e.ID)
		if err != nil {
			return failed(err)
		}
		return machine.OutcomeSeen{Type: e.Type, Data: o}
	case machine.WatchResume:
		b.watchResume(e.Event)
	case machine.Note:
		ev := b.log.WithLevel(noteLevels[e.Level])
		if e.Member != "" {
			ev = ev.Str("member", string(e.Member))
		}
		ev.Msg(e.Msg)
	case machine.Finish:
		d.fin = &e
	}
	return nil
}

var noteLevels = [...]zerolog.Level{zerolog.DebugLevel, zerolog.InfoLevel, zerolog.WarnLevel, zerolog.ErrorLevel}

// publishFailpoint names the failpoint right after a phase is published:
// the crash tests kill the bridge there.
func publishFailpoint(m *machine.Machine, p events.Phase) string {
	switch p {
	case events.PhasePrepare, events.PhaseCommit, events.PhaseRestore, events.PhaseRelease, events.PhaseBranch:
		return "bridge/after-" + string(p)
	case events.PhaseRetire:
		switch m.State() {
		case machine.StateRestoreFailing:
			return "bridge/after-restore-retire"
		case machine.StateBranchFailing:
			return "bridge/after-branch-retire"
		}
	}
	return ""
}

// logPublished says a phase went out.
func (b *Bridge) logPublished(m *machine.Machine, p events.PhaseEvent) {
	h := p.Header()
	ev := b.log.Debug()
	switch p.Phase() {
	case events.PhasePrepare, events.PhaseCommit, events.PhaseRestore, events.PhaseRelease, events.PhaseBranch:
		ev = b.log.Info()
	}
	switch p := p.(type) {
	case events.Commit:
		ev = ev.Int("scope", len(p.Scope)).Bool("stop", p.Stop)
	case events.Restore:
		ev = ev.Str("source", p.Source).Int("scope", len(p.Scope))
	case events.Branch:
		ev = ev.Str("source", p.Source).Int("branches", len(p.Branches))
	case events.Resume:
		ev = ev.Bool("aborted", p.Aborted)
	}
	ev.Str("phase", string(p.Phase())).Str("checkpoint", h.CheckpointID).Uint64("seq", h.Seq).Uint64("epoch", h.Epoch).
		Int("members", len(h.Members)).Int("sandboxes", sandboxCount(h)).Str("state", m.State().String()).Msg(string(p.Phase()) + " published")
}
