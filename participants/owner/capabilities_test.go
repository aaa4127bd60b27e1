package owner

import (
	"context"
	"slices"
	"testing"

	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// capsProvider is a Snapshotter that only reports its Caps: what the
// owner's capabilities are made of.
type capsProvider struct{ caps provider.Caps }

func (capsProvider) Name() string { return "vm" }
func (capsProvider) Start(context.Context, provider.Spec) (*provider.Sandbox, error) {
	return nil, provider.ErrNoSnapshot
}
func (capsProvider) Stop(context.Context, string) error { return nil }
func (c capsProvider) Caps() provider.Caps              { return c.caps }
func (capsProvider) Snapshot(context.Context, string, string) (provider.Snapshot, error) {
	return provider.Snapshot{}, provider.ErrNoSnapshot
}
func (capsProvider) Fork(context.Context, string, provider.Spec) (*provider.Sandbox, error) {
	return nil, provider.ErrNoSnapshot
}
func (capsProvider) DeleteSnapshot(context.Context, string) error { return nil }

// The owner's member says which provider it runs and what its snapshots
// keep, so that the agent and a post-mortem can read it from sp_members.
func TestProviderCapabilities(t *testing.T) {
	for _, tc := range []struct {
		p    Provider
		want []string
	}{
		{capsProvider{provider.Caps{Snapshot: true}}, []string{"provider:vm"}},
		{capsProvider{provider.Caps{Snapshot: true, KeepsProcesses: true, Clock: provider.ClockContinuous, SetsClock: true}},
			[]string{"provider:vm", "keeps_processes", "clock:continuous", "sets_clock"}},
	} {
		if got := providerCapabilities(tc.p); !slices.Equal(got, tc.want) {
			t.Errorf("providerCapabilities(%+v) = %v, want %v", tc.p, got, tc.want)
		}
	}
}
