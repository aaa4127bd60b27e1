package bridge

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/internal/failpoint"
	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
)

// Checkpoint takes a checkpoint: prepare, commit, manifest, LATEST,
// outcome, resume. A failure of the fleet is not an error: the result has
// Status failed and names every blocker and member. Errors are for what
// kept the bridge from deciding (a bad request, another operation open,
// the bus).
func (b *Bridge) Checkpoint(ctx context.Context, req bridgeapi.CheckpointRequest) (*bridgeapi.CheckpointResult, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.begin(ctx); err != nil {
		return nil, err
	}
	if req.ID == "" {
		req.ID = "c-" + b.cfg.Now().UTC().Format("20060102T150405.000Z")
		req.ID = sanitizeID(req.ID)
	}
	if m, _, err := b.manifest(ctx, req.ID); err != nil {
		return nil, err
	} else if m != nil {
		return bridgeapi.ResultOf(m), nil
	}
	st, err := b.state(ctx)
	if err != nil {
		return nil, err
	}
	if st.last != nil && st.last.Header().CheckpointID == req.ID {
		return nil, fmt.Errorf("%w: id %s was already used by %s seq %d", bridgeapi.ErrBadRequest, req.ID, st.last.Phase(), st.seq)
	}
	members, _, err := b.liveMembers(ctx, st.epoch, false)
	if err != nil {
		return nil, err
	}
	log := b.log.With().Str("checkpoint", req.ID).Logger()
	timeout := b.phaseTimeout(req.TimeoutMS)
	started := b.cfg.Now()

	prep := events.Prepare{PhaseHeader: b.header(&st, req.ID, st.epoch, members, timeout)}
	if err := b.publishPhase(ctx, &st, prep); err != nil {
		return nil, err
	}
	log.Info().Int("members", len(members)).Uint64("seq", st.seq).Msg("prepare published")
	failpoint.Hit("bridge/after-prepare")
	tally, verdict, err := b.gather(ctx, prep)
	if err != nil {
		return nil, err
	}
	prepMS := b.cfg.Now().Sub(started).Milliseconds()
	failpoint.Hit("bridge/after-prepare-acks")
	if verdict != machine.Complete {
		errs, blockers, counts := tally.Failure(b.cfg.Now())
		log.Warn().Int("failed_members", len(errs)).Msg("prepare failed; aborting")
		return b.abort(ctx, &st, prep.PhaseHeader, events.PhasePrepare, &bridgeapi.Failure{Phase: events.PhasePrepare,
			Reason: fmt.Sprintf("%d of %d members not ready, failed or silent", len(errs), len(members)),
			Errors: errs, Blockers: blockers, BlockerCount: counts}, started, prepMS)
	}
	if req.Hold {
		b.hold(req, prep, st.lastID, tally, started, prepMS, timeout)
		log.Info().Int64("prepare_ms", prepMS).Msg("checkpoint held prepared")
		return &bridgeapi.CheckpointResult{Run: b.cfg.Run, CheckpointID: req.ID, Status: bridgeapi.StatusPrepared, Epoch: st.epoch,
			Members: members, PrepareMS: prepMS, Restarted: restartsOf(tally)}, nil
	}
	return b.commit(ctx, &st, req, prep, tally, started, prepMS, timeout)
}

