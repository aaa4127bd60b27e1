package inspect_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/inspect"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

func TestMain(m *testing.M) { leak.VerifyTestMain(m, jstest.LeakOptions()...) }

const run = "run1"

// A real run: a bridge and a fleet take checkpoint c1. Inspect finds it
// verified, LATEST and HEAD, the live members with the instances their
// heartbeats carry, and the run's snapshots in the owner's index; the
// outcome on the stream names the same exports. Then a records object
// goes missing and the checkpoint no longer verifies.
func TestInspectARun(t *testing.T) {
	env := jstest.Start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	hs := membertest.StartMembers(t, env, run, 2, membertest.Options{Episodes: 2})
	nc, js := env.Connect(t)
	b, err := bridge.New(bridge.Config{Run: run, JS: js, Conn: nc, Bus: env.Bus, PhaseTimeout: 10 * time.Second,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)})
	if err != nil {
		t.Fatal(err)
	}
	bctx, stop := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- b.Run(bctx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("bridge Run: %v", err)
		}
	}()
	res, err := b.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: "c1"})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("checkpoint c1: %+v %v", res, err)
	}
	// The owner's index: one snapshot of this run named by c1 and by c0
	// (not kept), one of another run.
	for k, v := range map[string]string{
		"c1-s1":    `{"run":"run1","snapshot":"c1-s1","checkpoints":["c0","c1"]}`,
		"other-s1": `{"run":"other","snapshot":"other-s1","checkpoints":["c1"]}`,
	} {
		if _, err := env.Bus.Snapshots.Put(ctx, k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}

	r, err := inspect.Run(ctx, js, run)
	if err != nil {
		t.Fatal(err)
	}
	if r.Latest == nil || r.Latest.CheckpointID != "c1" || r.Head == nil || r.Head.Seq < 3 {
		t.Fatalf("latest %+v head %+v", r.Latest, r.Head)
	}
	if len(r.Checkpoints) != 1 || r.Checkpoints[0].ID != "c1" || !r.Checkpoints[0].Verified || len(r.Checkpoints[0].Members) != 2 ||
		r.Checkpoints[0].Continued != 4 || len(r.Problems) != 0 {
		t.Fatalf("checkpoints %+v problems %q", r.Checkpoints, r.Problems)
	}
	if len(r.Snapshots) != 1 || r.Snapshots[0].ID != "c1-s1" || strings.Join(r.Snapshots[0].Unkept, ",") != "c0" {
		t.Fatalf("snapshots %+v", r.Snapshots)
	}
	instances := map[events.Member]string{}
	for _, h := range hs {
		info := membertest.WaitRegistered(t, env, run, h.Name, h.Done())
		instances[h.Name] = info.Instance
	}
	if len(r.Members) != 2 {
		t.Fatalf("members %+v", r.Members)
	}
	for _, m := range r.Members {
		if m.Instance == "" || m.Instance != instances[m.Member] || !m.Served || m.Epoch != 0 {
			t.Fatalf("member %+v, heartbeat instance %q", m, instances[m.Member])
		}
	}

	// The outcome carries what the manifest held, and the instances.
	raw, err := env.Bus.Stream.GetLastMsgForSubject(ctx, events.OutcomeSubject(run, events.TypeCheckpointCommitted))
	if err != nil {
		t.Fatal(err)
	}
	out := decodeCommitted(t, raw.Header, raw.Data)
	if len(out.Exports) != 2 || out.ExportsCut != 0 || out.CommitSeq == 0 || out.PrepareSeq == 0 || out.Created.IsZero() {
		t.Fatalf("outcome %+v", out)
	}
	for i, e := range out.Exports {
		c := r.Checkpoints[0].Members[i]
		if e.Member != c.Member || e.Object != c.Object || e.Size != c.Size || e.SHA256 != c.SHA256 || e.Kind != events.KindAgent ||
			e.Instance != instances[e.Member] {
			t.Fatalf("export %+v, manifest %+v, instance %q", e, c, instances[e.Member])
		}
	}

	// A records object gone: the checkpoint does not verify.
	gone := r.Checkpoints[0].Members[1]
	if err := env.Bus.Records.Delete(ctx, gone.Object); err != nil {
		t.Fatal(err)
	}
	r, err = inspect.Run(ctx, js, run)
	if err != nil {
		t.Fatal(err)
	}
	if c := r.Checkpoints[0]; c.Verified || c.Members[0].Problem != "" || c.Members[1].OK || len(r.Problems) != 1 ||
		!strings.Contains(r.Problems[0], string(gone.Member)) {
		t.Fatalf("after deleting %s: %+v problems %q", gone.Object, c, r.Problems)
	}
	var text strings.Builder
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"LATEST c1", "HEAD seq", "c1 epoch 0", "NOT VERIFIED", "c1-s1 named by c0,c1 (not kept: c0)",
		string(hs[0].Name), instances[hs[0].Name]} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, text.String())
		}
	}
}

