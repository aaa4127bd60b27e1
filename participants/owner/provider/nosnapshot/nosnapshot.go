package nosnapshot

import (
	"context"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// Provider wraps a provider and hides its snapshots: Caps().Snapshot is
// false and Snapshot and Fork return provider.ErrNoSnapshot. It stands in for
// providers that cannot snapshot (docker, apptainer, enroot), so that
// tests can drive the owner's restart_only mode (PROTOCOL §6).
type Provider struct {
	inner Wrapped
}

// Wrapped is what Provider passes through to the provider it wraps.
type Wrapped interface {
	Start(ctx context.Context, spec provider.Spec) (*provider.Sandbox, error)
	Stop(ctx context.Context, id string) error
	Exec(ctx context.Context, id string, argv []string, opts provider.ExecOptions) (provider.ExecResult, error)
	Sandboxes() []string
}

// New wraps p.
func New(p Wrapped) *Provider { return &Provider{inner: p} }

// Name returns "nosnapshot".
func (n *Provider) Name() string { return "nosnapshot" }

// Caps returns the zero Caps: no snapshots.
func (n *Provider) Caps() provider.Caps { return provider.Caps{} }

// Start starts a sandbox on the wrapped provider.
func (n *Provider) Start(ctx context.Context, spec provider.Spec) (*provider.Sandbox, error) {
	return n.inner.Start(ctx, spec)
}

// Stop stops a sandbox on the wrapped provider.
func (n *Provider) Stop(ctx context.Context, id string) error { return n.inner.Stop(ctx, id) }

// Exec runs a command on the wrapped provider.
func (n *Provider) Exec(ctx context.Context, id string, argv []string, opts provider.ExecOptions) (provider.ExecResult, error) {
	return n.inner.Exec(ctx, id, argv, opts)
}

// Snapshot returns ErrNoSnapshot.
func (n *Provider) Snapshot(context.Context, string, string) (provider.Snapshot, error) {
	return provider.Snapshot{}, provider.ErrNoSnapshot
}

// Fork returns ErrNoSnapshot.
func (n *Provider) Fork(context.Context, string, provider.Spec) (*provider.Sandbox, error) {
	return nil, provider.ErrNoSnapshot
}

// DeleteSnapshot checks the id and returns nil: there is nothing to delete.
func (n *Provider) DeleteSnapshot(_ context.Context, snapshotID string) error {
	return provider.ValidateID("snapshotID", snapshotID)
}

// Sandboxes lists the wrapped provider's sandboxes.
func (n *Provider) Sandboxes() []string { return n.inner.Sandboxes() }

// Snapshots returns none.
func (n *Provider) Snapshots() ([]string, error) { return nil, nil }

// InitExited asks the wrapped provider, when it can tell, whether sandbox
// id's init has exited; false otherwise.
func (n *Provider) InitExited(id string) bool {
	w, ok := n.inner.(interface{ InitExited(string) bool })
	return ok && w.InitExited(id)
}