// commit runs the commit phase of a prepared checkpoint and finishes it.
func (b *Bridge) commit(ctx context.Context, st *runState, req bridgeapi.CheckpointRequest, prep events.Prepare, prepTally *machine.Tally,
	started time.Time, prepMS int64, timeout time.Duration) (*bridgeapi.CheckpointResult, error) {
	log := b.log.With().Str("checkpoint", req.ID).Logger()
	restarts := restartsOf(prepTally)
	scope := scopeOf(req.Episodes, restarts)
	commitStart := b.cfg.Now()
	// A sandbox daemon excused at prepare (its sandbox stopped) is not
	// asked to commit.
	c := events.Commit{PhaseHeader: b.header(st, req.ID, st.epoch, prepTally.Members(), timeout), Scope: scope, Stop: req.Stop}
	if err := b.publishPhase(ctx, st, c); err != nil {
		return nil, err
	}
	log.Info().Uint64("seq", st.seq).Int("scope", len(scope)).Bool("stop", req.Stop).Msg("commit published")
	failpoint.Hit("bridge/after-commit")
	tally, verdict, err := b.gather(ctx, c)
	if err != nil {
		return nil, err
	}
	failpoint.Hit("bridge/after-commit-acks")
	commitMS := b.cfg.Now().Sub(commitStart).Milliseconds()
	if verdict != machine.Complete {
		errs, _, _ := tally.Failure(b.cfg.Now())
		log.Warn().Int("failed_members", len(errs)).Msg("commit failed; aborting")
		return b.abort(ctx, st, c.PhaseHeader, events.PhaseCommit, &bridgeapi.Failure{Phase: events.PhaseCommit,
			Reason: fmt.Sprintf("%d of %d members did not export", len(errs), len(c.Members)), Errors: errs}, started, prepMS)
	}
	m, err := b.buildManifest(ctx, c, tally, restarts, prep.Seq, prepMS, commitMS)
	if err != nil {
		log.Warn().Err(err).Msg("member manifests do not verify; aborting")
		return b.abort(ctx, st, c.PhaseHeader, events.PhaseCommit, &bridgeapi.Failure{Phase: events.PhaseCommit, Reason: err.Error()}, started, prepMS)
	}
	return b.finishCommitted(ctx, st, m, tally.Members())
}

// buildManifest assembles the checkpoint manifest from the commit acks,
// checking every member manifest against the one the member created.
func (b *Bridge) buildManifest(ctx context.Context, c events.Commit, t *machine.Tally, restarts []string, prepSeq uint64, prepMS, commitMS int64) (events.CheckpointManifest, error) {
	m := events.CheckpointManifest{Schema: events.CheckpointSchema, Run: b.cfg.Run, CheckpointID: c.CheckpointID, Epoch: c.Epoch,
		Created: b.cfg.Now().UTC(), Restarted: restarts, PrepareSeq: prepSeq, CommitSeq: c.Seq, PrepareMS: prepMS, CommitMS: commitMS, Stop: c.Stop}
	restarted := map[string]bool{}
	for _, r := range restarts {
		restarted[r] = true
	}
	stored, err := snapshot(ctx, b.cfg.Bus.Manifests, events.ManifestKey(b.cfg.Run, c.CheckpointID)+".>")
	if err != nil {
		return m, fmt.Errorf("bridge: read member manifests: %w", err)
	}
	continued := map[string]bool{}
	for _, member := range t.Members() {
		ack, _ := t.Acks()[member].(events.CommitAck)
		if ack.Manifest == nil {
			return m, fmt.Errorf("member %s acked the commit without a manifest", member)
		}
		raw, ok := stored[events.MemberManifestKey(b.cfg.Run, c.CheckpointID, member)]
		if !ok {
			return m, fmt.Errorf("member %s acked the commit of %s but created no manifest", member, c.CheckpointID)
		}
		var mm events.MemberManifest
		if err := json.Unmarshal(raw, &mm); err != nil {
			return m, fmt.Errorf("member %s: manifest does not decode: %w", member, err)
		}
		if err := mm.Validate(); err != nil {
			return m, fmt.Errorf("member %s: %w", member, err)
		}
		if mm.Member != member || mm.CheckpointID != c.CheckpointID || mm.Run != b.cfg.Run {
			return m, fmt.Errorf("member %s: its manifest names %s/%s/%s", member, mm.Run, mm.CheckpointID, mm.Member)
		}
		if mm.SHA256 != ack.Manifest.SHA256 || mm.Count != ack.Manifest.Count || mm.Object != ack.Manifest.Object {
			return m, fmt.Errorf("member %s: its ack and its stored manifest disagree", member)
		}
		m.Members = append(m.Members, mm)
		for _, k := range mm.Episodes {
			if !restarted[k] {
				continued[k] = true
			}
		}
	}
	for k := range continued {
		m.Continued = append(m.Continued, k)
	}
	sort.Strings(m.Continued)
	return m, m.Validate()
}