func TestInspectRefusesABadRunAndAMissingBucket(t *testing.T) {
	env := jstest.Start(t)
	_, js := env.Connect(t)
	if _, err := inspect.Run(t.Context(), js, "no such run"); !errors.Is(err, inspect.ErrBadRun) {
		t.Fatalf("bad run: %v", err)
	}
	if err := js.DeleteKeyValue(t.Context(), jetstream.BucketSnapshots); err != nil {
		t.Fatal(err)
	}
	_, err := inspect.Run(t.Context(), js, run)
	if !errors.Is(err, inspect.ErrNoBucket) || !strings.Contains(err.Error(), jetstream.BucketSnapshots) {
		t.Fatalf("missing bucket: %v", err)
	}
}

func decodeCommitted(t *testing.T, h nats.Header, data []byte) events.CheckpointCommitted {
	t.Helper()
	_, d, err := events.Unmarshal(&nats.Msg{Header: h, Data: data})
	if err != nil {
		t.Fatal(err)
	}
	out, ok := d.(events.CheckpointCommitted)
	if !ok {
		t.Fatalf("outcome is %T", d)
	}
	return out
}

// A member with credentials of its own keeps its records in a store of its
// own name, which its manifest names: inspect verifies the object there.
// The records are written as such a member writes them, in the store the
// bridge makes for it (jetstream.MakeRecordsStore, member.WriteRecords) and the manifests created as a schema-1 run's
// member and bridge created them: old runs stay readable (PROTOCOL-HISTORY §35).
func TestInspectVerifiesAMembersOwnStore(t *testing.T) {
	env := jstest.Start(t)
	_, js := env.Connect(t)
	ctx := t.Context()
	const m = events.Member("agent.a0")
	store, err := jetstream.MakeRecordsStore(ctx, js, env.Bus.Records, run, m)
	if err != nil {
		t.Fatal(err)
	}
	mm, err := member.WriteRecords(ctx, store, run, "c1", m, []events.Record{{Key: "r1", Data: json.RawMessage(`{"turn":3}`)}})
	if err != nil {
		t.Fatal(err)
	}
	mm.Bucket = events.RecordsBucket(run, m)
	raw, _ := json.Marshal(mm)
	if _, err := env.Bus.Manifests.Create(ctx, events.MemberManifestKey(run, "c1", m), raw); err != nil {
		t.Fatal(err)
	}
	man := events.CheckpointManifest{Schema: events.CheckpointSchemaInline, Run: run, CheckpointID: "c1", Created: time.Now().UTC(),
		Continued: []string{"r1"}, Members: []events.MemberManifest{mm}}
	raw, _ = json.Marshal(man)
	if _, err := env.Bus.Manifests.Create(ctx, events.ManifestKey(run, "c1"), raw); err != nil {
		t.Fatal(err)
	}
	r, err := inspect.Run(ctx, js, run)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Checkpoints) != 1 || !r.Checkpoints[0].Verified || r.Checkpoints[0].Members[0].Bucket != mm.Bucket || len(r.Problems) != 0 {
		t.Fatalf("checkpoints %+v problems %q", r.Checkpoints, r.Problems)
	}
	if err := store.Delete(ctx, mm.Object); err != nil {
		t.Fatal(err)
	}
	if r, err = inspect.Run(ctx, js, run); err != nil || r.Checkpoints[0].Verified {
		t.Fatalf("after deleting the object from %s: %+v %v", mm.Bucket, r, err)
	}
}

