package bridge

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
)

// Recover finishes or aborts whatever the run's last bridge left open, from
// what the stream and KV hold: a prepare is aborted (the controller's call
// died with that bridge); a commit is finished if every member exported,
// else aborted; a restore is finished or failed from its acks; a release
// deletes what it had not. Every operation also calls it first.
func (b *Bridge) Recover(ctx context.Context) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.recoverLocked(ctx)
}

func (b *Bridge) recoverLocked(ctx context.Context) error {
	st, err := b.state(ctx)
	if err != nil || st.last == nil {
		return err
	}
	h := st.last.Header()
	log := b.log.With().Str("checkpoint", h.CheckpointID).Str("phase", string(st.last.Phase())).Uint64("seq", h.Seq).Logger()
	switch p := st.last.(type) {
	case events.Prepare, events.Renew:
		if b.held != nil && b.held.id == h.CheckpointID {
			return nil
		}
		log.Warn().Msg("recovering: a checkpoint was left preparing; aborting it")
		prepMS := b.cfg.Now().Sub(st.lastAt).Milliseconds()
		_, err := b.abort(ctx, &st, h, events.PhasePrepare, &bridgeapi.Failure{Phase: events.PhasePrepare,
			Reason: "the bridge restarted while the checkpoint was preparing"}, st.lastAt, max(prepMS, 0))
		return err
	case events.Commit:
		m, _, err := b.manifest(ctx, h.CheckpointID)
		if err != nil {
			return err
		}
		switch {
		case m == nil:
			log.Warn().Msg("recovering: a commit was left open; reading its acks")
			t, v, err := b.gather(ctx, p)
			if err != nil {
				return err
			}
			if v == machine.Complete {
				prep, _ := b.lastPhase(ctx, events.PhasePrepare)
				var prepSeq uint64
				var restarts []string
				if pp, ok := prep.(events.Prepare); ok && pp.CheckpointID == h.CheckpointID {
					prepSeq = pp.Seq
					if pt, _, err := b.gather(ctx, pp); err == nil {
						restarts = restartsOf(pt)
					}
				}
				mf, err := b.buildManifest(ctx, p, t, restarts, prepSeq, 0, 0)
				if err == nil {
					_, err = b.finishCommitted(ctx, &st, mf, h.Members)
					return err
				}
				log.Warn().Err(err).Msg("recovering: member manifests do not verify")
			}
			errs, _, _ := t.Failure(b.cfg.Now())
			_, err = b.abort(ctx, &st, h, events.PhaseCommit, &bridgeapi.Failure{Phase: events.PhaseCommit,
				Reason: "the bridge restarted during the commit and not every member exported", Errors: errs}, st.lastAt, 0)
			return err
		case m.Aborted:
			_, err := b.finishAborted(ctx, &st, m, h.Members, events.PhaseCommit, &bridgeapi.Failure{Phase: events.PhaseCommit, Reason: m.Reason})
			return err
		default:
			if m.Stop {
				if o, err := b.outcomeOf(ctx, events.TypeCheckpointCommitted, m.CheckpointID); err != nil || o != nil {
					return err // parked after a stop commit: nothing is open
				}
			}
			log.Warn().Msg("recovering: a committed checkpoint was left unfinished; finishing it")
			_, err := b.finishCommitted(ctx, &st, *m, h.Members)
			return err
		}
	case events.Restore:
		if o, err := b.outcomeOf(ctx, events.TypeRestoreCompleted, h.CheckpointID); err != nil {
			return err
		} else if o != nil {
			log.Warn().Msg("recovering: a completed restore was not resumed; resuming")
			return b.resume(ctx, &st, h.CheckpointID, h.Members, false)
		}
		log.Warn().Msg("recovering: a restore was left open; reading its acks")
		_, err := b.finishRestore(ctx, &st, p)
		return err
	case events.Retire:
		r, err := b.restoreOf(ctx, h.CheckpointID)
		if err != nil || r == nil {
			return err // a retire of its own: nothing left to do
		}
		log.Warn().Msg("recovering: a failed restore was left retiring; finishing it")
		res := &bridgeapi.RestoreResult{Run: b.cfg.Run, RestoreID: r.CheckpointID, Source: r.Source, Epoch: r.Epoch, Members: r.Members,
			Failure: &bridgeapi.Failure{Phase: events.PhaseRestore, Reason: "the restore failed (recovered after a bridge restart)"}}
		_, err = b.failRestore(ctx, &st, *r, res)
		return err
	case events.Resume:
		r, err := b.restoreOf(ctx, h.CheckpointID)
		if err != nil || r == nil {
			return err
		}
		if o, err := b.outcomeOf(ctx, events.TypeRestoreCompleted, r.CheckpointID); err != nil || o != nil {
			return err
		}
		if o, err := b.outcomeOf(ctx, events.TypeRestoreFailed, r.CheckpointID); err != nil || o != nil {
			return err
		}
		log.Warn().Msg("recovering: a restore resumed without an outcome; reporting it")
		res := &bridgeapi.RestoreResult{Run: b.cfg.Run, RestoreID: r.CheckpointID, Source: r.Source, Epoch: r.Epoch, Members: r.Members}
		if p.Aborted {
			res.Failure = &bridgeapi.Failure{Phase: events.PhaseRestore, Reason: "the restore failed (recovered after a bridge restart)"}
			_, err = b.failRestore(ctx, &st, *r, res)
			return err
		}
		t, _, err := b.gather(ctx, *r)
		if err != nil {
			return err
		}
		for _, ack := range t.Acks() {
			if ra, ok := ack.(events.RestoreAck); ok {
				res.Restored = append(res.Restored, ra.Restored...)
			}
		}
		return b.completeRestore(ctx, res)
	case events.Release:
		if o, err := b.outcomeOf(ctx, events.TypeReleaseCompleted, h.CheckpointID); err != nil || o != nil {
			return err
		}
		log.Warn().Msg("recovering: a release was left unfinished; finishing it")
		_, err := b.finishRelease(ctx, p)
		return err
	}
	return nil
}