// finishCommitted creates the manifest (the commit point), moves LATEST,
// publishes the outcome and resumes (not with stop). Every step is
// idempotent, so recovery calls it again after a crash anywhere in it.
func (b *Bridge) finishCommitted(ctx context.Context, st *runState, m events.CheckpointManifest, members []events.Member) (*bridgeapi.CheckpointResult, error) {
	log := b.log.With().Str("checkpoint", m.CheckpointID).Logger()
	have, created, err := b.createManifest(ctx, m)
	if err != nil {
		return nil, err
	}
	if have.Aborted {
		// Another bridge aborted it first: it never exists.
		log.Warn().Str("reason", have.Reason).Msg("the checkpoint was aborted by another bridge; not committing")
		return b.finishAborted(ctx, st, have, members, events.PhaseCommit, &bridgeapi.Failure{Phase: events.PhaseCommit, Reason: have.Reason})
	}
	m = *have
	if created {
		log.Info().Int("continued", len(m.Continued)).Int("restarted", len(m.Restarted)).Msg("checkpoint manifest created")
	}
	failpoint.Hit("bridge/after-manifest")
	if err := b.moveLatest(ctx, m); err != nil {
		return nil, err
	}
	failpoint.Hit("bridge/after-latest")
	if o, err := b.outcomeOf(ctx, events.TypeCheckpointCommitted, m.CheckpointID); err != nil {
		return nil, err
	} else if o == nil {
		out := events.CheckpointCommitted{OutcomeHeader: events.OutcomeHeader{Run: b.cfg.Run, CheckpointID: m.CheckpointID, Epoch: m.Epoch},
			Continued: m.Continued, Restarted: m.Restarted, Members: members, PrepareMS: m.PrepareMS, CommitMS: m.CommitMS, Stop: m.Stop}
		if out.Members == nil {
			out.Members = []events.Member{}
		}
		if err := b.publishOutcome(ctx, out, m.CheckpointID); err != nil {
			return nil, err
		}
	}
	failpoint.Hit("bridge/after-outcome")
	res := bridgeapi.ResultOf(&m)
	res.Members = members
	if !m.Stop {
		if err := b.resume(ctx, st, m.CheckpointID, members, false); err != nil {
			return nil, err
		}
	}
	log.Info().Int64("prepare_ms", m.PrepareMS).Int64("commit_ms", m.CommitMS).Bool("stop", m.Stop).Msg("checkpoint committed")
	return res, nil
}

// moveLatest points LATEST at m by compare-and-set, unless it already
// does or names a checkpoint committed later.
func (b *Bridge) moveLatest(ctx context.Context, m events.CheckpointManifest) error {
	key := events.LatestKey(b.cfg.Run)
	for range 5 {
		cur, rev, err := b.latest(ctx)
		if err != nil {
			return err
		}
		if cur != nil && (cur.CheckpointID == m.CheckpointID || cur.CommitSeq > m.CommitSeq) {
			// Already there, or a later checkpoint is: a slow bridge
			// finishing an older one never moves LATEST back.
			return nil
		}
		v, _ := json.Marshal(events.Latest{CheckpointID: m.CheckpointID, Epoch: m.Epoch, CommitSeq: m.CommitSeq, Updated: b.cfg.Now().UTC()})
		if cur == nil {
			_, err = b.cfg.Bus.Manifests.Create(ctx, key, v)
		} else {
			_, err = b.cfg.Bus.Manifests.Update(ctx, key, v, rev)
		}
		if err == nil {
			return nil
		}
		b.log.Debug().Err(err).Msg("LATEST moved under us; reading it again")
	}
	return fmt.Errorf("bridge: LATEST of run %s keeps moving; giving up", b.cfg.Run)
}