// A schema-2 checkpoint names its member list by digest: inspect reads it
// from sp_checkpoints and verifies every member's records; a list whose
// bytes are not the ones named is a problem naming its digest, and the
// checkpoint is not verified.
func TestInspectVerifiesTheMemberList(t *testing.T) {
	env := jstest.Start(t)
	_, js := env.Connect(t)
	ctx := t.Context()
	const m = events.Member("agent.a0")
	mm, err := member.WriteRecords(ctx, env.Bus.Records, run, "c1", m, []events.Record{{Key: "r1", Data: json.RawMessage(`{"turn":3}`)}})
	if err != nil {
		t.Fatal(err)
	}
	data, ref, err := events.EncodeMemberList(run, "c1", nil, []events.MemberManifest{mm})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Bus.Checkpoints.PutBytes(ctx, ref.Object, data); err != nil {
		t.Fatal(err)
	}
	man := events.CheckpointManifest{Schema: events.CheckpointSchema, Run: run, CheckpointID: "c1", Created: time.Now().UTC(),
		Continued: []string{"r1"}, MemberList: &ref}
	raw, _ := json.Marshal(man)
	if _, err := env.Bus.Manifests.Create(ctx, events.ManifestKey(run, "c1"), raw); err != nil {
		t.Fatal(err)
	}
	r, err := inspect.Run(ctx, js, run)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Checkpoints) != 1 || !r.Checkpoints[0].Verified || len(r.Checkpoints[0].Members) != 1 || r.Checkpoints[0].MemberList != ref.Object ||
		r.Checkpoints[0].Schema != 2 || len(r.Problems) != 0 {
		t.Fatalf("checkpoints %+v problems %q", r.Checkpoints, r.Problems)
	}
	if _, err := env.Bus.Checkpoints.PutBytes(ctx, ref.Object, append(data, ' ')); err != nil {
		t.Fatal(err)
	}
	if r, err = inspect.Run(ctx, js, run); err != nil || r.Checkpoints[0].Verified || len(r.Problems) != 1 ||
		!strings.Contains(r.Problems[0], "sha256") || !strings.Contains(r.Problems[0], ref.Object) {
		t.Fatalf("after tampering with the member list: %+v %v", r, err)
	}
}

// A heartbeat is live for its bucket's TTL after the server stored it,
// however long the server keeps it: in a members bucket upgraded from an
// earlier build's, which keeps allowing a put's own TTL, an agent's put of
// its own key with "Nats-TTL: never" stays stored past the bucket's max
// age, and inspect, as the bridge, takes it for gone once a TTL has passed.
func TestInspectJudgesAHeartbeatByItsStoreTime(t *testing.T) {
	env := jstest.Start(t, jstest.WithoutProvision())
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, js := env.Connect(t)
	if _, err := js.CreateKeyValue(ctx, natsjs.KeyValueConfig{Bucket: jetstream.BucketMembers, History: 1,
		TTL: time.Second, LimitMarkerTTL: time.Second, Storage: natsjs.FileStorage}); err != nil {
		t.Fatal(err)
	}
	bus, err := jetstream.Provision(ctx, js, jetstream.Topology{MemberTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	v, _ := json.Marshal(events.MemberInfo{Run: run, Member: "agent.a", Instance: "i0", Started: time.Now().UTC(), Heartbeat: time.Now().UTC()})
	msg := &nats.Msg{Subject: "$KV.sp_members." + events.MemberKey(run, "agent.a"), Header: nats.Header{"Nats-TTL": []string{"never"}}, Data: v}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	r, err := inspect.Run(ctx, js, run)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Members) != 1 {
		t.Fatalf("members %+v at first, want agent.a", r.Members)
	}
	poll.Wait(t, 10*time.Second, "the heartbeat to be taken for gone", func() bool {
		r, err := inspect.Run(ctx, js, run)
		if err != nil {
			t.Fatal(err)
		}
		return len(r.Members) == 0
	})
	if _, err := bus.Members.Get(ctx, events.MemberKey(run, "agent.a")); err != nil {
		t.Errorf("the heartbeat is no longer stored (%v): the test tells nothing", err)
	}
}
