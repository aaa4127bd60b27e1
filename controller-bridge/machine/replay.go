package machine

import (
	"fmt"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
)

// recover rebuilds the run's open operation from its history, as the
// phases it published would have left it, and asks for what the stream
// and KV say of its end: the checkpoint key, the outcomes.
func (m *Machine) recover(in Recover) ([]Effect, error) {
	if m.state != StateIdle {
		return nil, fmt.Errorf("%w: Recover in state %s", ErrUnexpected, m.state)
	}
	if len(in.History) == 0 {
		return nil, fmt.Errorf("%w: Recover with no history", ErrUnexpected)
	}
	o := &operation{replayed: true, outcomes: map[events.Type]events.Data{}, prev: in.Previous, epochMembers: in.Members}
	for i, p := range in.History {
		if _, ok := p.Event.Header().Expected(); !ok {
			return nil, fmt.Errorf("%w: the history's %s seq %d names a roster not read", ErrUnexpected, p.Event.Phase(), p.Event.Header().Seq)
		}
		if err := o.replay(p.Event, i == 0); err != nil {
			return nil, err
		}
		switch p.Event.Phase() {
		case events.PhasePrepare:
			o.prepAt = p.At
		case events.PhaseCommit:
			o.commitStart = p.At
		}
		h := p.Event.Header()
		m.seq, m.fence, m.epoch = h.Seq, p.StreamSeq, h.Epoch
		m.last, m.lastID, m.lastAt = p.Event, p.ID, p.At
	}
	if err := m.to(StateReplaying); err != nil {
		return nil, err
	}
	m.op = o
	return m.nextRead(), nil
}

// replay adds phase p to the operation's history.
func (o *operation) replay(p events.PhaseEvent, first bool) error {
	h := p.Header()
	if first {
		o.id = h.CheckpointID
		switch p.Phase() {
		case events.PhasePrepare, events.PhaseRenew, events.PhaseCommit, events.PhaseResume:
			o.kind = opCheckpoint
		case events.PhaseRestore:
			o.kind = opRestore
		case events.PhaseRetire:
			o.kind = opRetire
		case events.PhaseForget:
			o.kind = opForget
		case events.PhaseRelease:
			o.kind = opRelease
		case events.PhaseBranch:
			o.kind = opBranch
		}
	} else if h.CheckpointID != o.id {
		return fmt.Errorf("%w: the history of %s holds a %s of %s", ErrUnexpected, o.id, p.Phase(), h.CheckpointID)
	} else if o.kind != opCheckpoint && o.kind != opRestore && o.kind != opBranch {
		return fmt.Errorf("%w: a %s after the %s of %s", ErrUnexpected, p.Phase(), o.phase.Phase(), o.id)
	}
	switch e := p.(type) {
	case events.Prepare:
		o.prepare = &e
	case events.Renew:
		// A renew of a held checkpoint changes nothing but the lease.
	case events.Commit:
		o.commit = &e
	case events.Resume:
		o.resume = &e
	case events.Restore:
		o.restore = &e
		o.rres = &bridgeapi.RestoreResult{Run: e.Run, RestoreID: e.CheckpointID, Source: e.Source, Epoch: e.Epoch, Rejoin: e.Rejoin,
			Members: expected(e.PhaseHeader)}
	case events.Branch:
		o.branch = &e
		o.bres = branchResult(e)
	case events.Retire:
		if o.kind == opRestore || o.kind == opBranch {
			o.retire = &e
		} else {
			o.phase = e
		}
	case events.Forget:
		o.phase = e
	case events.Release:
		o.phase = e
		o.ores = releaseResult(e.Run, e)
	}
	return nil
}

