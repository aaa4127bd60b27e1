package machine

import (
	"fmt"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

// BacklogPoll is how often a gathering whose deadline passed looks again
// while acks already recorded are still being read.
const BacklogPoll = 50 * time.Millisecond

// gathering is the phase whose acks the machine gathers.
type gathering struct {
	event events.PhaseEvent
	tally *Tally
	// watch: live, with heartbeats watched and a deadline; without, only
	// the acks already recorded are read.
	watch bool
	// backlog is the stream sequence of the last ack recorded when the
	// gathering started, until an ack at or past it is seen.
	backlog uint64
}

// GatherDeadline is when the gathering of a phase with deadline d,
// started at now, stops waiting: d plus a little slack for clocks, a
// tenth of the time left and at most a second.
func GatherDeadline(now, d time.Time) time.Time {
	return d.Add(max(min(time.Second, d.Sub(now)/10), 0))
}

// gather asks for the acks of phase p, waiting until GatherDeadline.
func (m *Machine) gather(now time.Time, p events.PhaseEvent, watch bool) []Effect {
	return m.gatherPhase(now, p, watch, false)
}

// gatherPublished asks for the acks of phase p, which this machine has just
// published.
func (m *Machine) gatherPublished(now time.Time, p events.PhaseEvent) []Effect {
	return m.gatherPhase(now, p, true, true)
}

func (m *Machine) gatherPhase(now time.Time, p events.PhaseEvent, watch, fresh bool) []Effect {
	hh := p.Header()
	hh.Deadline = GatherDeadline(now, hh.Deadline)
	t := NewTally(p.Phase(), hh)
	// A restore or branch waits for every answer even after a failure: all
	// or none needs to know what each member installed before retiring. Retire,
	// forget and release have nothing to abort: their result says what
	// every member did (a release, what each one deleted).
	switch p.Phase() {
	case events.PhaseRestore, events.PhaseRetire, events.PhaseForget, events.PhaseRelease, events.PhaseBranch:
		t.WaitAll = true
	}
	m.g, m.want = &gathering{event: p, tally: t, watch: watch}, wantGatherStarted
	return []Effect{StartGathering{Event: p, Watch: watch, Fresh: fresh}}
}

func (m *Machine) gatherStarted(now time.Time, in GatherStarted) ([]Effect, error) {
	if err := m.expect(wantGatherStarted, in); err != nil {
		return nil, err
	}
	if seq := m.g.event.Header().Seq; in.Seq != seq {
		m.want = wantGatherStarted
		return nil, fmt.Errorf("%w: gathering of seq %d started, seq %d asked", ErrUnexpected, in.Seq, seq)
	}
	m.g.backlog, m.want = in.Backlog, wantAcks
	effs, err := m.decide(now)
	switch {
	case err != nil || m.want != wantAcks:
	case m.g.watch:
		effs = append(effs, SetTimer{After: max(m.g.tally.deadline.Sub(now), 0)})
	default:
		// Reading back what is recorded takes no time; a read that never
		// reaches the last ack (gone from the stream meanwhile) must not
		// hang the bridge.
		effs = append(effs, SetTimer{After: m.cfg.PhaseTimeout})
	}
	return effs, err
}

func (m *Machine) ackSeen(now time.Time, in AckSeen) ([]Effect, error) {
	if m.want != wantAcks {
		return nil, nil // an ack read after its phase was decided
	}
	g := m.g
	if g.backlog > 0 && in.StreamSeq >= g.backlog {
		g.backlog = 0
	}
	var note []Effect
	if in.Ack != nil && !g.tally.Add(in.Ack) {
		ah, h := in.Ack.Header(), g.event.Header()
		if ah.Seq == h.Seq && ah.Epoch == h.Epoch && ah.CheckpointID == h.CheckpointID && g.tally.Answered(ah.Member) {
			// The same member's answer again (a daemon's ack said again on
			// its alive query): the first one counts.
			note = []Effect{Note{Level: LevelDebug, Member: ah.Member, Msg: fmt.Sprintf(
				"a second %s ack of seq %d; the first counts", in.Ack.Answers(), ah.Seq)}}
			effs, err := m.decide(now)
			return append(note, effs...), err
		}
		note = []Effect{Note{Level: LevelWarn, Member: ah.Member, Msg: fmt.Sprintf(
			"ignoring an ack that does not answer this phase (stale epoch or foreign): %s ack of seq %d, epoch %d, checkpoint %s; the phase is %s seq %d, epoch %d",
			in.Ack.Answers(), ah.Seq, ah.Epoch, ah.CheckpointID, g.event.Phase(), h.Seq, h.Epoch)}}
	}
	effs, err := m.decide(now)
	return append(note, effs...), err
}

// Silent returns the sandbox daemons a live gathering still waits for:
// expected, not answered, not gone. The driver asks each whether it is
// still there (PROTOCOL §3, Liveness), since its heartbeat can live minutes
// after it died. Nil when the machine gathers nothing live.
func (m *Machine) Silent() []events.Member {
	if m.want != wantAcks || m.g == nil || !m.g.watch {
		return nil
	}
	return m.g.tally.Silent(events.KindSandbox)
}

// memberGone fails the phase at once, or leaves the member out where the
// phase allows it (Tally.Excusable).
func (m *Machine) memberGone(now time.Time, in MemberGone) ([]Effect, error) {
	if m.want != wantAcks || !m.g.watch || !m.g.tally.Expects(in.Member) {
		return nil, nil
	}
	t, p := m.g.tally, m.g.event.Phase()
	var note Note
	if t.Excusable(in.Member) {
		t.Excuse(in.Member)
		note = Note{Level: LevelInfo, Member: in.Member,
			Msg: fmt.Sprintf("%s (%s); a sandbox daemon holds nothing this phase acts on: left out", in.Why, p)}
	} else {
		t.Dead(in.Member)
		note = Note{Level: LevelWarn, Member: in.Member, Msg: fmt.Sprintf("%s (%s)", in.Why, p)}
	}
	effs, err := m.decide(now)
	return append([]Effect{note}, effs...), err
}

// deadline takes a Tick of a live gathering: early, it waits on; past the
// deadline with acks still to read, it looks again shortly; else the
// phase fails.
func (m *Machine) deadline(now time.Time) ([]Effect, error) {
	effs, err := m.decide(now)
	if err != nil || m.want != wantAcks {
		return effs, err
	}
	if left := m.g.tally.deadline.Sub(now); left > 0 {
		return append(effs, SetTimer{After: left}), nil
	}
	return append(effs, SetTimer{After: BacklogPoll}), nil
}

// decide asks the tally for a verdict. Acks already recorded count
// whatever the time (a bridge that recovers after the deadline reads what
// the members said): until they are read, the deadline waits. A gathering
// that only reads back what is recorded ends once it is.
func (m *Machine) decide(now time.Time) ([]Effect, error) {
	g := m.g
	if !g.watch {
		if g.backlog > 0 {
			return nil, nil
		}
		return m.gathered(now, g.tally.Decide(now))
	}
	at := now
	if g.backlog > 0 && !now.Before(g.tally.deadline) {
		at = g.tally.deadline.Add(-time.Nanosecond)
	}
	v := g.tally.Decide(at)
	if v == Waiting {
		return nil, nil
	}
	return m.gathered(now, v)
}

// gathered ends the gathering with verdict v and carries on.
func (m *Machine) gathered(now time.Time, v Verdict) ([]Effect, error) {
	g := m.g
	m.g, m.want = nil, wantNothing
	stop := StopGathering{Phase: g.event.Phase(), Seq: g.event.Header().Seq, Decided: g.watch}
	var (
		effs []Effect
		err  error
	)
	switch p := g.event.Phase(); {
	case m.state == StatePreparing && p == events.PhasePrepare:
		effs, err = m.prepared(now, g.tally, v)
	case m.state == StateCommitting && p == events.PhasePrepare:
		// Read back for a commit left open: the prepare's restarts.
		m.op.prepTally = g.tally
		effs = m.gather(now, *m.op.commit, true)
	case m.state == StateCommitting && p == events.PhaseCommit:
		effs, err = m.commitGathered(now, g.tally, v)
	case m.state == StateRestoring && p == events.PhaseRestore:
		effs, err = m.restoreGathered(now, g.tally, v)
	case m.state == StateRestored && p == events.PhaseRestore:
		// Read back for a restore resumed without its outcome.
		effs, err = m.restoreInstalled(now, g.tally)
	case m.state == StateRestoreFailing && p == events.PhaseRestore:
		effs, err = m.restoreFailedRead(now, g.tally)
	case m.state == StateRestoreFailing && p == events.PhaseRetire:
		effs, err = m.retireGathered(now, g.tally, v)
	case m.state == StateBranching && p == events.PhaseBranch:
		effs, err = m.branchGathered(now, g.tally, v)
	case m.state == StateBranchFailing && p == events.PhaseBranch:
		effs, err = m.branchFailedRead(now, g.tally)
	case m.state == StateBranchFailing && p == events.PhaseRetire:
		effs, err = m.branchRetireGathered(now, g.tally, v)
	case m.state == StateOperating:
		effs, err = m.opGathered(now, g.tally, v)
	case m.state == StateReleasing:
		effs, err = m.releaseGathered(now, g.tally, v)
	default:
		err = fmt.Errorf("%w: the acks of a %s gathered in state %s", ErrUnexpected, p, m.state)
	}
	return append([]Effect{stop}, effs...), err
}