// abort makes sure the checkpoint never exists (the abort marker), reports
// checkpoint.failed and resumes the fleet. If the checkpoint was committed
// first (by this bridge before a crash, or another), it finishes that
// instead.
func (b *Bridge) abort(ctx context.Context, st *runState, h events.PhaseHeader, phase events.Phase, f *bridgeapi.Failure, started time.Time, prepMS int64) (*bridgeapi.CheckpointResult, error) {
	marker := events.CheckpointManifest{Schema: events.CheckpointSchema, Run: b.cfg.Run, CheckpointID: h.CheckpointID, Epoch: h.Epoch,
		Created: b.cfg.Now().UTC(), Aborted: true, Reason: f.Reason, PrepareMS: prepMS}
	have, _, err := b.createManifest(ctx, marker)
	if err != nil {
		return nil, err
	}
	if !have.Aborted {
		b.log.Warn().Str("checkpoint", h.CheckpointID).Msg("abort found the checkpoint committed; finishing the commit")
		return b.finishCommitted(ctx, st, *have, h.Members)
	}
	failpoint.Hit("bridge/after-abort-marker")
	return b.finishAborted(ctx, st, have, h.Members, phase, f)
}

// finishAborted publishes checkpoint.failed (once) and resumes.
func (b *Bridge) finishAborted(ctx context.Context, st *runState, m *events.CheckpointManifest, members []events.Member, phase events.Phase, f *bridgeapi.Failure) (*bridgeapi.CheckpointResult, error) {
	if o, err := b.outcomeOf(ctx, events.TypeCheckpointFailed, m.CheckpointID); err != nil {
		return nil, err
	} else if o == nil {
		out := events.CheckpointFailed{OutcomeHeader: events.OutcomeHeader{Run: b.cfg.Run, CheckpointID: m.CheckpointID, Epoch: m.Epoch},
			Phase: phase, Reason: f.Reason, Blockers: f.Blockers, BlockerCount: f.BlockerCount, Errors: f.Errors}
		if len(out.Reason) > events.MaxDetail {
			out.Reason = out.Reason[:events.MaxDetail]
		}
		if err := b.publishOutcome(ctx, out, m.CheckpointID); err != nil {
			return nil, err
		}
	}
	res := &bridgeapi.CheckpointResult{Run: b.cfg.Run, CheckpointID: m.CheckpointID, Status: bridgeapi.StatusFailed, Epoch: m.Epoch,
		Members: members, PrepareMS: m.PrepareMS, Failure: f}
	if st.last != nil && st.last.Phase() == events.PhaseResume && st.last.Header().CheckpointID == m.CheckpointID {
		return res, nil
	}
	if err := b.resume(ctx, st, m.CheckpointID, members, true); err != nil {
		return nil, err
	}
	return res, nil
}

// hold keeps a prepared checkpoint parked, renewing the lease every third
// of the phase timeout until Commit or Abort. The caller holds b.mu.
func (b *Bridge) hold(req bridgeapi.CheckpointRequest, prep events.Prepare, lastID string, t *machine.Tally, started time.Time, prepMS int64, timeout time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	h := &heldCheckpoint{req: req, id: req.ID, prepare: prep, lastID: lastID, tally: t, started: started, prepMS: prepMS,
		stop: cancel, done: make(chan struct{})}
	b.held = h
	go func() {
		defer close(h.done)
		tick := time.NewTicker(max(timeout/3, 10*time.Millisecond))
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if err := b.renew(ctx, h, timeout); err != nil && ctx.Err() == nil {
				b.log.Error().Err(err).Str("checkpoint", h.id).Msg("renewing the held checkpoint")
			}
		}
	}()
}

