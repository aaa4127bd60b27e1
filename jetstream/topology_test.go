package jetstream_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/jetstream"
)

func TestTopologyDefaults(t *testing.T) {
	got := jetstream.Topology{}.WithDefaults()
	want := jetstream.Topology{
		Replicas:        1,
		MaxAge:          7 * 24 * time.Hour,
		Duplicates:      2 * time.Minute,
		MemberTTL:       30 * time.Second,
		SandboxTTL:      2 * time.Minute,
		ManifestHistory: 16,
	}
	if got != want {
		t.Fatalf("WithDefaults() = %+v, want %+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	kept := jetstream.Topology{Replicas: 3, Duplicates: time.Second}.WithDefaults()
	if kept.Replicas != 3 || kept.Duplicates != time.Second {
		t.Fatalf("WithDefaults overwrote set fields: %+v", kept)
	}
}

func TestTopologyValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		t      jetstream.Topology
		fields []string
	}{
		{"zero", jetstream.Topology{}, []string{"Replicas", "MaxAge", "Duplicates", "MemberTTL", "SandboxTTL", "ManifestHistory"}},
		{"too many replicas", jetstream.Topology{Replicas: 6}.WithDefaults(), []string{"Replicas 6"}},
		{"window over max age", jetstream.Topology{MaxAge: time.Minute, Duplicates: time.Hour}.WithDefaults(), []string{"Duplicates 1h0m0s"}},
		{"history too long", jetstream.Topology{ManifestHistory: 65}.WithDefaults(), []string{"ManifestHistory 65"}},
		{"negative ttl", jetstream.Topology{MemberTTL: -time.Second}.WithDefaults(), []string{"MemberTTL -1s"}},
		{"sub-second sandbox ttl", jetstream.Topology{SandboxTTL: time.Millisecond}.WithDefaults(), []string{"SandboxTTL 1ms"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.t.Validate()
			if !errors.Is(err, jetstream.ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
			}
			for _, f := range tc.fields {
				if !strings.Contains(err.Error(), "Topology."+f) {
					t.Errorf("Validate() = %q, does not name Topology.%s", err, f)
				}
			}
		})
	}
}
