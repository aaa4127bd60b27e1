package owner

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

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

// clockProvider is a capsProvider that can set a sandbox's clock.
type clockProvider struct {
	capsProvider
	set []time.Time
}

func (c *clockProvider) SetClock(_ context.Context, _ string, wall time.Time) error {
	c.set = append(c.set, wall)
	return nil
}

// What a session tells the agent of its provider (keeps_processes, the
// clock, whether it sets one) comes from the provider's Caps, only when the
// owner exports; SetClock needs a provider that can and says so.
func TestSessionInfoTellsWhatSnapshotsKeep(t *testing.T) {
	vm := &clockProvider{capsProvider: capsProvider{provider.Caps{Snapshot: true, KeepsProcesses: true, Clock: provider.ClockContinuous, SetsClock: true}}}
	s := &Session{ID: "s1", Sandbox: &provider.Sandbox{ID: "sb1"}}
	for _, tc := range []struct {
		name string
		o    *Owner
		keep bool
		sets bool
	}{
		{"exported, a provider that keeps processes and sets clocks", &Owner{cfg: Config{Provider: vm}, mode: ModeExported}, true, true},
		{"restart_only", &Owner{cfg: Config{Provider: vm}, mode: ModeRestartOnly}, false, false},
		{"files only", &Owner{cfg: Config{Provider: capsProvider{provider.Caps{Snapshot: true}}}, mode: ModeExported}, false, false},
		{"keeps processes, no ClockSetter", &Owner{cfg: Config{Provider: capsProvider{vm.caps}}, mode: ModeExported}, true, false},
	} {
		in := tc.o.info(s, true)
		if in.KeepsProcesses != tc.keep || in.SetsClock != tc.sets || (tc.keep && in.Clock != provider.ClockContinuous) {
			t.Errorf("%s: info %+v, want keeps_processes %v, sets_clock %v", tc.name, in, tc.keep, tc.sets)
		}
	}
	o := &Owner{cfg: Config{Provider: capsProvider{vm.caps}}, mode: ModeExported}
	if _, err := o.SetClock(context.Background(), "s1", time.Time{}); !errors.Is(err, ErrNoClock) {
		t.Errorf("SetClock without a ClockSetter: %v, want ErrNoClock", err)
	}
}
