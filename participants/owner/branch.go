package owner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

var _ member.Brancher = (*Owner)(nil)

// ErrBranchGraded is returned (wrapped, naming the session) by Branch for a
// parent whose record is a verdict: its grade ended its session, and no
// sandbox is left to fork.
var ErrBranchGraded = errors.New("owner: a graded session has no sandbox to branch")

// branchFork is one fork Branch makes: the parent's record, the branch it
// serves and its session id.
type branchFork struct {
	p       parsed
	spec    events.BranchSpec
	session string
}

// Branch implements member.Brancher (PROTOCOL §5, Branch): for each record
// whose session serves a parent of b, it forks the session's snapshot once
// per branch of that parent, concurrently (bounded as Install's forks),
// each a sandbox of its own (spec id token(<branch session>-a<attempt>-e<epoch>),
// b's epoch: a fork whose sandboxd runs on re-identifies as that id, and
// a sandboxd started anew gets that id's own credentials), and installs
// it as session ownerapi.BranchSession(parent's, k) serving the branch's
// episode, for the agent's seed to reuse. All or none: a fork that fails
// stops the forks made. Records of no parent are left alone; a parent's
// verdict (a graded session) fails with ErrBranchGraded.
func (o *Owner) Branch(ctx context.Context, b events.Branch, records []events.Record) ([]events.Episode, error) {
	specs := map[string][]events.BranchSpec{}
	for _, s := range b.Branches {
		specs[s.Parent.String()] = append(specs[s.Parent.String()], s)
	}
	var forks []branchFork
	var errs []error
	for i, rec := range records {
		todo := specs[rec.Key]
		if len(todo) == 0 {
			continue
		}
		if o.mode != ModeExported {
			return nil, fmt.Errorf("%w: a branch of %s", ErrRestartOnly, rec.Key)
		}
		p, err := o.parseRecord(i, rec)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if p.data.Verdict != nil {
			errs = append(errs, fmt.Errorf("%w: session %s of %s was graded before checkpoint %s", ErrBranchGraded, p.data.Session, rec.Key, b.Source))
			continue
		}
		for _, s := range todo {
			forks = append(forks, branchFork{p: p, spec: s, session: ownerapi.BranchSession(p.data.Session, s.K)})
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if len(forks) == 0 {
		return nil, ctx.Err()
	}
	if err := o.branchSessionsFree(forks); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}

	prov := o.cfg.Provider
	sbs := make([]*provider.Sandbox, len(forks))
	forker, _ := o.kind.(Forker)
	par := o.cfg.SnapshotParallelism
	if o.bounds.Starting > 0 {
		par = min(par, o.bounds.Starting)
	}
	stop := func(err error) error {
		for _, sb := range sbs {
			if sb != nil {
				if serr := prov.Stop(context.WithoutCancel(ctx), sb.ID); serr != nil {
					err = errors.Join(err, fmt.Errorf("owner: stop branch fork %s: %w", sb.ID, serr))
				} else {
					o.daemonGone(context.WithoutCancel(ctx), sb.ID)
				}
			}
		}
		return err
	}
	err := forEach(len(forks), par, func(i int) error {
		f := forks[i]
		spec := provider.Spec{ID: token(fmt.Sprintf("%s-a%d-e%d", f.session, f.spec.Episode.Attempt, b.Epoch)), Workdir: f.p.data.Workdir, Epoch: b.Epoch}
		if forker != nil {
			spec = forker.ForkSpec(spec)
		}
		if spec.Output == nil {
			spec.Output = o.initOutput(spec.ID)
		}
		began := time.Now()
		sb, err := o.snap.Fork(ctx, f.p.data.Sandbox.Snapshot, spec)
		if err != nil {
			return fmt.Errorf("owner: fork %s for branch %d of session %s (%s): %w", f.p.data.Sandbox.Snapshot, f.spec.K, f.p.data.Session, f.spec.Episode, err)
		}
		o.cfg.Metrics.Fork(prov.Name(), time.Since(began), o.snapshotSize(ctx, f.p.data.Sandbox.Snapshot))
		sbs[i] = sb
		return nil
	})
	if err != nil {
		return nil, stop(err)
	}

	o.mu.Lock()
	// All or none, again under the lock: a session started meanwhile, or a
	// cancelled branch, installs nothing and leaves no fork.
	late := o.branchSessionsFreeLocked(forks)
	if late == nil {
		late = ctx.Err()
	}
	if late != nil {
		o.mu.Unlock()
		return nil, stop(late)
	}
	installed := make([]events.Episode, 0, len(forks))
	for i, f := range forks {
		o.sessions[f.session] = &Session{
			ID: f.session, Episode: f.spec.Episode, Sandbox: sbs[i],
			Workdir: f.p.data.Workdir, Data: f.p.data.Data, restored: true,
		}
		installed = append(installed, f.spec.Episode)
	}
	o.mu.Unlock()
	slices.SortFunc(installed, func(a, b events.Episode) int { return cmp.Compare(a.String(), b.String()) })
	o.log.Info().Str("source", b.Source).Int("branches", len(forks)).Msg("branched")
	return installed, nil
}

// branchSessionsFree refuses forks whose session id the owner tracks, or is
// starting, already.
func (o *Owner) branchSessionsFree(forks []branchFork) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.branchSessionsFreeLocked(forks)
}

func (o *Owner) branchSessionsFreeLocked(forks []branchFork) error {
	var errs []error
	for _, f := range forks {
		_, tracked := o.sessions[f.session]
		_, starting := o.pending[f.session]
		if tracked || starting {
			errs = append(errs, fmt.Errorf("%w: session %s of branch %s", ErrSessionExists, f.session, f.spec.Episode))
		}
	}
	return errors.Join(errs...)
}
