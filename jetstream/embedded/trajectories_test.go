package embedded_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"testing"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/participants/agent"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
)

// TestTrajectoriesOfTheirOwn (issue 29: no roll-ups or purges by members): an agent with its own
// user stores its trajectories in a store of its own name, which the bridge made when it asked,
// writes one again, notes its verdict and reads it back; another agent and an owner cannot
// overwrite, roll up, purge or delete anything of that store, and the agent itself cannot
// write, roll up or purge the shared sp_trajectories, whose trajectories of a run before stay
// readable; the controller and the bridge read the agent's store, and the release of records
// does not list it.
func TestTrajectoriesOfTheirOwn(t *testing.T) {
	auth, dir, s, bus := operatorServer(t)
	ctx := testContext(t)
	const a1 events.Member = "agent.a1"

	// A trajectory of a run before, in the shared store, as every agent wrote them then.
	oldData := []byte(`{"v":3,"id":"r0.l1.1"}` + "\n")
	oldRef := putRef(ctx, t, bus.Trajectories, "", "r/r0.jsonl", oldData)

	_, sjs, _ := connectCreds(t, s, embedded.CredsFile(dir, embedded.RoleBridge))
	sbus, err := jetstream.Open(ctx, sjs)
	if err != nil {
		t.Fatal(err)
	}
	stopStores, err := jetstream.ServeStores(ctx, sjs, sbus, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer stopStores()

	anc, ajs, aerrs := connectCreds(t, s, memberCreds(t, auth, a1))
	abus, err := jetstream.Open(ctx, ajs)
	if err != nil {
		t.Fatal(err)
	}
	own := events.TrajectoriesBucket("r", a1)
	// It makes no stream itself, its own trajectories store included.
	if err := anc.PublishRequest("$JS.API.STREAM.CREATE.OBJ_"+own, anc.NewRespInbox(),
		[]byte(`{"name":"OBJ_`+own+`","subjects":["spsvc.r.owner.>"]}`)); err != nil {
		t.Fatal(err)
	}
	violation(t, aerrs, "agent a1 making its trajectories store", "$JS.API.STREAM.CREATE.OBJ_"+own)
	store, err := agent.OwnTrajectories(ctx, ajs, "r", a1)
	if err != nil {
		t.Fatalf("agent a1 asking for its own trajectories store: %v", err)
	}
	// Stored, stored again (the old chunks purged), its verdict noted, read back, as an agent does.
	putRef(ctx, t, store, own, "r/r1.jsonl", []byte("a first capture\n"))
	data := bytes.Repeat([]byte(`{"v":3,"id":"r1.l1.1","tokens":[1,2,3]}`+"\n"), 4000) // several chunks
	ref := putRef(ctx, t, store, own, "r/r1.jsonl", data)
	if err := store.UpdateMeta(ctx, ref.Object, natsjs.ObjectMeta{Name: ref.Object, Metadata: map[string]string{"verdict": `{"reward":1}`}}); err != nil {
		t.Fatalf("agent a1 noting the verdict: %v", err)
	}
	if got, err := ref.Read(ctx, abus); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("agent a1 reading its trajectory back: %d bytes, %v", len(got), err)
	}
	// What runs before wrote to the shared store it still reads.
	if _, err := oldRef.Read(ctx, abus); err != nil {
		t.Errorf("agent a1 reading a trajectory of a run before: %v", err)
	}
	noViolations(t, anc, aerrs, "agent a1")

	ownStream, err := bus.JS.Stream(ctx, "OBJ_"+own)
	if err != nil {
		t.Fatal(err)
	}
	before, err := ownStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sharedStream, err := bus.JS.Stream(ctx, "OBJ_"+jetstream.BucketTrajectories)
	if err != nil {
		t.Fatal(err)
	}
	sharedBefore, err := sharedStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	meta := func(bucket, object string) string {
		return "$O." + bucket + ".M." + base64.URLEncoding.EncodeToString([]byte(object))
	}
	type try struct{ what, subject, rollup, data string }
	attempt := func(who string, nc *nats.Conn, errs chan error, tries []try) {
		t.Helper()
		for _, tc := range tries {
			msg := &nats.Msg{Subject: tc.subject, Reply: nc.NewRespInbox(), Data: []byte(tc.data), Header: nats.Header{}}
			if tc.rollup != "" {
				msg.Header.Set(natsjs.MsgRollup, tc.rollup)
			}
			if err := nc.PublishMsg(msg); err != nil {
				t.Fatal(err)
			}
			violation(t, errs, who+" "+tc.what, tc.subject)
		}
	}
	// The shared store: its object subjects are no agent's, so no agent writes there any more.
	shared := jetstream.BucketTrajectories
	sharedTries := []try{
		{"overwriting a trajectory of the shared store", meta(shared, oldRef.Object), "sub", `{"name":"r/r0.jsonl","deleted":true}`},
		{"rolling up the shared store", meta(shared, "r/x.jsonl"), "all", `{"name":"r/x.jsonl"}`},
		{"writing chunks into the shared store", "$O." + shared + ".C.forged", "", "x"},
		{"purging the shared store", "$JS.API.STREAM.PURGE.OBJ_" + shared, "", "{}"},
		{"deleting a message of the shared store", "$JS.API.STREAM.MSG.DELETE.OBJ_" + shared, "", `{"seq":1}`},
		{"deleting the shared store", "$JS.API.STREAM.DELETE.OBJ_" + shared, "", ""},
	}
	attempt("agent a1", anc, aerrs, sharedTries)
	for _, m := range []events.Member{"agent.a2", "owner.o1"} {
		nc, _, errs := connectCreds(t, s, memberCreds(t, auth, m))
		attempt(string(m), nc, errs, append([]try{
			{"overwriting another's trajectory", meta(own, ref.Object), "sub", `{"name":"r/r1.jsonl","deleted":true}`},
			{"rolling up another's trajectories store", meta(own, "r/x.jsonl"), "all", `{"name":"r/x.jsonl"}`},
			{"rolling up another's trajectories store through a chunk subject", "$O." + own + ".C.forged", "all", "x"},
			{"writing chunks into another's trajectories store", "$O." + own + ".C.forged", "", "x"},
			{"purging another's trajectories store", "$JS.API.STREAM.PURGE.OBJ_" + own, "", "{}"},
			{"deleting another's trajectories store", "$JS.API.STREAM.DELETE.OBJ_" + own, "", ""},
			{"making another's trajectories store", "$JS.API.STREAM.CREATE.OBJ_" + own, "", "{}"},
			{"deleting a message of another's trajectories store", "$JS.API.STREAM.MSG.DELETE.OBJ_" + own, "", `{"seq":1}`},
			{"deleting a reader of another's trajectories store", "$JS.API.CONSUMER.DELETE.OBJ_" + own + ".x", "", ""},
			{"asking for another's trajectories store", jetstream.StoreRequestSubject("r", a1), "", `{"store":"trajectories"}`},
		}, sharedTries...))
	}
	after, err := ownStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.State.Msgs != before.State.Msgs || after.State.LastSeq != before.State.LastSeq {
		t.Errorf("the agent's trajectories store went from %d messages (last %d) to %d (last %d)", before.State.Msgs,
			before.State.LastSeq, after.State.Msgs, after.State.LastSeq)
	}
	sharedAfter, err := sharedStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sharedAfter.State.Msgs != sharedBefore.State.Msgs || sharedAfter.State.LastSeq != sharedBefore.State.LastSeq {
		t.Errorf("the shared trajectories store went from %d messages (last %d) to %d (last %d)", sharedBefore.State.Msgs,
			sharedBefore.State.LastSeq, sharedAfter.State.Msgs, sharedAfter.State.LastSeq)
	}

	// The controller (a collector, `stillpoint trajectory`) and the bridge read both stores.
	for _, role := range []embedded.Role{embedded.RoleController, embedded.RoleBridge} {
		nc, js, errs := connectCreds(t, s, embedded.CredsFile(dir, role))
		rbus, err := jetstream.Open(ctx, js)
		if err != nil {
			t.Fatal(err)
		}
		if got, err := ref.Read(ctx, rbus); err != nil || !bytes.Equal(got, data) {
			t.Errorf("%s reading the agent's trajectory: %d bytes, %v", role, len(got), err)
		}
		if _, err := oldRef.Read(ctx, rbus); err != nil {
			t.Errorf("%s reading a trajectory of a run before: %v", role, err)
		}
		if stores, err := jetstream.TrajectoryStores(ctx, js, "r"); err != nil || len(stores) != 1 {
			t.Errorf("%s listing the run's trajectories stores: %d, %v; want the agent's", role, len(stores), err)
		}
		noViolationsBefore(t, nc, errs, string(role), "sp.r.ack.1.prepare.agent.a1")
	}
	// A release deletes records: the stores it lists are the records stores alone.
	if stores, err := jetstream.RecordStores(ctx, sjs, events.RecordsBucketPrefix("r")); err != nil || len(stores) != 0 {
		t.Errorf("the records stores a release lists: %d, %v; want none (the agent wrote no records)", len(stores), err)
	}
}

// putRef stores data as object in store and returns its ref, naming bucket.
func putRef(ctx context.Context, t *testing.T, store natsjs.ObjectStore, bucket, object string, data []byte) *agentapi.TrajectoryRef {
	t.Helper()
	if _, err := store.Put(ctx, natsjs.ObjectMeta{Name: object}, bytes.NewReader(data)); err != nil {
		t.Fatalf("storing %s: %v", object, err)
	}
	sum := sha256.Sum256(data)
	return &agentapi.TrajectoryRef{Object: object, Bucket: bucket, SHA256: hex.EncodeToString(sum[:]), Bytes: int64(len(data))}
}
