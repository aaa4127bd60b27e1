package owner

import (
	"context"
	"fmt"
	"time"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// Provider is what the owner asks of every sandbox provider: its name
// (records and logs carry it) and a sandbox started for a session and
// stopped when the session ends. The providers under package provider
// (overlay, dir, microvm, nosnapshot) have these methods and every ability
// below; a provider needs only these to serve sessions restart_only.
type Provider interface {
	// Name is a short lower-case name, e.g. "overlay", "dir".
	Name() string
	// Start creates the sandbox spec.ID, writes spec's files into it and
	// starts its first process; it returns once that process runs. A
	// Start that fails leaves nothing behind.
	Start(ctx context.Context, spec provider.Spec) (*provider.Sandbox, error)
	// Stop kills every process of the sandbox and removes what Start made,
	// confirming that nothing is left. Stopping an unknown or stopped
	// sandbox returns nil.
	Stop(ctx context.Context, id string) error
}

// Bounded is the provider ability of saying how many sandboxes it bears
// at once (provider.Bounds): the owner queues the starts beyond them, and
// forks no more at once at a restore.
type Bounded interface {
	Bounds() provider.Bounds
}

// Snapshotter is the provider ability the exported mode needs: a session's
// sandbox captured at a commit, forked at a restore, and the snapshot
// deleted at a release. An owner whose provider is not a Snapshotter, or
// whose Caps say it cannot snapshot, runs restart_only (PROTOCOL §6).
type Snapshotter interface {
	// Caps says what the snapshots can do; Caps().Snapshot false means
	// Snapshot and Fork fail (provider.ErrNoSnapshot).
	Caps() provider.Caps
	// Snapshot captures sandbox id as snapshotID; the sandbox keeps
	// running.
	Snapshot(ctx context.Context, id, snapshotID string) (provider.Snapshot, error)
	// Fork starts a new sandbox, spec.ID, whose files start as the
	// snapshot's.
	Fork(ctx context.Context, snapshotID string, spec provider.Spec) (*provider.Sandbox, error)
	// DeleteSnapshot removes a snapshot and confirms it is gone; deleting
	// an unknown snapshot returns nil.
	DeleteSnapshot(ctx context.Context, snapshotID string) error
}

// Lister is the optional provider ability of listing the sandboxes it
// holds, sorted. An install stops the superseded sandboxes the provider
// still lists; without a Lister it asks the provider to stop every one.
type Lister interface {
	Sandboxes() []string
}

// InitWatcher is the optional provider ability of telling that a
// sandbox's first process (the sandbox daemon, its init) has exited: its
// sandbox runs nothing any more. sandbox_access answers sandbox_exited
// for such a session, so that an agent waiting for a fork's daemon that
// died before it answered learns at once that the sandbox is lost.
type InitWatcher interface {
	InitExited(id string) bool
}

// Execer is the provider ability of running a command in a sandbox and
// waiting for it; a command that ran and failed is not an error (see
// provider.ExecResult.ExitCode). The owner hands it to its task kind's
// setup and grade; with a provider that cannot run commands, they get one
// whose every Exec fails with ErrNoExec.
type Execer interface {
	Exec(ctx context.Context, id string, argv []string, opts provider.ExecOptions) (provider.ExecResult, error)
}

// noExec is the Execer of a provider that cannot run commands.
type noExec struct{ provider string }

func (n noExec) Exec(context.Context, string, []string, provider.ExecOptions) (provider.ExecResult, error) {
	return provider.ExecResult{}, fmt.Errorf("%w: provider %s", ErrNoExec, n.provider)
}

// ClockSetter is the optional provider ability of setting a sandbox's
// wall clock (to wall; the host's time when wall is zero), for a provider
// whose forks keep their processes (provider.Caps.SetsClock). It sets the
// sandbox's own clock, never the host's. The agent decides when (PROTOCOL
// §6, the clock after a restore).
type ClockSetter interface {
	SetClock(ctx context.Context, id string, wall time.Time) error
}
