package provider

import "context"

// NoSnapshot wraps a provider and hides its snapshots: Caps().Snapshot is
// false and Snapshot and Fork return ErrNoSnapshot. It stands in for
// providers that cannot snapshot (docker, apptainer, enroot), so that
// tests can drive the owner's restart_only mode (PROTOCOL §6).
type NoSnapshot struct {
	inner Wrapped
}

// Wrapped is what NoSnapshot passes through to the provider it wraps.
type Wrapped interface {
	Start(ctx context.Context, spec Spec) (*Sandbox, error)
	Stop(ctx context.Context, id string) error
	Exec(ctx context.Context, id string, argv []string, opts ExecOptions) (ExecResult, error)
	Sandboxes() []string
}

// NewNoSnapshot wraps p.
func NewNoSnapshot(p Wrapped) *NoSnapshot { return &NoSnapshot{inner: p} }

// Name returns "nosnapshot".
func (n *NoSnapshot) Name() string { return "nosnapshot" }

// Caps returns the zero Caps: no snapshots.
func (n *NoSnapshot) Caps() Caps { return Caps{} }

// Start starts a sandbox on the wrapped provider.
func (n *NoSnapshot) Start(ctx context.Context, spec Spec) (*Sandbox, error) {
	return n.inner.Start(ctx, spec)
}

// Stop stops a sandbox on the wrapped provider.
func (n *NoSnapshot) Stop(ctx context.Context, id string) error { return n.inner.Stop(ctx, id) }

// Exec runs a command on the wrapped provider.
func (n *NoSnapshot) Exec(ctx context.Context, id string, argv []string, opts ExecOptions) (ExecResult, error) {
	return n.inner.Exec(ctx, id, argv, opts)
}

// Snapshot returns ErrNoSnapshot.
func (n *NoSnapshot) Snapshot(context.Context, string, string) (Snapshot, error) {
	return Snapshot{}, ErrNoSnapshot
}

// Fork returns ErrNoSnapshot.
func (n *NoSnapshot) Fork(context.Context, string, Spec) (*Sandbox, error) {
	return nil, ErrNoSnapshot
}

// DeleteSnapshot checks the id and returns nil: there is nothing to delete.
func (n *NoSnapshot) DeleteSnapshot(_ context.Context, snapshotID string) error {
	return ValidateID("snapshotID", snapshotID)
}

// Sandboxes lists the wrapped provider's sandboxes.
func (n *NoSnapshot) Sandboxes() []string { return n.inner.Sandboxes() }

// Snapshots returns none.
func (n *NoSnapshot) Snapshots() ([]string, error) { return nil, nil }

// InitExited asks the wrapped provider, when it can tell, whether sandbox
// id's init has exited; false otherwise.
func (n *NoSnapshot) InitExited(id string) bool {
	w, ok := n.inner.(interface{ InitExited(string) bool })
	return ok && w.InitExited(id)
}
