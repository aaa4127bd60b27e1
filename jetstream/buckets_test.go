package jetstream_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// keyCount counts the keys of kv with a value.
func keyCount(t *testing.T, kv natsjs.KeyValue) int {
	t.Helper()
	keys, err := kv.ListKeys(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range keys.Keys() {
		n++
	}
	return n
}

// refused publishes msg and fails t if the server stores it.
func refused(t *testing.T, js natsjs.JetStream, msg *nats.Msg, what string) {
	t.Helper()
	if _, err := js.PublishMsg(t.Context(), msg); err == nil {
		t.Errorf("%s was stored", what)
	} else {
		t.Logf("%s: %v", what, err)
	}
}

// TestHeartbeatBuckets (issue 29): a member's own heartbeat key, in sp_members (an agent's or an
// owner's) or sp_daemons (a sandbox daemon's), cannot roll up or purge another key, a put's own
// TTL is refused, the bucket's stream cannot be purged, a delete reads as gone, and a key expires
// without a marker, which a watcher tells by the time the server stored it plus the bucket's TTL.
func TestHeartbeatBuckets(t *testing.T) {
	for _, tc := range []struct {
		bucket string
		keys   []string
	}{
		{jetstream.BucketMembers, []string{"r.agent.a1", "r.owner.o1", "other.agent.a1"}},
		{jetstream.BucketDaemons, []string{"r.sandbox.sb1", "r.sandbox.sb2", "other.sandbox.sb1"}},
	} {
		t.Run(tc.bucket, func(t *testing.T) {
			env := jstest.Start(t, jstest.WithTopology(jetstream.Topology{MemberTTL: time.Second, SandboxTTL: time.Second}))
			ctx := testContext(t)
			kv := env.Bus.Members
			if tc.bucket == jetstream.BucketDaemons {
				kv = env.Bus.Daemons
			}
			for _, k := range tc.keys {
				if _, err := kv.Put(ctx, k, []byte("{}")); err != nil {
					t.Fatal(err)
				}
			}
			own, other := "$KV."+tc.bucket+"."+tc.keys[0], tc.keys[1]
			for _, rollup := range []string{"all", "sub"} {
				refused(t, env.JS, &nats.Msg{Subject: own, Header: nats.Header{"Nats-Rollup": []string{rollup}}, Data: []byte("{}")},
					"a put with Nats-Rollup "+rollup)
			}
			refused(t, env.JS, &nats.Msg{Subject: own, Header: nats.Header{"Nats-TTL": []string{"never"}}, Data: []byte("{}")},
				"a put with its own TTL")
			if err := kv.Purge(ctx, other); err == nil {
				t.Error("a purge of a key was stored")
			}
			stream, err := env.JS.Stream(ctx, "KV_"+tc.bucket)
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.Purge(ctx); err == nil {
				t.Error("the bucket's stream was purged")
			}
			if n := keyCount(t, kv); n != 3 {
				t.Errorf("%d keys after the attempts, want the 3 written", n)
			}

			// A member's delete of its key (or an owner's of a stopped sandbox's) reads as gone.
			w, err := kv.Watch(ctx, "r.>", natsjs.UpdatesOnly())
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = w.Stop() }()
			if err := kv.Delete(ctx, other); err != nil {
				t.Fatal(err)
			}
			if e := <-w.Updates(); e == nil || e.Key() != other || e.Operation() != natsjs.KeyValueDelete {
				t.Errorf("the watch after a delete: %v, want the key deleted", e)
			}
			if _, err := kv.Get(ctx, other); !errors.Is(err, natsjs.ErrKeyNotFound) {
				t.Errorf("a deleted key: %v, want not found", err)
			}

			// A key expires a TTL after its last write, and says nothing.
			e, err := kv.Get(ctx, tc.keys[0])
			if err != nil {
				t.Fatal(err)
			}
			st, err := kv.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ttl := jetstream.HeartbeatTTL(st)
			if ttl != time.Second {
				t.Errorf("HeartbeatTTL %s, want the topology's 1s", ttl)
			}
			if jetstream.HeartbeatExpired(e.Created(), ttl, e.Created().Add(ttl/2)) ||
				!jetstream.HeartbeatExpired(e.Created(), ttl, e.Created().Add(ttl)) {
				t.Error("HeartbeatExpired does not tell a key's expiry by its store time plus the TTL")
			}
			poll.Wait(t, 10*time.Second, "the key to expire", func() bool {
				_, err := kv.Get(ctx, tc.keys[0])
				return errors.Is(err, natsjs.ErrKeyNotFound)
			})
			select {
			case e := <-w.Updates():
				t.Errorf("the watch heard %v of an expiry, want nothing", e)
			default:
			}
		})
	}
}