// nextRead asks for the next thing the replay needs to know, or nothing.
func (m *Machine) nextRead() []Effect {
	o := m.op
	read := func(t events.Type) []Effect {
		m.want = wantOutcomeSeen
		return []Effect{ReadOutcome{Type: t, ID: o.id}}
	}
	switch o.kind {
	case opCheckpoint:
		switch {
		case o.resume != nil:
		case !o.manifestRead:
			m.want = wantManifestFound
			return []Effect{ReadManifest{CheckpointID: o.id}}
		case o.manifest != nil && !o.manifest.Aborted && o.manifest.Stop && !o.read(events.TypeCheckpointCommitted):
			// Parked after a stop commit: the outcome is the last step.
			return read(events.TypeCheckpointCommitted)
		}
	case opRestore:
		switch {
		case o.retire != nil && o.resume == nil:
			// Retiring: restore.failed comes after the resume.
		case !o.read(events.TypeRestoreCompleted):
			return read(events.TypeRestoreCompleted)
		case o.resume != nil && !o.seen(events.TypeRestoreCompleted) && !o.read(events.TypeRestoreFailed):
			return read(events.TypeRestoreFailed)
		}
	case opBranch:
		switch {
		case !o.read(events.TypeBranchCompleted):
			return read(events.TypeBranchCompleted)
		case !o.seen(events.TypeBranchCompleted) && !o.read(events.TypeBranchFailed):
			return read(events.TypeBranchFailed)
		}
	case opRelease:
		switch {
		case !o.read(events.TypeReleaseCompleted):
			return read(events.TypeReleaseCompleted)
		case !o.seen(events.TypeReleaseCompleted) && !o.read(events.TypeReleaseFailed):
			return read(events.TypeReleaseFailed)
		}
	}
	return nil
}

func (m *Machine) manifestFound(in ManifestFound) ([]Effect, error) {
	if err := m.expect(wantManifestFound, in); err != nil {
		return nil, err
	}
	m.op.manifestRead, m.op.manifest = true, in.Manifest
	return m.nextRead(), nil
}

func (m *Machine) outcomeSeen(in OutcomeSeen) ([]Effect, error) {
	if err := m.expect(wantOutcomeSeen, in); err != nil {
		return nil, err
	}
	m.op.outcomes[in.Type] = in.Data
	return m.nextRead(), nil
}

// closed reports whether the replayed operation has nothing left to do.
func (o *operation) closed() bool {
	switch o.kind {
	case opCheckpoint:
		// A resume ends a checkpoint, committed or not; a stop commit ends
		// with its outcome.
		return o.resume != nil || o.manifest != nil && !o.manifest.Aborted && o.manifest.Stop && o.seen(events.TypeCheckpointCommitted)
	case opRestore:
		return o.seen(events.TypeRestoreFailed) || o.seen(events.TypeRestoreCompleted) && o.resume != nil
	case opRelease:
		return o.seen(events.TypeReleaseCompleted) || o.seen(events.TypeReleaseFailed)
	case opBranch:
		return o.seen(events.TypeBranchCompleted) || o.seen(events.TypeBranchFailed)
	}
	return true // a retire or forget of its own: its acks are its result
}

// Open describes the run's open operation, "" when none: what Status
// shows, and what a replay would finish.
func (m *Machine) Open() string {
	o := m.op
	if o == nil || m.state == StateReplaying && (m.want != wantNothing || o.closed()) {
		return ""
	}
	switch o.kind {
	case opCheckpoint:
		if m.state == StatePreparing || m.state == StateHeld || m.last != nil && (m.last.Phase() == events.PhasePrepare || m.last.Phase() == events.PhaseRenew) {
			return "checkpoint " + o.id + " (preparing)"
		}
		return "checkpoint " + o.id + " (committing)"
	case opRestore:
		return "restore " + o.id
	case opRelease:
		return "release " + o.id
	case opBranch:
		return "branch " + o.id
	}
	return ""
}

