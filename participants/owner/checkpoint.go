package owner

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"maps"
	"path"
	"slices"
	"sync"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// The participant abilities the owner has.
var (
	_ member.Participant = (*Owner)(nil)
	_ member.Exporter    = (*Owner)(nil)
	_ member.Resumer     = (*Owner)(nil)
	_ member.Installer   = (*Owner)(nil)
	_ member.Retirer     = (*Owner)(nil)
	_ member.Releaser    = (*Owner)(nil)
	_ member.Parker      = (*Owner)(nil)
)

// token makes s a token (^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$): it is s when s
// is one already; otherwise the characters outside the set become _, and a
// hash of s keeps distinct inputs apart.
func token(s string) string {
	if events.ValidateToken("id", s) == nil {
		return s
	}
	b := []byte(s)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			b[i] = '_'
		}
	}
	if len(b) == 0 || b[0] == '_' || b[0] == '-' {
		b = append([]byte("x"), b...)
	}
	sum := sha256.Sum256([]byte(s))
	h := hex.EncodeToString(sum[:4])
	if len(b) > 64-len(h)-1 {
		b = b[:64-len(h)-1]
	}
	return string(b) + "-" + h
}

// SnapshotID returns the snapshot id of a session in a checkpoint:
// <checkpoint>-<session>, made a token.
func SnapshotID(checkpointID, sessionID string) string {
	return token(checkpointID + "-" + sessionID)
}

// forEach runs fn(i) for i in [0, n), at most limit at once, and joins the
// errors.
func forEach(n, limit int, fn func(i int) error) error {
	errs := make([]error, n)
	sem := make(chan struct{}, max(limit, 1))
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			errs[i] = fn(i)
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Prepare closes admission (PROTOCOL §5). In ModeExported the owner is
// ready when no request is in flight, and the requests in flight are the
// blockers; a grade running is no blocker (a verify is a boundary, PROTOCOL
// §6): it goes on, and Counts["grading"] says how many run. In
// ModeRestartOnly it reports every session's episode as a restart and is
// ready at once.
func (o *Owner) Prepare(_ context.Context, cp member.Checkpoint) (member.Report, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.closed {
		o.closed = true
		o.reopen = make(chan struct{})
		o.freedLocked() // the service's starts waiting their turn are refused
		o.log.Debug().Str("checkpoint", cp.ID).Msg("admission closed")
	}
	counts := map[string]int{"sessions": len(o.sessions), "in_flight": len(o.inFlight), "grading": len(o.grading)}
	if o.mode != ModeExported {
		keys := map[string]bool{}
		for _, s := range o.sessions {
			keys[s.Episode.String()] = true
		}
		for _, ep := range o.pending {
			keys[ep.String()] = true
		}
		return member.Report{Ready: true, Restarts: slices.Sorted(maps.Keys(keys)), Counts: counts}, nil
	}
	blockers := map[string]bool{}
	for _, id := range o.inFlight {
		blockers[id] = true
	}
	return member.Report{Ready: len(o.inFlight) == 0, Blockers: slices.Sorted(maps.Keys(blockers)), Counts: counts}, nil
}

// Resume reopens admission: requests waiting for it go on.
func (o *Owner) Resume(_ context.Context, checkpointID string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		o.closed = false
		close(o.reopen)
		o.log.Debug().Str("checkpoint", checkpointID).Msg("admission reopened")
	}
	return nil
}

// Export snapshots the sandbox of every live session in the commit's scope
// (every live session when the scope is empty), at most
// SnapshotParallelism at once, indexes the snapshots, and returns one
// record per session and one per kept verdict of a session a verify ended
// (graded.go), sorted by key. A snapshot that fails is taken once
// more; if it fails again (ErrSnapshot, naming the sandbox), the snapshots
// the export took are deleted and the export fails. Outside ModeExported it
// returns no records.
func (o *Owner) Export(ctx context.Context, c events.Commit) iter.Seq2[events.Record, error] {
	return member.Records(o.export(ctx, c))
}

