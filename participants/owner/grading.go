package owner

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// GradeSandboxes is what a task kind's grade may ask of the owner beside
// running commands: a sandbox of the grade's own, started afresh, so that
// the grade trusts nothing of the session's sandbox but what it chooses to
// read there (the swe kind takes the model's diff and grades it in a fresh
// sandbox of the image, as SWE-bench grades in a fresh container). The
// Execer TaskKind.Grade gets is one.
type GradeSandboxes interface {
	Execer
	// Fresh starts a sandbox for the grade from spec, as a seed's sandbox
	// is started: spec.ImageRef resolved (the image's Env and WorkingDir
	// applied), Workdir "/" when left "", Init as given (empty: an idle
	// init). The owner names it (spec.ID is ignored) so that it is never a
	// session's sandbox; it is no session's: a checkpoint does not
	// snapshot it, and an owner started after a crash stops it with the
	// other sandboxes left on disk. It counts among the live sandboxes the
	// provider's bounds allow, waiting only for the bound of starts (a
	// grade must not wait for sessions that end only after their grades).
	// remove stops it and may be called more than once; the grade calls it
	// however it ends. A failure to stop is logged.
	Fresh(ctx context.Context, spec provider.Spec) (sb *provider.Sandbox, remove func(), err error)
}

// gradeExec is the Execer a grade gets: the provider's (or noExec), and
// the grade's fresh sandboxes.
type gradeExec struct {
	Execer
	o       *Owner
	session string
}

var _ GradeSandboxes = gradeExec{}

// graderFor returns the Execer the grade of session id gets.
func (o *Owner) graderFor(id string) Execer {
	return gradeExec{Execer: o.exec, o: o, session: id}
}

// maxFreshTries bounds the names Fresh tries when the provider already
// has a sandbox of the name it chose.
const maxFreshTries = 4

// Fresh implements GradeSandboxes.
func (g gradeExec) Fresh(ctx context.Context, spec provider.Spec) (*provider.Sandbox, func(), error) {
	o := g.o
	if _, ok := g.Execer.(noExec); ok {
		return nil, nil, fmt.Errorf("%w: provider %s: no grading sandbox for session %s", ErrNoExec, o.cfg.Provider.Name(), g.session)
	}
	spec.Init = append([]string(nil), spec.Init...)
	// Held from its resolution until the provider holds it for the
	// started sandbox (resolveImage).
	release, err := o.resolveImage(ctx, g.session, &spec)
	if err != nil {
		return nil, nil, err
	}
	defer release()
	if spec.Workdir == "" {
		spec.Workdir = "/"
	}
	// A grade goes on through a checkpoint (verify): its sandbox is not
	// refused while one is open, as a service request's start would be.
	turn, err := o.turn(context.WithValue(ctx, noHoldKey{}, nil), g.session, true)
	if err != nil {
		return nil, nil, err
	}
	defer turn()
	var sb *provider.Sandbox
	for try := 0; ; try++ {
		spec.ID = o.freshID(g.session)
		spec.Output = o.initOutput(spec.ID)
		sb, err = o.cfg.Provider.Start(ctx, spec)
		if err == nil || !errors.Is(err, provider.ErrExists) || try+1 >= maxFreshTries {
			break
		}
	}
	if err != nil {
		return nil, nil, fmt.Errorf("owner: start a grading sandbox for session %s: %w", g.session, err)
	}
	o.mu.Lock()
	o.fresh++
	o.mu.Unlock()
	o.log.Debug().Str("session", g.session).Str("sandbox", sb.ID).Msg("grading sandbox started")
	remove := sync.OnceFunc(func() {
		if err := o.cfg.Provider.Stop(context.WithoutCancel(ctx), sb.ID); err != nil {
			o.log.Warn().Err(err).Str("session", g.session).Str("sandbox", sb.ID).Msg("stop a grading sandbox")
		}
		o.mu.Lock()
		o.fresh--
		o.freedLocked()
		o.mu.Unlock()
	})
	return sb, remove, nil
}

// freshID names a grading sandbox: gr<n>-<session>, made a sandbox id,
// and no session's sandbox.
func (o *Owner) freshID(session string) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	for {
		o.nextFresh++
		id := token(fmt.Sprintf("gr%d-%s", o.nextFresh, session))
		taken := false
		for _, s := range o.sessions {
			taken = taken || s.Sandbox != nil && s.Sandbox.ID == id
		}
		if !taken {
			return id
		}
	}
}
