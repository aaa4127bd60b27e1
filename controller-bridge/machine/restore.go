package machine

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
)

// askRestore starts a restore of a committed checkpoint (LATEST when the
// request names none) into the fresh members, opening the next epoch; a
// rejoin (askRejoin) keeps the epoch.
func (m *Machine) askRestore(now time.Time, in RestoreAsked) ([]Effect, error) {
	if err := m.refuseBusy(); err != nil {
		return nil, err
	}
	req, v := in.Request, in.View
	if err := req.Validate(); err != nil {
		return nil, err
	}
	source := req.Source
	if source == "" {
		if v.Latest == nil {
			return nil, fmt.Errorf("%w: run %s has no committed checkpoint (no LATEST)", bridgeapi.ErrNotFound, m.cfg.Run)
		}
		source = v.Latest.CheckpointID
	}
	man := v.Manifest
	if man == nil || man.Aborted || man.CheckpointID != source {
		return nil, fmt.Errorf("%w: checkpoint %s of run %s is not committed", bridgeapi.ErrNotFound, source, m.cfg.Run)
	}
	if r := man.Released; r != nil {
		return nil, fmt.Errorf("%w: checkpoint %s of run %s: %s", bridgeapi.ErrReleased, source, m.cfg.Run, describeMark(*r))
	}
	if req.Rejoin {
		return m.askRejoin(now, req, v, man)
	}
	// Every member with records needs a fresh member of its name to
	// install them; one that exported nothing (a sandbox daemon, whose
	// sandbox the owner forks under a new id) needs none.
	fresh := map[events.Member]bool{}
	for _, f := range v.Members {
		fresh[f] = true
	}
	var missing []string
	for _, mm := range man.Members {
		if mm.Count > 0 && !fresh[mm.Member] {
			missing = append(missing, string(mm.Member))
		}
	}
	// What the source carries is restored from where it is held, whole,
	// into fresh members of the names that hold it there.
	var carried []events.CarriedSource
	for _, cr := range man.Carried {
		src := v.Sources[cr.From]
		switch {
		case src == nil || src.Aborted || src.CheckpointID != cr.From:
			return nil, fmt.Errorf("%w: checkpoint %s carries %d episodes from %s, which is not a committed checkpoint",
				bridgeapi.ErrNotFound, source, len(cr.Episodes), cr.From)
		case src.Released != nil:
			return nil, fmt.Errorf("%w: checkpoint %s carries %d episodes from %s: %s",
				bridgeapi.ErrReleased, source, len(cr.Episodes), cr.From, describeMark(*src.Released))
		}
		for _, mem := range cr.Members {
			if !fresh[mem] && !slices.Contains(missing, string(mem)) {
				missing = append(missing, string(mem))
			}
		}
		i := slices.IndexFunc(carried, func(c events.CarriedSource) bool { return c.Source == cr.From })
		if i < 0 {
			i = len(carried)
			carried = append(carried, events.CarriedSource{Source: cr.From, SourceCommitSeq: src.CommitSeq,
				SourceAcks: acksKept(now, src, v.StreamMaxAge, m.timeout(req.TimeoutMS))})
		}
		for _, k := range cr.Episodes {
			e, _ := events.ParseEpisode(k)
			carried[i].Episodes = append(carried[i].Episodes, e)
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return nil, fmt.Errorf("%w: checkpoint %s has records of %v, and no fresh member of those names is alive",
			bridgeapi.ErrNoFreshMember, source, missing)
	}
	if err := m.to(StateRestoring); err != nil {
		return nil, err
	}
	m.view(v)
	epoch := m.epoch + 1
	id := req.ID
	if id == "" {
		id = "restore-e" + strconv.FormatUint(epoch, 10)
	}
	held := man.Held()
	scope := make([]events.Episode, 0, len(held))
	for _, k := range held {
		e, _ := events.ParseEpisode(k)
		scope = append(scope, e)
	}
	r := events.Restore{PhaseHeader: m.header(now, id, epoch, v.Members, m.timeout(req.TimeoutMS)), Source: source, Scope: scope,
		SourceCommitSeq: man.CommitSeq, SourceAcks: acksKept(now, man, v.StreamMaxAge, m.timeout(req.TimeoutMS)), Carried: carried}
	m.op = &operation{kind: opRestore, id: id, restore: &r,
		rres: &bridgeapi.RestoreResult{Run: m.cfg.Run, RestoreID: id, Source: source, Epoch: epoch, Members: v.Members}}
	return m.publish(r), nil
}

// askRejoin starts a rejoin (PROTOCOL §5, Rejoin): a restore of LATEST
// into the members that came back fresh while the rest of the fleet
// served on. Its scope is every episode LATEST holds whose holders are
// all fresh now; it goes to the fresh agents and owners only (a sandbox
// daemon installs nothing) and keeps the run's epoch, so that no member
// that served is superseded. Episodes with a holder that served are left
// to the controller (a retire).
func (m *Machine) askRejoin(now time.Time, req bridgeapi.RestoreRequest, v View, man *events.CheckpointManifest) ([]Effect, error) {
	if v.Latest == nil || v.Latest.CheckpointID != man.CheckpointID {
		return nil, fmt.Errorf("%w: a rejoin restores LATEST, not %s", bridgeapi.ErrBadRequest, man.CheckpointID)
	}
	fresh := map[events.Member]bool{}
	var members []events.Member
	for _, f := range v.Members {
		if f.Kind() != events.KindSandbox {
			fresh[f] = true
			members = append(members, f)
		}
	}
	want := map[string]bool{}
	for _, k := range req.Episodes {
		want[k] = true
	}
	var scope []events.Episode
	var carried []events.CarriedSource
	holdings := man.Holdings()
	for _, k := range slices.Sorted(maps.Keys(holdings)) {
		h := holdings[k]
		if len(want) > 0 && !want[k] || len(h.Members) == 0 ||
			slices.ContainsFunc(h.Members, func(mem events.Member) bool { return !fresh[mem] }) {
			continue
		}
		e, _ := events.ParseEpisode(k)
		scope = append(scope, e)
		if h.From == man.CheckpointID {
			continue
		}
		src := v.Sources[h.From]
		switch {
		case src == nil || src.Aborted || src.CheckpointID != h.From:
			return nil, fmt.Errorf("%w: checkpoint %s carries %s from %s, which is not a committed checkpoint",
				bridgeapi.ErrNotFound, man.CheckpointID, k, h.From)
		case src.Released != nil:
			return nil, fmt.Errorf("%w: checkpoint %s carries %s from %s: %s",
				bridgeapi.ErrReleased, man.CheckpointID, k, h.From, describeMark(*src.Released))
		}
		i := slices.IndexFunc(carried, func(c events.CarriedSource) bool { return c.Source == h.From })
		if i < 0 {
			i = len(carried)
			carried = append(carried, events.CarriedSource{Source: h.From, SourceCommitSeq: src.CommitSeq,
				SourceAcks: acksKept(now, src, v.StreamMaxAge, m.timeout(req.TimeoutMS))})
		}
		carried[i].Episodes = append(carried[i].Episodes, e)
	}
	if len(scope) == 0 {
		return nil, fmt.Errorf("%w: no episode of %s is held by fresh members only (fresh: %v)",
			bridgeapi.ErrNoFreshMember, man.CheckpointID, members)
	}
	if err := m.to(StateRestoring); err != nil {
		return nil, err
	}
	m.view(v)
	id := req.ID
	if id == "" {
		id = "rejoin-" + strconv.FormatUint(m.seq+1, 10)
	}
	r := events.Restore{PhaseHeader: m.header(now, id, m.epoch, members, m.timeout(req.TimeoutMS)), Source: man.CheckpointID,
		Scope: scope, SourceCommitSeq: man.CommitSeq, SourceAcks: acksKept(now, man, v.StreamMaxAge, m.timeout(req.TimeoutMS)),
		Carried: carried, Rejoin: true}
	m.op = &operation{kind: opRestore, id: id, restore: &r,
		rres: &bridgeapi.RestoreResult{Run: m.cfg.Run, RestoreID: id, Source: man.CheckpointID, Epoch: m.epoch, Rejoin: true, Members: members}}
	return m.publish(r), nil
}

// acksKept tells whether the stream keeps every commit ack of man for
// longer than a restore of timeout can last (PROTOCOL §5, restore): they
// were published after the commit started, Created less CommitMS, and live
// maxAge from then. A margin of an hour (or ten timeouts) covers the
// restore and the clocks of bridge and server. A commit of unknown start
// (CommitMS 0: a replay whose commit had aged out) is not trusted.
func acksKept(now time.Time, man *events.CheckpointManifest, maxAge, timeout time.Duration) bool {
	if maxAge <= 0 || man.CommitSeq == 0 || man.CommitMS <= 0 {
		return false
	}
	start := man.Created.Add(-time.Duration(man.CommitMS) * time.Millisecond)
	return now.Add(max(time.Hour, 10*timeout)).Before(start.Add(maxAge))
}

// restoreGathered takes the restore's verdict: all installed, or the
// restore fails all or none.
func (m *Machine) restoreGathered(now time.Time, t *Tally, v Verdict) ([]Effect, error) {
	if v == Complete {
		if err := m.to(StateRestored); err != nil {
			return nil, err
		}
		return m.restoreInstalled(now, t)
	}
	if err := m.to(StateRestoreFailing); err != nil {
		return nil, err
	}
	r := m.op.restore
	errs, _, _ := t.Failure(now)
	m.op.rres.Failure = &bridgeapi.Failure{Phase: events.PhaseRestore,
		Reason: fmt.Sprintf("%d of %d members did not install", len(errs), len(r.Members)), Errors: errs}
	note := Note{Level: LevelWarn, Msg: fmt.Sprintf("restore failed (%d members); retiring the next attempts everywhere", len(errs))}
	effs, err := m.retireNext(now)
	return append([]Effect{note}, effs...), err
}

// restoreInstalled reports restore.completed with what every member
// restored. The outcome comes first: once the fleet runs the next
// attempts, the stream must already say which (a bridge that dies in
// between finds the outcome and only resumes).
func (m *Machine) restoreInstalled(now time.Time, t *Tally) ([]Effect, error) {
	res := m.op.rres
	res.Status, res.Restored = bridgeapi.StatusCompleted, nil
	for _, ack := range t.Acks() {
		if ra, ok := ack.(events.RestoreAck); ok {
			res.Restored = append(res.Restored, ra.Restored...)
		}
	}
	sort.Strings(res.Restored)
	out := events.RestoreCompleted{OutcomeHeader: events.OutcomeHeader{Run: m.cfg.Run, CheckpointID: res.RestoreID, Epoch: res.Epoch},
		Source: res.Source, Restored: res.Restored}
	if out.Restored == nil {
		out.Restored = []string{}
	}
	m.want = wantOutcomePublished
	return []Effect{PublishOutcome{ID: res.RestoreID, Outcome: out, Replayed: m.op.replayed}}, nil
}

// afterRestoreCompleted resumes the restored fleet (unless a replay found
// the resume on the stream).
func (m *Machine) afterRestoreCompleted(now time.Time) ([]Effect, error) {
	if m.lastIs(events.PhaseResume, m.op.id) {
		return m.finish(Finish{Restore: m.op.rres})
	}
	return m.resume(now, expected(m.op.restore.PhaseHeader), false), nil
}

// retireNext retires the next attempt of every scoped episode on every
// member (what a failed install left is uncertain), unless the retire is
// already on the stream.
func (m *Machine) retireNext(now time.Time) ([]Effect, error) {
	r := m.op.restore
	if len(r.Scope) == 0 || !m.lastIs(events.PhaseRestore, r.CheckpointID) {
		return m.afterRetire(now)
	}
	next := make([]events.Episode, len(r.Scope))
	for i, e := range r.Scope {
		next[i] = e.Next()
	}
	return m.publish(events.Retire{PhaseHeader: m.header(now, r.CheckpointID, r.Epoch, expected(r.PhaseHeader), m.cfg.PhaseTimeout), Episodes: next}), nil
}

// retireGathered adds the members that did not retire to the failure.
func (m *Machine) retireGathered(now time.Time, t *Tally, v Verdict) ([]Effect, error) {
	m.op.retireGathered = true
	var effs []Effect
	if v != Complete {
		errs, _, _ := t.Failure(now)
		f := m.op.rres.Failure
		f.Errors = append(f.Errors, errs...)
		effs = append(effs, Note{Level: LevelError, Msg: fmt.Sprintf(
			"retire after a failed restore did not complete everywhere (%d members)", len(errs))})
	}
	more, err := m.afterRetire(now)
	return append(effs, more...), err
}

// afterRetire resumes the fleet (unless it is resumed already), then
// restore.failed follows.
func (m *Machine) afterRetire(now time.Time) ([]Effect, error) {
	res, r := m.op.rres, m.op.restore
	res.Status, res.Retired = bridgeapi.StatusFailed, nil
	for _, e := range r.Scope {
		res.Retired = append(res.Retired, e.Next().String())
	}
	if !m.lastIs(events.PhaseResume, r.CheckpointID) {
		return m.resume(now, expected(r.PhaseHeader), true), nil
	}
	return m.publishRestoreFailed()
}

// publishRestoreFailed reports restore.failed: who did not install, and
// the attempts retired (those rollouts restart from their input).
func (m *Machine) publishRestoreFailed() ([]Effect, error) {
	res := m.op.rres
	out := events.RestoreFailed{OutcomeHeader: events.OutcomeHeader{Run: m.cfg.Run, CheckpointID: res.RestoreID, Epoch: res.Epoch},
		Source: res.Source, Errors: res.Failure.Errors, Retired: res.Retired}
	if out.Errors == nil {
		out.Errors = []events.MemberError{}
	}
	m.want = wantOutcomePublished
	return []Effect{PublishOutcome{ID: res.RestoreID, Outcome: out, Replayed: m.op.replayed}}, nil
}

// restoreFailedRead takes the restore's acks read back by a replay of a
// failed restore: they name who did not install. What remains follows:
// the retire's acks, if it was published and not answered yet, then the
// resume and the outcome.
func (m *Machine) restoreFailedRead(now time.Time, t *Tally) ([]Effect, error) {
	errs, _, _ := t.Failure(now)
	m.op.rres.Failure.Errors = errs
	if m.op.retire != nil && !m.op.retireGathered && m.lastIs(events.PhaseRetire, m.op.id) {
		return m.gather(now, *m.op.retire, true), nil
	}
	return m.afterRetire(now)
}

// describeMark says what a failed release may have taken from a
// checkpoint: what each member deleted, and who failed.
func describeMark(r events.ReleaseMark) string {
	var del []string
	for mem, ids := range r.Deleted {
		del = append(del, fmt.Sprintf("%s deleted %s", mem, strings.Join(ids, ", ")))
	}
	sort.Strings(del)
	var failed []string
	for _, e := range r.Failed {
		failed = append(failed, fmt.Sprintf("%s (%s %s)", e.Member, e.Code, e.Detail))
	}
	s := "release " + r.Op + " did not keep it and failed, so what it names may be gone"
	if len(del) > 0 {
		s += "; " + strings.Join(del, "; ")
	}
	if len(failed) > 0 {
		s += "; did not release: " + strings.Join(failed, ", ")
	}
	return s + "; nothing was installed: restore a checkpoint that release kept"
}
