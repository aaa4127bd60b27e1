package events

import (
	"errors"
	"testing"
)

// TestManifestBucket: a member manifest names no store (the shared sp_records) or its member's
// own, RecordsBucket of its run and member, and no other.
func TestManifestBucket(t *testing.T) {
	m := MemberManifest{Schema: ManifestSchema, Run: "run1", CheckpointID: "ckpt-7", Member: "agent.a0",
		Object: "run1/ckpt-7/agent.a0.e3b0c44298fc1c14.jsonl", SHA256: "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
		Count: 2, Size: 120}
	if got, want := RecordsBucket("run1", "agent.a0"), "sp_records_run1_agent_a0"; got != want {
		t.Errorf("RecordsBucket: %q, want %q", got, want)
	}
	for _, bucket := range []string{"", "sp_records_run1_agent_a0"} {
		m.Bucket = bucket
		if err := m.Validate(); err != nil {
			t.Errorf("bucket %q: %v", bucket, err)
		}
	}
	for _, bucket := range []string{"sp_records", "sp_records_run1_agent_a1", "sp_records_run2_agent_a0"} {
		m.Bucket = bucket
		if err := m.Validate(); !errors.Is(err, ErrMismatch) {
			t.Errorf("bucket %q: %v, want ErrMismatch", bucket, err)
		}
	}
}

// TestTrajectoriesBucket: an agent's own trajectories store is named by its run and name, under
// its run's prefix, apart from every records store.
func TestTrajectoriesBucket(t *testing.T) {
	if got, want := TrajectoriesBucket("run1", "agent.a0"), "sp_trajectories_run1_agent_a0"; got != want {
		t.Errorf("TrajectoriesBucket: %q, want %q", got, want)
	}
	if got, want := TrajectoriesBucketPrefix("run1"), "sp_trajectories_run1_"; got != want {
		t.Errorf("TrajectoriesBucketPrefix: %q, want %q", got, want)
	}
}
