package jetstream_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// backingStreams are the streams behind every object of the bus.
var backingStreams = []string{
	jetstream.StreamName,
	"KV_" + jetstream.BucketMembers,
	"KV_" + jetstream.BucketDaemons,
	"KV_" + jetstream.BucketManifests,
	"KV_" + jetstream.BucketSnapshots,
	"OBJ_" + jetstream.BucketRecords,
}

// streamInfos fetches fresh info of every backing stream.
func streamInfos(ctx context.Context, t *testing.T, js natsjs.JetStream, except ...string) map[string]*natsjs.StreamInfo {
	t.Helper()
	infos := make(map[string]*natsjs.StreamInfo)
	for _, name := range backingStreams {
		if slices.Contains(except, name) {
			continue
		}
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatalf("stream %s info: %v", name, err)
		}
		infos[name] = info
	}
	return infos
}

func TestProvisionIsIdempotent(t *testing.T) {
	env := jstest.Start(t)
	ctx := testContext(t)
	before := streamInfos(ctx, t, env.JS)

	for range 2 {
		bus, err := jetstream.Provision(ctx, env.JS, env.Topology)
		if err != nil {
			t.Fatalf("second Provision: %v", err)
		}
		if bus.Stream == nil || bus.Members == nil || bus.Daemons == nil || bus.Manifests == nil || bus.Snapshots == nil || bus.Records == nil {
			t.Fatalf("Provision returned an incomplete bus: %+v", bus)
		}
	}

	after := streamInfos(ctx, t, env.JS)
	for _, name := range backingStreams {
		b, a := before[name], after[name]
		if !reflect.DeepEqual(b.Config, a.Config) {
			t.Errorf("stream %s: config changed by a second Provision:\nbefore %+v\nafter  %+v", name, b.Config, a.Config)
		}
		if !b.Created.Equal(a.Created) {
			t.Errorf("stream %s: created %s before, %s after: it was recreated", name, b.Created, a.Created)
		}
	}

	// The layout is PROTOCOL.md §3's.
	s := after[jetstream.StreamName].Config
	if !reflect.DeepEqual(s.Subjects, []string{"sp.>"}) || s.Retention != natsjs.LimitsPolicy ||
		s.Storage != natsjs.FileStorage || s.MaxAge != 7*24*time.Hour || s.Duplicates != 2*time.Minute || s.Replicas != 1 {
		t.Errorf("stream config %+v does not match the bus layout", s)
	}
	if c := after["KV_sp_manifests"].Config; c.MaxMsgsPerSubject != 16 || c.MaxAge != 0 || c.Storage != natsjs.FileStorage {
		t.Errorf("KV_sp_manifests: history %d, ttl %s, storage %s; want 16, 0s, File", c.MaxMsgsPerSubject, c.MaxAge, c.Storage)
	}
	// The heartbeats' buckets and the snapshot index let no writer roll up, purge or set a TTL:
	// one message a key, living its bucket's TTL (the index's for good).
	for name, ttl := range map[string]time.Duration{"KV_sp_members": 30 * time.Second, "KV_sp_daemons": 2 * time.Minute, "KV_sp_snapshots": 0} {
		if c := after[name].Config; c.MaxMsgsPerSubject != 1 || c.MaxAge != ttl || c.AllowRollup || !c.DenyPurge || !c.DenyDelete ||
			c.AllowMsgTTL || c.SubjectDeleteMarkerTTL != 0 || !c.AllowDirect || c.Storage != natsjs.FileStorage ||
			!reflect.DeepEqual(c.Subjects, []string{"$" + strings.Replace(name, "_", ".", 1) + ".>"}) {
			t.Errorf("%s: %+v, want history 1, max age %s, no roll-up, purge, TTL or marker", name, c, ttl)
		}
	}
	for name, max := range map[string]int32{"KV_sp_members": 64 << 10, "KV_sp_daemons": 64 << 10, "KV_sp_snapshots": -1} {
		if c := after[name].Config; c.MaxMsgSize != max {
			t.Errorf("%s: max value size %d, want %d", name, c.MaxMsgSize, max)
		}
	}
	if c := after["OBJ_sp_records"].Config; c.Storage != natsjs.FileStorage {
		t.Errorf("OBJ_sp_records: storage %s, want File", c.Storage)
	}
}