// TestSnapshotsBucket: the owners' snapshot index, which a run's owners share, takes no roll-up
// of one key over the others and no purge; what the owners do there still works: a put, a
// create, an update and a delete at a revision, a create again over a delete, and a watch that
// hears the delete.
func TestSnapshotsBucket(t *testing.T) {
	env := jstest.Start(t)
	ctx := testContext(t)
	kv := env.Bus.Snapshots
	for _, k := range []string{"snap-1", "snap-2", "snap-3"} {
		if _, err := kv.Create(ctx, k, []byte(`{"checkpoints":["c1"]}`)); err != nil {
			t.Fatal(err)
		}
	}
	for _, h := range []nats.Header{
		{"Nats-Rollup": []string{"all"}},
		{"Nats-Rollup": []string{"sub"}},
		{"KV-Operation": []string{"PURGE"}, "Nats-Rollup": []string{"sub"}},
		{"Nats-TTL": []string{"1s"}},
	} {
		refused(t, env.JS, &nats.Msg{Subject: "$KV.sp_snapshots.snap-1", Header: h, Data: []byte("{}")}, "a put with "+strings.Join(h["Nats-Rollup"], "")+strings.Join(h["Nats-TTL"], ""))
	}
	if err := kv.Purge(ctx, "snap-2"); err == nil {
		t.Error("a purge of a key was stored")
	}
	stream, err := env.JS.Stream(ctx, "KV_"+jetstream.BucketSnapshots)
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(ctx); err == nil {
		t.Error("the bucket's stream was purged")
	}
	if n := keyCount(t, kv); n != 3 {
		t.Fatalf("%d keys after the attempts, want the 3 written", n)
	}

	w, err := kv.Watch(ctx, "snap-3", natsjs.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	e, err := kv.Get(ctx, "snap-3")
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Update(ctx, "snap-3", []byte(`{"checkpoints":["c1","c2"]}`), e.Revision())
	if err != nil {
		t.Fatalf("update: %v", err)
	}
	if _, err := kv.Update(ctx, "snap-3", []byte(`{}`), e.Revision()); !errors.Is(err, natsjs.ErrKeyExists) {
		t.Errorf("an update at a stale revision: %v, want ErrKeyExists", err)
	}
	if err := kv.Delete(ctx, "snap-3", natsjs.LastRevision(rev)); err != nil {
		t.Fatalf("delete at a revision: %v", err)
	}
	if _, err := kv.Get(ctx, "snap-3"); !errors.Is(err, natsjs.ErrKeyNotFound) {
		t.Errorf("a deleted key: %v, want not found", err)
	}
	for _, want := range []natsjs.KeyValueOp{natsjs.KeyValuePut, natsjs.KeyValueDelete} {
		if e := <-w.Updates(); e == nil || e.Operation() != want {
			t.Errorf("the watch: %v, want %s", e, want)
		}
	}
	if _, err := kv.Create(ctx, "snap-3", []byte(`{}`)); err != nil {
		t.Errorf("create over a delete: %v", err)
	}
	if _, err := kv.Put(ctx, "_read.mark", nil); err != nil {
		t.Errorf("an owner's mark: %v", err)
	}
	if err := kv.Delete(ctx, "_read.mark"); err != nil {
		t.Errorf("an owner's mark deleted: %v", err)
	}
	if n := keyCount(t, kv); n != 3 {
		t.Errorf("%d keys at the end, want 3", n)
	}
}

// earlierBuckets makes sp_members and sp_snapshots as earlier builds made them, through nats.go's
// KV create (roll-ups allowed; sp_members with subject delete markers and per-message TTLs,
// naming its TTLs in its metadata when named), and writes a key to each as they did.
func earlierBuckets(t *testing.T, env *jstest.Env, members natsjs.KeyValueConfig) {
	t.Helper()
	ctx := testContext(t)
	members.Bucket, members.History, members.Storage, members.Replicas = jetstream.BucketMembers, 1, natsjs.FileStorage, 1
	members.Description = "Stillpoint members: <run>.<member> heartbeats"
	if _, err := env.JS.CreateKeyValue(ctx, members); err != nil {
		t.Fatal(err)
	}
	snaps, err := env.JS.CreateKeyValue(ctx, natsjs.KeyValueConfig{Bucket: jetstream.BucketSnapshots, History: 1,
		Description: "Stillpoint snapshot index: snapshot id -> checkpoints", Storage: natsjs.FileStorage, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	hb := &nats.Msg{Subject: "$KV.sp_members.r.agent.a1", Header: nats.Header{"Nats-TTL": []string{"30s"}}, Data: []byte("{}")}
	if _, err := env.JS.PublishMsg(ctx, hb); err != nil {
		t.Fatal(err)
	}
	if _, err := snaps.Put(ctx, "snap-1", []byte(`{"checkpoints":["c1"]}`)); err != nil {
		t.Fatal(err)
	}
}

// TestProvisionUpgradesEarlierBuckets: sp_members and sp_snapshots an earlier build made allow
// roll-ups; Provision gives them the shape of this build's in place (no roll-up, purge or marker;
// sp_members' max age the member TTL, its metadata's TTLs gone), keeping their keys and the
// per-message TTLs the server cannot take back, and a second Provision changes nothing. A member
// TTL the earlier bucket names that is not the topology's is a conflict, and then nothing is
// upgraded.
func TestProvisionUpgradesEarlierBuckets(t *testing.T) {
	for name, members := range map[string]natsjs.KeyValueConfig{
		"one TTL": {TTL: 30 * time.Second, LimitMarkerTTL: 30 * time.Second},
		"both TTLs named": {TTL: 2 * time.Minute, LimitMarkerTTL: 30 * time.Second,
			Metadata: map[string]string{"stillpoint_member_ttl": "30s", "stillpoint_sandbox_ttl": "2m0s"}},
	} {
		t.Run(name, func(t *testing.T) {
			env := jstest.Start(t, jstest.WithoutProvision())
			ctx := testContext(t)
			earlierBuckets(t, env, members)
			bus, err := jetstream.Provision(ctx, env.JS, jetstream.Topology{})
			if err != nil {
				t.Fatalf("Provision over an earlier build's buckets: %v", err)
			}
			after := streamInfos(ctx, t, env.JS)
			for name, ttl := range map[string]time.Duration{"KV_sp_members": 30 * time.Second, "KV_sp_snapshots": 0} {
				c := after[name].Config
				if c.MaxMsgsPerSubject != 1 || c.MaxAge != ttl || c.AllowRollup || !c.DenyPurge || !c.DenyDelete ||
					c.SubjectDeleteMarkerTTL != 0 || c.Metadata["stillpoint_member_ttl"] != "" || c.Metadata["stillpoint_sandbox_ttl"] != "" {
					t.Errorf("%s after the upgrade: %+v", name, c)
				}
				if after[name].State.Msgs != 1 {
					t.Errorf("%s holds %d messages after the upgrade, want its 1", name, after[name].State.Msgs)
				}
			}
			if !after["KV_sp_members"].Config.AllowMsgTTL {
				t.Error("the upgrade took the members bucket's per-message TTLs away, which the server refuses")
			}
			if _, err := bus.Members.Get(ctx, "r.agent.a1"); err != nil {
				t.Errorf("the heartbeat after the upgrade: %v", err)
			}
			if _, err := bus.Snapshots.Get(ctx, "snap-1"); err != nil {
				t.Errorf("the snapshot entry after the upgrade: %v", err)
			}
			for _, subject := range []string{"$KV.sp_members.r.agent.a1", "$KV.sp_snapshots.snap-1"} {
				refused(t, env.JS, &nats.Msg{Subject: subject, Header: nats.Header{"Nats-Rollup": []string{"all"}}, Data: []byte("{}")},
					"a roll-up of "+subject+" after the upgrade")
			}
			if _, err := jetstream.Provision(ctx, env.JS, jetstream.Topology{}); err != nil {
				t.Fatalf("Provision again: %v", err)
			}
			for name, info := range streamInfos(ctx, t, env.JS) {
				b := after[name]
				if !reflect.DeepEqual(b.Config, info.Config) || !b.Created.Equal(info.Created) {
					t.Errorf("stream %s changed by a second Provision:\nbefore %+v\nafter  %+v", name, b.Config, info.Config)
				}
			}
		})
	}
	t.Run("conflict", func(t *testing.T) {
		env := jstest.Start(t, jstest.WithoutProvision())
		ctx := testContext(t)
		earlierBuckets(t, env, natsjs.KeyValueConfig{TTL: 2 * time.Minute, LimitMarkerTTL: 10 * time.Second,
			Metadata: map[string]string{"stillpoint_member_ttl": "10s", "stillpoint_sandbox_ttl": "2m0s"}})
		_, err := jetstream.Provision(ctx, env.JS, jetstream.Topology{})
		want := "kv bucket sp_members (stream KV_sp_members): stillpoint_member_ttl 10s, want 30s"
		if !errors.Is(err, jetstream.ErrConfigConflict) || !strings.Contains(err.Error(), want) {
			t.Fatalf("Provision over a members bucket of another TTL: %v, want a conflict naming it", err)
		}
		s, err := env.JS.Stream(ctx, "KV_"+jetstream.BucketSnapshots)
		if err != nil {
			t.Fatal(err)
		}
		if !s.CachedInfo().Config.AllowRollup {
			t.Error("the snapshot index was upgraded though Provision found a conflict")
		}
	})
}