// renew publishes a renew of the held checkpoint. While a checkpoint is
// held every other operation is refused, so the renew goroutine is the
// only publisher; h.mu orders it against stopRenew.
func (b *Bridge) renew(ctx context.Context, h *heldCheckpoint, timeout time.Duration) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ctx.Err() != nil {
		return nil
	}
	st, err := b.state(ctx)
	if err != nil {
		return err
	}
	if st.lastID != h.lastID {
		return fmt.Errorf("%w: checkpoint %s is no longer the run's open phase (last is %s)", bridgeapi.ErrFenced, h.id, st.lastID)
	}
	r := events.Renew{PhaseHeader: b.header(&st, h.id, st.epoch, h.prepare.Members, timeout)}
	if err := b.publishPhase(ctx, &st, r); err != nil {
		return err
	}
	h.lastID = st.lastID
	b.log.Debug().Str("checkpoint", h.id).Msg("lease renewed")
	return nil
}

// stopRenew ends the hold: no renew is published after it returns. The
// caller holds b.mu.
func (b *Bridge) stopRenew() {
	h := b.held
	if h == nil {
		return
	}
	h.mu.Lock()
	h.stop()
	h.mu.Unlock()
	<-h.done
	b.held = nil
}

// Commit commits the checkpoint held prepared by a Checkpoint with Hold;
// stop parks the fleet as in bridgeapi.CheckpointRequest.
func (b *Bridge) Commit(ctx context.Context, id string, stop bool) (*bridgeapi.CheckpointResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h, st, err := b.unhold(ctx, id)
	if err != nil {
		return nil, err
	}
	req := h.req
	req.Stop = stop
	return b.commit(ctx, &st, req, h.prepare, h.tally, h.started, h.prepMS, b.phaseTimeout(req.TimeoutMS))
}

// Abort abandons the held checkpoint id: abort marker, outcome, resume.
func (b *Bridge) Abort(ctx context.Context, id string) (*bridgeapi.CheckpointResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h, st, err := b.unhold(ctx, id)
	if err != nil {
		return nil, err
	}
	return b.abort(ctx, &st, h.prepare.PhaseHeader, events.PhasePrepare,
		&bridgeapi.Failure{Phase: events.PhasePrepare, Reason: "aborted by the controller"}, h.started, h.prepMS)
}

// unhold ends the hold of checkpoint id and reads the run's state, for
// Commit and Abort. The caller holds b.mu.
func (b *Bridge) unhold(ctx context.Context, id string) (*heldCheckpoint, runState, error) {
	h := b.held
	if h == nil || h.id != id {
		return nil, runState{}, fmt.Errorf("%w: no checkpoint %s is held", bridgeapi.ErrNotFound, id)
	}
	b.stopRenew()
	st, err := b.state(ctx)
	if err == nil && st.lastID != h.lastID {
		// Another bridge took the run over (and aborted this checkpoint, or
		// will): committing now would commit after its resume.
		err = fmt.Errorf("%w: checkpoint %s is no longer the run's open phase", bridgeapi.ErrFenced, h.id)
	}
	return h, st, err
}

// begin refuses an operation while a checkpoint is held and finishes what
// a previous bridge left open. The caller holds b.mu.
func (b *Bridge) begin(ctx context.Context) error {
	if b.held != nil {
		return fmt.Errorf("%w: checkpoint %s is held prepared", bridgeapi.ErrBusy, b.held.id)
	}
	return b.recoverLocked(ctx)
}

func restartsOf(t *machine.Tally) []string {
	seen := map[string]bool{}
	var out []string
	for _, ack := range t.Acks() {
		if p, ok := ack.(events.PrepareAck); ok {
			for _, r := range p.Restarts {
				if !seen[r] {
					seen[r] = true
					out = append(out, r)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

// scopeOf returns the commit scope: the controller's episodes minus the
// restarts, or nil (every episode the members hold) when it named none.
func scopeOf(episodes, restarts []string) []events.Episode {
	if len(episodes) == 0 {
		return nil
	}
	skip := map[string]bool{}
	for _, r := range restarts {
		skip[r] = true
	}
	var scope []events.Episode
	for _, e := range episodes {
		if skip[e] {
			continue
		}
		ep, _ := events.ParseEpisode(e)
		scope = append(scope, ep)
	}
	return scope
}

// sanitizeID makes a generated id a valid token.
func sanitizeID(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			b[i] = '-'
		}
	}
	return string(b)
}