// export takes Export's snapshots and builds its records.
func (o *Owner) export(ctx context.Context, c events.Commit) ([]events.Record, error) {
	if o.mode != ModeExported {
		return nil, nil
	}
	scope := map[events.Episode]bool{}
	for _, ep := range c.Scope {
		scope[ep] = true
	}
	o.mu.Lock()
	var sessions []*Session
	seen := map[events.Episode]string{}
	for _, id := range slices.Sorted(maps.Keys(o.sessions)) {
		s := o.sessions[id]
		if len(scope) > 0 && !scope[s.Episode] {
			continue
		}
		if other, dup := seen[s.Episode]; dup {
			o.mu.Unlock()
			return nil, fmt.Errorf("owner: sessions %s and %s both serve episode %s", other, id, s.Episode)
		}
		seen[s.Episode] = id
		sessions = append(sessions, s.clone())
	}
	o.mu.Unlock()

	p := o.snap // the exported mode's provider is a Snapshotter
	taken := make([]bool, len(sessions))
	err := forEach(len(sessions), o.cfg.SnapshotParallelism, func(i int) error {
		s := sessions[i]
		id := SnapshotID(c.CheckpointID, s.ID)
		size, err := o.snapshot(ctx, p, s, id)
		if err != nil {
			return err
		}
		taken[i] = true
		return o.index(ctx, id, c.CheckpointID, size)
	})
	if err != nil {
		for i, s := range sessions {
			if taken[i] {
				id := SnapshotID(c.CheckpointID, s.ID)
				if derr := o.unindex(context.WithoutCancel(ctx), id, c.CheckpointID); derr != nil {
					o.log.Warn().Err(derr).Str("snapshot", id).Msg("unindex a snapshot of a failed export")
				}
			}
		}
		return nil, err
	}
	recs, err := o.gradedRecords(scope, seen)
	if err != nil {
		return nil, err
	}
	verdicts := len(recs)
	for _, s := range sessions {
		d := s.Data
		if len(d) == 0 {
			d = json.RawMessage("{}")
		}
		b, err := json.Marshal(ownerapi.RecordData{
			Session: s.ID,
			Sandbox: ownerapi.SandboxRef{Provider: o.cfg.Provider.Name(), Snapshot: SnapshotID(c.CheckpointID, s.ID), SandboxID: s.Sandbox.ID},
			Workdir: s.Workdir, Data: d,
		})
		if err != nil {
			return nil, err
		}
		recs = append(recs, events.Record{Key: s.Episode.String(), Data: b})
	}
	slices.SortFunc(recs, func(a, b events.Record) int { return cmp.Compare(a.Key, b.Key) })
	o.log.Info().Str("checkpoint", c.CheckpointID).Int("sessions", len(recs)-verdicts).Int("verdicts", verdicts).Msg("exported")
	return recs, nil
}

// snapshot takes snapshot id of session s's sandbox, and once more when
// the first try fails (a full disk that a release frees, a provider's
// passing error), after deleting what the first left. A second failure
// deletes what it left too, and wraps ErrSnapshot naming the sandbox.
// It returns the bytes the snapshot taken copied.
func (o *Owner) snapshot(ctx context.Context, p Snapshotter, s *Session, id string) (int64, error) {
	began := time.Now()
	snap, first := p.Snapshot(ctx, s.Sandbox.ID, id)
	if first == nil {
		o.cfg.Metrics.Snapshot(o.cfg.Provider.Name(), time.Since(began), snap.Size)
		return snap.Size, nil
	}
	log := o.log.Warn().Err(first).Str("sandbox", s.Sandbox.ID).Str("session", s.ID).Str("snapshot", id)
	if err := p.DeleteSnapshot(ctx, id); err != nil {
		log.AnErr("delete", err).Msg("snapshot failed and what it left cannot be deleted; not taken again")
		return 0, fmt.Errorf("%w: sandbox %s (session %s), snapshot %s: %w; deleting what it left: %w", ErrSnapshot, s.Sandbox.ID, s.ID, id, first, err)
	}
	log.Msg("snapshot failed; taking it again")
	began = time.Now()
	snap, err := p.Snapshot(ctx, s.Sandbox.ID, id)
	if err != nil {
		if derr := p.DeleteSnapshot(context.WithoutCancel(ctx), id); derr != nil {
			o.log.Warn().Err(derr).Str("snapshot", id).Msg("delete what a failed snapshot left")
		}
		return 0, fmt.Errorf("%w: sandbox %s (session %s), snapshot %s: first %w; again %w", ErrSnapshot, s.Sandbox.ID, s.ID, id, first, err)
	}
	o.cfg.Metrics.Snapshot(o.cfg.Provider.Name(), time.Since(began), snap.Size)
	return snap.Size, nil
}

// parsed is one validated record of an Install.
type parsed struct {
	ep   events.Episode
	data ownerapi.RecordData
}

