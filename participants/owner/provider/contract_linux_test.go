//go:build linux

package provider

import "context"

// Provider is the shape every provider of this package has, so that the
// tests run the same checks on each. The owner declares the smaller
// interfaces it calls (participants/owner: Provider, Snapshotter, Lister,
// Execer); this one exists for the tests alone.
type Provider interface {
	Name() string
	Caps() Caps
	Start(ctx context.Context, spec Spec) (*Sandbox, error)
	Stop(ctx context.Context, id string) error
	Exec(ctx context.Context, id string, argv []string, opts ExecOptions) (ExecResult, error)
	Snapshot(ctx context.Context, id, snapshotID string) (Snapshot, error)
	Fork(ctx context.Context, snapshotID string, spec Spec) (*Sandbox, error)
	DeleteSnapshot(ctx context.Context, snapshotID string) error
	Sandboxes() []string
	Snapshots() ([]string, error)
}

// Every provider has the same shape.
var (
	_ Provider = (*Overlay)(nil)
	_ Provider = (*Dir)(nil)
	_ Provider = (*NoSnapshot)(nil)
)