func TestProvisionConflict(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	ctx := testContext(t)

	if _, err := env.JS.CreateStream(ctx, natsjs.StreamConfig{
		Name:     jetstream.StreamName,
		Subjects: []string{"sp.>", "x.>"},
		Storage:  natsjs.MemoryStorage,
		MaxAge:   time.Hour,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := env.JS.CreateKeyValue(ctx, natsjs.KeyValueConfig{
		Bucket: jetstream.BucketManifests, History: 2, Storage: natsjs.FileStorage,
	}); err != nil {
		t.Fatal(err)
	}

	_, err := jetstream.Provision(ctx, env.JS, jetstream.Topology{})
	if !errors.Is(err, jetstream.ErrConfigConflict) {
		t.Fatalf("Provision over a conflicting stream: %v, want ErrConfigConflict", err)
	}
	t.Logf("Provision: %v", err)
	for _, want := range []string{
		`jetstream: config conflict: stream STILLPOINT: subjects ["sp.>" "x.>"], want ["sp.>"]; storage Memory, want File; max_age 1h0m0s, want 168h0m0s`,
		`jetstream: config conflict: kv bucket sp_manifests (stream KV_sp_manifests): history 2, want 16`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not contain %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "sp_members") {
		t.Errorf("error names sp_members, which does not exist and so cannot conflict:\n%v", err)
	}

	// A conflict creates nothing.
	if _, err := env.JS.KeyValue(ctx, jetstream.BucketMembers); !errors.Is(err, natsjs.ErrBucketNotFound) {
		t.Errorf("after a conflict, kv bucket sp_members: %v, want ErrBucketNotFound", err)
	}
}

func TestProvisionReplicasConflict(t *testing.T) {
	env := jstest.Start(t)
	ctx := testContext(t)
	// A single server cannot hold 3 replicas, but the comparison runs before any create.
	_, err := jetstream.Provision(ctx, env.JS, jetstream.Topology{Replicas: 3, MaxAge: time.Hour})
	if !errors.Is(err, jetstream.ErrConfigConflict) {
		t.Fatalf("Provision R3 over R1: %v, want ErrConfigConflict", err)
	}
	want := "jetstream: config conflict: stream STILLPOINT: replicas 1, want 3; max_age 168h0m0s, want 1h0m0s"
	if !strings.Contains(err.Error(), want) {
		t.Errorf("error does not contain %q:\n%v", want, err)
	}
	if !strings.Contains(err.Error(), "object store sp_records (stream OBJ_sp_records): replicas 1, want 3") {
		t.Errorf("error does not name the object store's replicas:\n%v", err)
	}
}

func TestProvisionInvalidTopology(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	_, err := jetstream.Provision(testContext(t), env.JS, jetstream.Topology{ManifestHistory: 100})
	if !errors.Is(err, jetstream.ErrInvalidConfig) || !strings.Contains(err.Error(), "Topology.ManifestHistory") {
		t.Fatalf("Provision with ManifestHistory 100: %v, want ErrInvalidConfig naming the field", err)
	}
}

func TestOpen(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	ctx := testContext(t)

	_, err := jetstream.Open(ctx, env.JS)
	if !errors.Is(err, jetstream.ErrNotProvisioned) {
		t.Fatalf("Open on an empty server: %v, want ErrNotProvisioned", err)
	}
	for _, want := range []string{
		"stream STILLPOINT", "kv bucket sp_members", "kv bucket sp_daemons", "kv bucket sp_manifests", "kv bucket sp_snapshots", "object store sp_records",
		"object store sp_checkpoints",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open error does not name %s: %v", want, err)
		}
	}

	if _, err := jetstream.Provision(ctx, env.JS, jetstream.Topology{}); err != nil {
		t.Fatal(err)
	}
	bus, err := jetstream.Open(ctx, env.JS)
	if err != nil {
		t.Fatalf("Open after Provision: %v", err)
	}
	if _, err := bus.Manifests.Create(ctx, "run1.ckpt1", []byte(`{}`)); err != nil {
		t.Fatalf("create manifest: %v", err)
	}
	if _, err := bus.Manifests.Create(ctx, "run1.ckpt1", []byte(`{}`)); !errors.Is(err, natsjs.ErrKeyExists) {
		t.Errorf("second create of a manifest: %v, want ErrKeyExists", err)
	}
	if _, err := bus.Records.PutBytes(ctx, "run1/ckpt1/agent.a.jsonl", []byte("{}\n")); err != nil {
		t.Fatalf("put records: %v", err)
	}
}

// TestProvisionRemovesThePhaseRepublish: a stream an earlier build provisioned republishes its
// phases for the sandbox daemons' core feed; the bridge publishes their live copies now (PROTOCOL
// §3), so Provision takes the republish away and keeps the messages, and a stored phase is no
// longer republished. A republish of another shape is a conflict.
func TestProvisionRemovesThePhaseRepublish(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	ctx := testContext(t)
	topo := jetstream.Topology{}.WithDefaults()
	old := natsjs.StreamConfig{Name: jetstream.StreamName, Subjects: []string{jetstream.StreamSubjects},
		Storage: natsjs.FileStorage, MaxAge: topo.MaxAge, Duplicates: topo.Duplicates, Replicas: 1, AllowDirect: true,
		RePublish: &natsjs.RePublish{Source: "sp.*.phase.>", Destination: "spl.{{wildcard(1)}}.phase.>"}}
	if _, err := env.JS.CreateStream(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := env.JS.Publish(ctx, "sp.r.phase.prepare", []byte("before")); err != nil {
		t.Fatal(err)
	}
	bus, err := jetstream.Provision(ctx, env.JS, jetstream.Topology{})
	if err != nil {
		t.Fatalf("Provision over a stream with the republish: %v", err)
	}
	info, err := bus.Stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rp := info.Config.RePublish; rp != nil {
		t.Fatalf("republish after Provision: %+v", rp)
	}
	if info.State.Msgs != 1 {
		t.Errorf("the stream holds %d messages after the upgrade, want its 1", info.State.Msgs)
	}
	live, err := env.Conn.SubscribeSync(events.LivePhaseFilter("r"))
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := env.JS.Publish(ctx, "sp.r.phase.commit", []byte("stored")); err != nil {
		t.Fatal(err)
	}
	if m, err := live.NextMsg(300 * time.Millisecond); err == nil {
		t.Errorf("republished %q", m.Data)
	}
	// Provision again changes nothing.
	if _, err := jetstream.Provision(ctx, env.JS, jetstream.Topology{}); err != nil {
		t.Fatalf("Provision again: %v", err)
	}
	// A republish that is not the earlier build's is not ours to remove.
	info.Config.RePublish = &natsjs.RePublish{Source: "sp.*.outcome.>", Destination: "elsewhere.>"}
	if _, err := env.JS.UpdateStream(ctx, info.Config); err != nil {
		t.Fatal(err)
	}
	if _, err := jetstream.Provision(ctx, env.JS, jetstream.Topology{}); !errors.Is(err, jetstream.ErrConfigConflict) || !strings.Contains(err.Error(), "republish") {
		t.Fatalf("Provision over a stream with another republish: %v, want a conflict naming it", err)
	}
}

// TestProvisionAddsTheDaemonsBucket: a store an earlier build made has no sp_daemons; Provision
// creates it and changes nothing else, the heartbeats in sp_members included.
func TestProvisionAddsTheDaemonsBucket(t *testing.T) {
	env := jstest.Start(t)
	ctx := testContext(t)
	if _, err := env.Bus.Members.Put(ctx, "r.agent.a1", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := env.JS.DeleteStream(ctx, "KV_"+jetstream.BucketDaemons); err != nil {
		t.Fatal(err)
	}
	before := map[string]*natsjs.StreamInfo{}
	for name, info := range streamInfos(ctx, t, env.JS, "KV_"+jetstream.BucketDaemons) {
		before[name] = info
	}
	bus, err := jetstream.Provision(ctx, env.JS, env.Topology)
	if err != nil {
		t.Fatalf("Provision over a store without sp_daemons: %v", err)
	}
	if bus.Daemons == nil {
		t.Fatal("no sp_daemons after Provision")
	}
	for name, info := range streamInfos(ctx, t, env.JS) {
		b, ok := before[name]
		if !ok {
			continue
		}
		if !reflect.DeepEqual(b.Config, info.Config) || !b.Created.Equal(info.Created) || b.State.Msgs != info.State.Msgs {
			t.Errorf("stream %s changed: config %+v -> %+v, %d -> %d messages", name, b.Config, info.Config, b.State.Msgs, info.State.Msgs)
		}
	}
	if _, err := bus.Members.Get(ctx, "r.agent.a1"); err != nil {
		t.Errorf("the agent's heartbeat after the upgrade: %v", err)
	}
}