// parseRecord validates a record completely.
func (o *Owner) parseRecord(i int, rec events.Record) (parsed, error) {
	bad := func(format string, args ...any) (parsed, error) {
		return parsed{}, fmt.Errorf("%w: records[%d] %q: "+format, append([]any{ErrRecord, i, rec.Key}, args...)...)
	}
	ep, err := events.ParseEpisode(rec.Key)
	if err != nil {
		return bad("key: %v", err)
	}
	var d ownerapi.RecordData
	dec := json.NewDecoder(bytes.NewReader(rec.Data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return bad("data: %v", err)
	}
	if err := events.ValidateRollout("session", d.Session); err != nil {
		return bad("data.session: %v", err)
	}
	if d.Verdict != nil {
		if err := checkGradedRecord(d); err != nil {
			return bad("%v", err)
		}
		return parsed{ep: ep, data: d}, nil
	}
	if d.Sandbox.Provider != o.cfg.Provider.Name() {
		return bad("data.sandbox.provider %q: this owner's provider is %q", d.Sandbox.Provider, o.cfg.Provider.Name())
	}
	if err := provider.ValidateID("data.sandbox.snapshot", d.Sandbox.Snapshot); err != nil {
		return bad("%v", err)
	}
	if err := provider.ValidateID("data.sandbox.sandbox_id", d.Sandbox.SandboxID); err != nil {
		return bad("%v", err)
	}
	if !path.IsAbs(d.Workdir) {
		return bad("data.workdir %q: must be absolute", d.Workdir)
	}
	if d.Data, err = checkData(d.Data); err != nil {
		return bad("data.data: %v", err)
	}
	return parsed{ep: ep, data: d}, nil
}

// Install restores the records (PROTOCOL §5 restore): it validates every
// record first (a malformed one fails the install with ErrRecord before
// the provider is touched), forks every snapshot into a new sandbox or
// none (a failed fork stops the forks already made), stops the superseded
// sandboxes the provider still holds (every superseded one when it is not a
// Lister), and tracks the sessions as their next attempts, for SeedSession
// to reuse.
func (o *Owner) Install(ctx context.Context, r events.Restore, records []events.Record) ([]events.Episode, error) {
	if len(records) == 0 {
		return nil, ctx.Err()
	}
	if o.mode != ModeExported {
		return nil, fmt.Errorf("%w: %d records", ErrRestartOnly, len(records))
	}
	ps := make([]parsed, 0, len(records))
	var errs []error
	sessions := map[string]bool{}
	o.mu.Lock()
	for i, rec := range records {
		p, err := o.parseRecord(i, rec)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if sessions[p.data.Session] {
			errs = append(errs, fmt.Errorf("%w: records[%d]: session %s appears twice", ErrRecord, i, p.data.Session))
		}
		if _, ok := o.sessions[p.data.Session]; ok {
			errs = append(errs, fmt.Errorf("%w: records[%d]: session %s", ErrSessionExists, i, p.data.Session))
		}
		sessions[p.data.Session] = true
		ps = append(ps, p)
	}
	o.mu.Unlock()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	// A verdict kept for a session its grade ended is installed, not
	// forked (graded.go).
	var verdicts []parsed
	ps = slices.DeleteFunc(ps, func(p parsed) bool {
		if p.data.Verdict != nil {
			verdicts = append(verdicts, p)
			return true
		}
		return false
	})

	prov := o.cfg.Provider
	forks := make([]*provider.Sandbox, len(ps))
	forker, _ := o.kind.(Forker)
	par := o.cfg.SnapshotParallelism
	if o.bounds.Starting > 0 {
		par = min(par, o.bounds.Starting) // a fork starts a sandbox too
	}
	err := forEach(len(ps), par, func(i int) error {
		p := ps[i]
		// Epoch: a provider whose forks keep their processes moves the
		// fork's running sandboxd to the restore's epoch (PROTOCOL §5).
		spec := provider.Spec{ID: token(fmt.Sprintf("%s-e%d", p.data.Session, r.Epoch)), Workdir: p.data.Workdir, Epoch: r.Epoch}
		if forker != nil {
			spec = forker.ForkSpec(spec)
		}
		if spec.Output == nil {
			spec.Output = o.initOutput(spec.ID)
		}
		began := time.Now()
		sb, err := o.snap.Fork(ctx, p.data.Sandbox.Snapshot, spec)
		if err != nil {
			return fmt.Errorf("owner: fork %s for session %s: %w", p.data.Sandbox.Snapshot, p.data.Session, err)
		}
		o.cfg.Metrics.Fork(prov.Name(), time.Since(began), o.snapshotSize(ctx, p.data.Sandbox.Snapshot))
		forks[i] = sb
		return nil
	})
	if err != nil {
		for _, sb := range forks {
			if sb != nil {
				if serr := prov.Stop(context.WithoutCancel(ctx), sb.ID); serr != nil {
					err = errors.Join(err, fmt.Errorf("owner: stop fork %s: %w", sb.ID, serr))
				}
			}
		}
		return nil, err
	}

	lister, listed := prov.(Lister)
	var held []string
	if listed {
		held = lister.Sandboxes()
	}
	installed := make([]events.Episode, 0, len(ps)+len(verdicts))
	o.mu.Lock()
	// All or none, again under the lock: a session started meanwhile, or a
	// cancelled install, installs nothing and leaves no fork.
	var late error
	for _, p := range slices.Concat(ps, verdicts) {
		if _, ok := o.sessions[p.data.Session]; ok {
			late = errors.Join(late, fmt.Errorf("%w: session %s was started during the install", ErrSessionExists, p.data.Session))
		}
	}
	if late == nil {
		late = ctx.Err()
	}
	if late != nil {
		o.mu.Unlock()
		for _, sb := range forks {
			if serr := prov.Stop(context.WithoutCancel(ctx), sb.ID); serr != nil {
				late = errors.Join(late, fmt.Errorf("owner: stop fork %s: %w", sb.ID, serr))
			}
		}
		return nil, late
	}
	for i, p := range ps {
		o.sessions[p.data.Session] = &Session{
			ID: p.data.Session, Episode: p.ep.Next(), Sandbox: forks[i],
			Workdir: p.data.Workdir, Data: p.data.Data, restored: true,
		}
		installed = append(installed, p.ep)
	}
	for _, p := range verdicts {
		o.graded[p.data.Session] = &graded{episode: p.ep.Next(), verdict: p.data.Verdict, ended: time.Now()}
		installed = append(installed, p.ep)
	}
	o.mu.Unlock()
	slices.SortFunc(installed, func(a, b events.Episode) int { return cmp.Compare(a.String(), b.String()) })
	for _, p := range ps {
		old := p.data.Sandbox.SandboxID
		if _, found := slices.BinarySearch(held, old); (listed && !found) || slices.ContainsFunc(forks, func(sb *provider.Sandbox) bool { return sb.ID == old }) {
			continue
		}
		if err := prov.Stop(ctx, old); err != nil {
			o.log.Warn().Err(err).Str("sandbox", old).Msg("stop a superseded sandbox")
		} else {
			o.daemonGone(ctx, old)
		}
	}
	o.log.Info().Str("source", r.Source).Int("sessions", len(ps)).Int("verdicts", len(verdicts)).Msg("restored")
	return installed, nil
}

// Retire stops the sandboxes of the sessions of the given attempts and
// their earlier attempts, and forgets them and their kept verdicts; their
// snapshots stay. A
// session whose stop fails stays tracked, for a retry.
func (o *Owner) Retire(ctx context.Context, eps []events.Episode) error {
	o.mu.Lock()
	o.retireGraded(eps)
	var ids []string
	for id, s := range o.sessions {
		for _, ep := range eps {
			if s.Episode.Rollout == ep.Rollout && s.Episode.Attempt <= ep.Attempt {
				ids = append(ids, id)
				break
			}
		}
	}
	o.mu.Unlock()
	var errs []error
	for _, id := range ids {
		if err := o.end(ctx, id); err != nil && !errors.Is(err, ErrNoSandbox) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Park stops the sandboxes the records exported, after a commit with stop;
// the sessions are forgotten. Best effort: it tries every one and joins
// the errors.
func (o *Owner) Park(ctx context.Context, records []events.Record) error {
	var errs []error
	for _, rec := range records {
		var d ownerapi.RecordData
		if err := json.Unmarshal(rec.Data, &d); err != nil {
			errs = append(errs, fmt.Errorf("%w: %s: %v", ErrRecord, rec.Key, err))
			continue
		}
		o.mu.Lock()
		s, ok := o.sessions[d.Session]
		o.mu.Unlock()
		if !ok || s.Sandbox.ID != d.Sandbox.SandboxID {
			continue
		}
		if err := o.end(ctx, d.Session); err != nil && !errors.Is(err, ErrNoSandbox) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
