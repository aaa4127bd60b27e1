package bridge

import (
	"context"
	"fmt"
	"sort"
	"strconv"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/internal/failpoint"
	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
)

// Restore restores a committed checkpoint (LATEST by default) into the
// fresh members of the run, opening the next epoch. It is all or none: if
// any member fails, the next attempts of the scope are retired everywhere,
// the fleet resumes and the result is failed; those rollouts then restart
// from their input. Members of the old epoch that are still alive are
// superseded by the new epoch and stop.
func (b *Bridge) Restore(ctx context.Context, req bridgeapi.RestoreRequest) (*bridgeapi.RestoreResult, error) {
	if req.Source != "" {
		if err := events.ValidateCheckpointID(req.Source); err != nil {
			return nil, fmt.Errorf("%w: %w", bridgeapi.ErrBadRequest, err)
		}
	}
	if req.ID != "" {
		if err := events.ValidateCheckpointID(req.ID); err != nil {
			return nil, fmt.Errorf("%w: restore_id: %w", bridgeapi.ErrBadRequest, err)
		}
	}
	if req.TimeoutMS < 0 {
		return nil, fmt.Errorf("%w: timeout_ms: negative", bridgeapi.ErrBadRequest)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	if req.Source == "" {
		l, _, err := b.latest(ctx)
		if err != nil {
			return nil, err
		}
		if l == nil {
			return nil, fmt.Errorf("%w: run %s has no committed checkpoint (no LATEST)", bridgeapi.ErrNotFound, b.cfg.Run)
		}
		req.Source = l.CheckpointID
	}
	m, _, err := b.manifest(ctx, req.Source)
	if err != nil {
		return nil, err
	}
	if m == nil || m.Aborted {
		return nil, fmt.Errorf("%w: checkpoint %s of run %s is not committed", bridgeapi.ErrNotFound, req.Source, b.cfg.Run)
	}
	st, err := b.state(ctx)
	if err != nil {
		return nil, err
	}
	fresh, _, err := b.liveMembers(ctx, 0, true)
	if err != nil {
		return nil, err
	}
	isFresh := map[events.Member]bool{}
	for _, f := range fresh {
		isFresh[f] = true
	}
	// Every member with records needs a fresh member of its name to
	// install them; one that exported nothing (a sandbox daemon, whose
	// sandbox the owner forks under a new id) needs none.
	var missing []string
	for _, mm := range m.Members {
		if mm.Count > 0 && !isFresh[mm.Member] {
			missing = append(missing, string(mm.Member))
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, fmt.Errorf("%w: checkpoint %s has records of %v, and no fresh member of those names is alive", bridgeapi.ErrNoFreshMember, req.Source, missing)
	}
	epoch := st.epoch + 1
	if req.ID == "" {
		req.ID = "restore-e" + strconv.FormatUint(epoch, 10)
	}
	scope := make([]events.Episode, 0, len(m.Continued))
	for _, k := range m.Continued {
		e, _ := events.ParseEpisode(k)
		scope = append(scope, e)
	}
	log := b.log.With().Str("restore", req.ID).Str("source", req.Source).Uint64("epoch", epoch).Logger()
	r := events.Restore{PhaseHeader: b.header(&st, req.ID, epoch, fresh, b.phaseTimeout(req.TimeoutMS)), Source: req.Source, Scope: scope}
	if err := b.publishPhase(ctx, &st, r); err != nil {
		return nil, err
	}
	log.Info().Int("members", len(fresh)).Int("scope", len(scope)).Msg("restore published")
	failpoint.Hit("bridge/after-restore")
	return b.finishRestore(ctx, &st, r)
}

// finishRestore gathers the restore acks and completes or fails the
// restore. Recovery calls it again for a restore left open.
func (b *Bridge) finishRestore(ctx context.Context, st *runState, r events.Restore) (*bridgeapi.RestoreResult, error) {
	log := b.log.With().Str("restore", r.CheckpointID).Logger()
	t, v, err := b.gather(ctx, r)
	if err != nil {
		return nil, err
	}
	failpoint.Hit("bridge/after-restore-acks")
	res := &bridgeapi.RestoreResult{Run: b.cfg.Run, RestoreID: r.CheckpointID, Source: r.Source, Epoch: r.Epoch, Members: r.Members}
	if v == machine.Complete {
		for _, ack := range t.Acks() {
			res.Restored = append(res.Restored, ack.(events.RestoreAck).Restored...)
		}
		sort.Strings(res.Restored)
		// The outcome first: once the fleet runs the next attempts, the
		// stream must already say which (a bridge that dies in between
		// finds the outcome and only resumes).
		if err := b.completeRestore(ctx, res); err != nil {
			return nil, err
		}
		return res, b.resume(ctx, st, r.CheckpointID, r.Members, false)
	}
	errs, _, _ := t.Failure(b.cfg.Now())
	res.Failure = &bridgeapi.Failure{Phase: events.PhaseRestore, Reason: fmt.Sprintf("%d of %d members did not install", len(errs), len(r.Members)), Errors: errs}
	log.Warn().Int("failed_members", len(errs)).Msg("restore failed; retiring the next attempts everywhere")
	return b.failRestore(ctx, st, r, res)
}

// failRestore retires the next attempt of every scoped episode on every
// member (the outcome of a failed install is uncertain), resumes and
// reports restore.failed.
func (b *Bridge) failRestore(ctx context.Context, st *runState, r events.Restore, res *bridgeapi.RestoreResult) (*bridgeapi.RestoreResult, error) {
	res.Status = bridgeapi.StatusFailed
	if len(r.Scope) > 0 && st.last != nil && st.last.Phase() == events.PhaseRestore {
		next := make([]events.Episode, len(r.Scope))
		for i, e := range r.Scope {
			next[i] = e.Next()
		}
		ret := events.Retire{PhaseHeader: b.header(st, r.CheckpointID, r.Epoch, r.Members, b.cfg.PhaseTimeout), Episodes: next}
		if err := b.publishPhase(ctx, st, ret); err != nil {
			return nil, err
		}
		failpoint.Hit("bridge/after-restore-retire")
		if t, v, err := b.gather(ctx, ret); err != nil {
			return nil, err
		} else if v != machine.Complete {
			errs, _, _ := t.Failure(b.cfg.Now())
			b.log.Error().Int("failed_members", len(errs)).Msg("retire after a failed restore did not complete everywhere")
			res.Failure.Errors = append(res.Failure.Errors, errs...)
		}
	}
	for _, e := range r.Scope {
		res.Retired = append(res.Retired, e.Next().String())
	}
	if st.last == nil || st.last.Phase() != events.PhaseResume {
		if err := b.resume(ctx, st, r.CheckpointID, r.Members, true); err != nil {
			return nil, err
		}
	}
	if o, err := b.outcomeOf(ctx, events.TypeRestoreFailed, r.CheckpointID); err != nil {
		return nil, err
	} else if o == nil {
		out := events.RestoreFailed{OutcomeHeader: events.OutcomeHeader{Run: b.cfg.Run, CheckpointID: r.CheckpointID, Epoch: r.Epoch},
			Source: r.Source, Errors: res.Failure.Errors, Retired: res.Retired}
		if out.Errors == nil {
			out.Errors = []events.MemberError{}
		}
		if err := b.publishOutcome(ctx, out, r.CheckpointID); err != nil {
			return nil, err
		}
	}
	return res, nil
}

func (b *Bridge) completeRestore(ctx context.Context, res *bridgeapi.RestoreResult) error {
	res.Status = bridgeapi.StatusCompleted
	if o, err := b.outcomeOf(ctx, events.TypeRestoreCompleted, res.RestoreID); err != nil || o != nil {
		return err
	}
	out := events.RestoreCompleted{OutcomeHeader: events.OutcomeHeader{Run: b.cfg.Run, CheckpointID: res.RestoreID, Epoch: res.Epoch},
		Source: res.Source, Restored: res.Restored}
	if out.Restored == nil {
		out.Restored = []string{}
	}
	return b.publishOutcome(ctx, out, res.RestoreID)
}