// openOp names the operation recovery would finish, or "".
func (b *Bridge) openOp(ctx context.Context, st runState) (string, error) {
	if st.last == nil {
		return "", nil
	}
	h := st.last.Header()
	switch st.last.(type) {
	case events.Prepare, events.Renew:
		return "checkpoint " + h.CheckpointID + " (preparing)", nil
	case events.Commit:
		m, _, err := b.manifest(ctx, h.CheckpointID)
		if err != nil {
			return "", err
		}
		if m != nil && m.Stop && !m.Aborted {
			if o, err := b.outcomeOf(ctx, events.TypeCheckpointCommitted, h.CheckpointID); err != nil || o != nil {
				return "", err
			}
		}
		return "checkpoint " + h.CheckpointID + " (committing)", nil
	case events.Restore:
		return "restore " + h.CheckpointID, nil
	case events.Release:
		if o, err := b.outcomeOf(ctx, events.TypeReleaseCompleted, h.CheckpointID); err != nil || o != nil {
			return "", err
		}
		return "release " + h.CheckpointID, nil
	}
	return "", nil
}

// lastPhase returns the last event published on one phase's subject.
func (b *Bridge) lastPhase(ctx context.Context, phase events.Phase) (events.PhaseEvent, error) {
	raw, err := b.cfg.Bus.Stream.GetLastMsgForSubject(ctx, events.PhaseSubject(b.cfg.Run, phase))
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bridge: read the last %s: %w", phase, err)
	}
	_, d, err := events.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
	if err != nil {
		return nil, fmt.Errorf("bridge: the last %s does not decode: %w", phase, err)
	}
	p, _ := d.(events.PhaseEvent)
	return p, nil
}

// restoreOf returns the restore phase of operation id, if id is a restore.
func (b *Bridge) restoreOf(ctx context.Context, id string) (*events.Restore, error) {
	p, err := b.lastPhase(ctx, events.PhaseRestore)
	if err != nil || p == nil {
		return nil, err
	}
	r, ok := p.(events.Restore)
	if !ok || r.CheckpointID != id {
		return nil, nil
	}
	return &r, nil
}