// replayed carries on with what remains of the replayed operation, as the
// machine would have had it not stopped; what it did is on the stream and
// is not done again. A prepare left open is aborted: the controller's call
// died with the bridge that published it.
func (m *Machine) replayed(now time.Time) ([]Effect, error) {
	if m.state != StateReplaying || m.want != wantNothing {
		return nil, fmt.Errorf("%w: Replayed in state %s, which waits for %s", ErrUnexpected, m.state, m.want)
	}
	o := m.op
	if o.closed() {
		m.op = nil
		return nil, m.to(StateIdle)
	}
	note := func(msg string, effs []Effect, err error) ([]Effect, error) {
		return append([]Effect{Note{Level: LevelWarn, Msg: "recovering: " + msg}}, effs...), err
	}
	switch o.kind {
	case opCheckpoint:
		h := m.last.Header()
		switch {
		case o.manifest != nil && !o.manifest.Aborted:
			o.members = o.withSandboxes(expected(h))
			effs, err := m.commitPoint(now, *o.manifest, false)
			return note("a committed checkpoint was left unfinished; finishing it", effs, err)
		case o.manifest != nil:
			phase := events.PhaseCommit
			if o.commit == nil {
				phase = events.PhasePrepare
			}
			o.failure, o.members = &bridgeapi.Failure{Phase: phase, Reason: o.manifest.Reason}, o.withSandboxes(expected(h))
			if err := m.to(StateAborting); err != nil {
				return nil, err
			}
			return note("an aborted checkpoint was left unreported; finishing the abort", m.publishFailed(), nil)
		case o.commit != nil:
			if err := m.to(StateCommitting); err != nil {
				return nil, err
			}
			// The timings the dead bridge kept in memory, from the
			// phases' publish times: the prepare lasted until the commit
			// was published, and the commit lasts until it is decided.
			if !o.prepAt.IsZero() && !o.commitStart.IsZero() {
				o.prepMS = max(o.commitStart.Sub(o.prepAt).Milliseconds(), 0)
			}
			if o.prepare != nil {
				return note("a commit was left open; reading its acks", m.gather(now, *o.prepare, false), nil)
			}
			return note("a commit was left open; reading its acks", m.gather(now, *o.commit, true), nil)
		default:
			o.prepMS = max(now.Sub(m.lastAt).Milliseconds(), 0)
			effs, err := m.abort(now, h, bridgeapi.Failure{Phase: events.PhasePrepare,
				Reason: "the bridge restarted while the checkpoint was preparing"})
			return note("a checkpoint was left preparing; aborting it", effs, err)
		}
	case opRestore:
		recovered := &bridgeapi.Failure{Phase: events.PhaseRestore, Reason: "the restore failed (recovered after a bridge restart)"}
		switch {
		case o.seen(events.TypeRestoreCompleted):
			if err := m.to(StateRestored); err != nil {
				return nil, err
			}
			done, _ := o.outcomes[events.TypeRestoreCompleted].(events.RestoreCompleted)
			o.rres.Status, o.rres.Restored = bridgeapi.StatusCompleted, done.Restored
			return note("a completed restore was not resumed; resuming", m.resume(now, expected(o.restore.PhaseHeader), false), nil)
		case o.resume != nil && !o.resume.Aborted:
			if err := m.to(StateRestored); err != nil {
				return nil, err
			}
			return note("a restore resumed without an outcome; reporting it", m.gather(now, *o.restore, false), nil)
		case o.resume != nil, o.retire != nil:
			if err := m.to(StateRestoreFailing); err != nil {
				return nil, err
			}
			o.rres.Failure = recovered
			msg := "a restore resumed without an outcome; reporting it"
			if o.resume == nil {
				msg = "a failed restore was left retiring; finishing it"
			}
			return note(msg, m.gather(now, *o.restore, false), nil)
		default:
			if err := m.to(StateRestoring); err != nil {
				return nil, err
			}
			return note("a restore was left open; reading its acks", m.gather(now, *o.restore, true), nil)
		}
	case opBranch:
		effs, msg, err := m.replayedBranch(now)
		if err != nil {
			return nil, err
		}
		return note(msg, effs, nil)
	case opRelease:
		if err := m.to(StateReleasing); err != nil {
			return nil, err
		}
		return note("a release was left unfinished; finishing it", m.gather(now, o.phase, true), nil)
	}
	return nil, fmt.Errorf("%w: nothing to carry on in a replayed %s", ErrUnexpected, o.id)
}
