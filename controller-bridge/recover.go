package bridge

import (
	"context"

	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
)

// Recover finishes or aborts whatever the run's last bridge left open,
// from what the stream and KV hold (docs/BRIDGE.md, Recovery by replay): a
// prepare is aborted (the controller's call died with that bridge); a
// commit is finished if every member exported, else aborted; a restore is
// finished or failed from its acks; a release deletes what it had not.
// Every operation also does it first.
func (b *Bridge) Recover(ctx context.Context) error {
	if err := b.lock(ctx); err != nil {
		return err
	}
	defer b.unlock()
	_, err := b.recoverLocked(ctx)
	return err
}

// recoverLocked replays the run's open operation into a fresh machine and
// lets it finish what remains; it returns the run's state after. A
// checkpoint this bridge holds is its own, not left open. The caller holds
// the operation slot.
func (b *Bridge) recoverLocked(ctx context.Context) (runState, error) {
	st, err := b.state(ctx)
	if err != nil || st.last == nil {
		return st, err
	}
	if id := b.heldID(); id != "" && id == st.last.Header().CheckpointID {
		return st, nil
	}
	if st.lastID != "" && st.lastID == b.settled {
		// The run's last phase ends an operation this bridge finished:
		// nothing is open.
		return st, nil
	}
	m, err := b.replay(ctx, st)
	if err != nil {
		return st, err
	}
	open := m.Open()
	if open == "" {
		return st, nil
	}
	log := b.log.With().Str("open", open).Str("phase", string(st.last.Phase())).Uint64("seq", st.seq).Logger()
	log.Warn().Msg("recovering what the run's last bridge left open")
	fin, err := b.drive(ctx, m, machine.Replayed{})
	if err = firstErr(err, fin.Err); err != nil {
		return st, err
	}
	log.Info().Str("status", finishStatus(fin)).Msg("recovered")
	return b.state(ctx)
}

// replay feeds the history of the run's open operation to a fresh machine
// and answers what it reads of the KV and the outcomes. Status asks it
// what is open; recovery lets it carry on.
func (b *Bridge) replay(ctx context.Context, st runState) (*machine.Machine, error) {
	m := machine.New(b.machineConfig())
	if st.last == nil {
		return m, nil
	}
	hist, err := b.history(ctx, st)
	if err != nil {
		return nil, err
	}
	var prev *events.CheckpointManifest
	switch hist[0].Event.Phase() {
	case events.PhasePrepare, events.PhaseRenew, events.PhaseCommit:
		// A commit left open builds its manifest from LATEST's.
		if prev, err = b.previous(ctx); err != nil {
			return nil, err
		}
	}
	var members []events.Member
	if hist[0].Event.Phase() == events.PhaseBranch {
		// A failed branch retires its branches on the epoch's members.
		if members, _, err = b.liveMembers(ctx, st.epoch, false); err != nil {
			return nil, err
		}
	}
	fin, err := b.drive(ctx, m, machine.Recover{History: hist, Previous: prev, Members: members})
	return m, firstErr(err, fin.Err)
}

// history reads back the phases of the operation that the run's last
// phase belongs to, oldest first: the last event of each phase subject
// that can come before it in one operation, when it is of the same
// operation and older. A checkpoint's commit or renew follows its
// prepare; a restore's retire or resume follows the restore (and a
// resume, its retire). A resume of a checkpoint ends it: no more is read.
func (b *Bridge) history(ctx context.Context, st runState) ([]machine.PhasePublished, error) {
	last := machine.PhasePublished{Event: st.last, StreamSeq: st.streamSeq, ID: st.lastID, At: st.lastAt}
	id := st.last.Header().CheckpointID
	var earlier []events.Phase
	switch st.last.Phase() {
	case events.PhaseRenew, events.PhaseCommit:
		earlier = []events.Phase{events.PhasePrepare}
	case events.PhaseRetire:
		// A failed restore's or branch's retire.
		earlier = []events.Phase{events.PhaseBranch, events.PhaseRestore}
	case events.PhaseResume:
		earlier = []events.Phase{events.PhaseRestore, events.PhaseRetire}
	}
	var out []machine.PhasePublished
	for _, p := range earlier {
		e, ok, err := b.lastPhase(ctx, p)
		if err != nil {
			return nil, err
		}
		if !ok || e.Event.Header().CheckpointID != id || e.StreamSeq >= last.StreamSeq {
			if p == events.PhaseRestore {
				break // not a restore's: nothing before it belongs to a restore
			}
			continue
		}
		out = append(out, e)
	}
	out = append(out, last)
	// The machine waits for every member a phase addressed: the sandbox
	// daemons of a phase are in its roster.
	for i := range out {
		ev, err := b.expandRoster(ctx, out[i].Event)
		if err != nil {
			return nil, err
		}
		out[i].Event = ev
	}
	return out, nil
}

// finishStatus is a finished operation's status, for the log.
func finishStatus(f machine.Finish) string {
	switch {
	case f.Checkpoint != nil:
		return f.Checkpoint.Status
	case f.Restore != nil:
		return f.Restore.Status
	case f.Op != nil:
		return f.Op.Status
	case f.Branch != nil:
		return f.Branch.Status
	}
	return "closed"
}
