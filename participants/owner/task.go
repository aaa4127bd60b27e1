package owner

import (
	"context"
	"encoding/json"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// TaskKind is a kind of task the owner serves (Config.TaskKind): how a
// session's sandbox is built from its task payload, and how the session is
// graded. A kind may also set sessions up (Setuper) and complete the
// sandboxes a restore forks (Forker). TaskFuncs makes one of functions.
type TaskKind interface {
	// Spec builds the sandbox of a session from its task payload: the
	// files the task puts in, the sandbox's first process, its
	// environment. An error refuses the seed (ErrBadTask, 400).
	Spec(sessionID string, ep events.Episode, task json.RawMessage) (provider.Spec, error)
	// Grade grades a session: a check of its sandbox (through x, on
	// s.Sandbox.ID) and of the session data its setup returned. It returns
	// the verdict, a JSON object. The owner's x is a GradeSandboxes too: a
	// grade that must not trust the session's sandbox runs in one of its
	// own (Fresh).
	Grade(ctx context.Context, x Execer, s *Session) (json.RawMessage, error)
}

// Setuper is the optional setup of a task kind. It runs against a
// session's started sandbox, with the task payload the seed carried (nil
// for a session started through StartSession), and may return a small
// JSON object, the session data, or nothing; it may change s.Workdir. The
// session data is exported with the session's snapshot and restored with
// it: what a grade must hold on to goes there, out of the agent's reach.
type Setuper interface {
	Setup(ctx context.Context, x Execer, s *Session, task json.RawMessage) (json.RawMessage, error)
}

// Forker is the optional ability of a task kind to complete the spec of
// each fork a restore starts (the provider's Fork runs its Init: e.g.
// sandboxd under the fork's id, through SandboxdSpec). Without it a fork
// starts with an idle init.
type Forker interface {
	ForkSpec(spec provider.Spec) provider.Spec
}

// SpecFunc is TaskKind.Spec as a function.
type SpecFunc func(sessionID string, ep events.Episode, task json.RawMessage) (provider.Spec, error)

// SetupFunc is Setuper.Setup as a function.
type SetupFunc func(ctx context.Context, x Execer, s *Session, task json.RawMessage) (json.RawMessage, error)

// GradeFunc is TaskKind.Grade as a function.
type GradeFunc func(ctx context.Context, x Execer, s *Session) (json.RawMessage, error)

// TaskFuncs is a task kind made of functions. A nil one does what an
// owner without a task kind does: SpecFn nil gives the zero spec (the
// sandbox is named after the session, workdir /, an idle init), SetupFn
// nil sets up nothing, GradeFn nil grades {}, ForkSpecFn nil forks with an
// idle init.
type TaskFuncs struct {
	SpecFn     SpecFunc
	SetupFn    SetupFunc
	GradeFn    GradeFunc
	ForkSpecFn func(provider.Spec) provider.Spec
}

// The abilities of TaskFuncs.
var (
	_ TaskKind = TaskFuncs{}
	_ Setuper  = TaskFuncs{}
	_ Forker   = TaskFuncs{}
)

// Spec implements TaskKind.
func (f TaskFuncs) Spec(sessionID string, ep events.Episode, task json.RawMessage) (provider.Spec, error) {
	if f.SpecFn == nil {
		return provider.Spec{}, nil
	}
	return f.SpecFn(sessionID, ep, task)
}

// Grade implements TaskKind.
func (f TaskFuncs) Grade(ctx context.Context, x Execer, s *Session) (json.RawMessage, error) {
	if f.GradeFn == nil {
		return json.RawMessage(`{}`), nil
	}
	return f.GradeFn(ctx, x, s)
}

// Setup implements Setuper.
func (f TaskFuncs) Setup(ctx context.Context, x Execer, s *Session, task json.RawMessage) (json.RawMessage, error) {
	if f.SetupFn == nil {
		return nil, nil
	}
	return f.SetupFn(ctx, x, s, task)
}

// ForkSpec implements Forker.
func (f TaskFuncs) ForkSpec(spec provider.Spec) provider.Spec {
	if f.ForkSpecFn == nil {
		return spec
	}
	return f.ForkSpecFn(spec)
}
