package embedded_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// TestMembersRollUpNoOtherKey: issue 29's attack 4 with an agent's and an owner's own
// credentials. sp_members allowed roll-ups (nats.go's KV create always does, and its expiry
// markers needed them), so a put of a member's own heartbeat key with "Nats-Rollup: all" purged
// every member's key of every run; an owner's put of any key of the snapshot index did the same
// to every owner's entries. Both buckets now take no roll-up or purge: every such put is refused
// by the server, as is a purge of either bucket's stream, and every other key is still there.
func TestMembersRollUpNoOtherKey(t *testing.T) {
	auth, _, s, bus := operatorServer(t)
	ctx := testContext(t)
	members := []string{"r.agent.a2", "r.owner.o2", "other.agent.a1"}
	for _, k := range members {
		if _, err := bus.Members.Put(ctx, k, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	snapshots := []string{"snap-1", "snap-2"}
	for _, k := range snapshots {
		if _, err := bus.Snapshots.Put(ctx, k, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	rollups := []nats.Header{
		{"Nats-Rollup": []string{"all"}},
		{"Nats-Rollup": []string{"sub"}},
		{"KV-Operation": []string{"PURGE"}, "Nats-Rollup": []string{"sub"}},
	}
	for _, self := range []events.Member{"agent.a1", "owner.o1"} {
		nc, js, errs := connectCreds(t, s, memberCreds(t, auth, self))
		own := "$KV." + jetstream.BucketMembers + "." + events.MemberKey("r", self)
		if _, err := js.Publish(ctx, own, []byte(`{}`)); err != nil {
			t.Fatalf("%s's heartbeat: %v", self, err)
		}
		subjects := []string{own}
		if self.Kind() == events.KindOwner {
			subjects = append(subjects, "$KV."+jetstream.BucketSnapshots+".snap-1")
		}
		for _, subject := range subjects {
			for _, h := range rollups {
				if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: []byte(`{}`)}); err == nil {
					t.Errorf("%s's put of %s with %v was stored", self, subject, h)
				} else {
					t.Logf("%s's put of %s with %v: %v", self, subject, h, err)
				}
			}
		}
		// A purge of either stream is not a member's to ask (and the server refuses it anyway:
		// jetstream's TestHeartbeatBuckets, TestSnapshotsBucket).
		for _, stream := range []string{"KV_" + jetstream.BucketMembers, "KV_" + jetstream.BucketSnapshots} {
			subject := "$JS.API.STREAM.PURGE." + stream
			if err := nc.PublishRequest(subject, nc.NewRespInbox(), []byte(`{}`)); err != nil {
				t.Fatal(err)
			}
			violation(t, errs, string(self)+" purging "+stream, subject)
		}
	}
	for kv, keys := range map[natsjs.KeyValue][]string{bus.Members: append(members, "r.agent.a1", "r.owner.o1"), bus.Snapshots: snapshots} {
		for _, k := range keys {
			if _, err := kv.Get(ctx, k); err != nil {
				t.Errorf("key %s of %s after the attempts: %v", k, kv.Bucket(), err)
			}
		}
	}
}
