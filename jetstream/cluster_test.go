package jetstream_test

import (
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// TestCluster runs the bus on a 3-node cluster: provisioning with 3 replicas, and the once-only
// ack on a replicated stream (where, unlike on one server, a repeat inside the duplicate window is
// answered with a duplicate ack before the expected sequence is checked).
func TestCluster(t *testing.T) {
	env := jstest.StartCluster(t, jstest.WithTopology(jetstream.Topology{Duplicates: time.Second}))
	if env.Server != nil || env.Cluster == nil {
		t.Fatalf("StartCluster env: Server %v, Cluster %v", env.Server, env.Cluster)
	}

	t.Run("replicas", func(t *testing.T) {
		ctx := testContext(t)
		if _, err := jetstream.Provision(ctx, env.JS, env.Topology); err != nil {
			t.Fatalf("second Provision on the cluster: %v", err)
		}
		for name, info := range streamInfos(ctx, t, env.JS) {
			if info.Config.Replicas != 3 {
				t.Errorf("stream %s: %d replicas, want 3", name, info.Config.Replicas)
			}
			if info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
				t.Errorf("stream %s: cluster info %+v, want a leader and 2 replicas", name, info.Cluster)
			}
		}
	})

	t.Run("once-only ack", func(t *testing.T) {
		checkPublishOnce(testContext(t), t, env)
	})
}
