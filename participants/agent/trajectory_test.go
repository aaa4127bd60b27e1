package agent

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// A trajectory stored while the NATS server is down is stored once it is
// back: the fault is the bus's, never the rollout's result. The server is
// really stopped and started again on its store; the store call waits out
// the stop.
func TestTrajectoryStoredOnceTheBusIsBack(t *testing.T) {
	env := jstest.Start(t)
	store := env.Bus.Trajectories
	data := bytes.Repeat([]byte(`{"call":"c1","tokens":[1,2,3]}`+"\n"), 20000) // several chunks
	meta := natsjs.ObjectMeta{Name: TrajectoryObject("run1", "task-1")}
	env.StopServer(t)
	tries := 0
	err := putTrajectory(t.Context(), zerolog.Nop(), store, meta, data, func(try int) {
		tries = try
		if try == 1 {
			env.StartServer(t)
		}
	})
	if err != nil {
		t.Fatalf("stored across a server restart: %v", err)
	}
	if tries == 0 {
		t.Fatal("the first store call, made with the server down, did not fail: the test did not test the wait")
	}
	got, err := store.GetBytes(t.Context(), meta.Name)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, data) {
		t.Fatalf("the stored trajectory is %d bytes, want the %d written", len(got), len(data))
	}
}

// A store error that is no want of an answer (here a bad name) returns at
// once, and a store the run's end cuts short returns that end: neither
// waits for a bus that would answer the same.
func TestTrajectoryStoreErrorsReturn(t *testing.T) {
	env := jstest.Start(t)
	never := func(int) { t.Fatal("waited to store again after an error that is no want of an answer") }
	if err := putTrajectory(t.Context(), zerolog.Nop(), env.Bus.Trajectories, natsjs.ObjectMeta{}, []byte("x"), never); err == nil {
		t.Fatal("an object without a name was stored")
	}
	env.StopServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	err := putTrajectory(ctx, zerolog.Nop(), env.Bus.Trajectories, natsjs.ObjectMeta{Name: "run1/task-2.jsonl"}, []byte("x"), func(int) {})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a store cut short by its context's end returned %v, want that end", err)
	}
	env.StartServer(t)
}

// An agent with credentials of its own stores its trajectories in its own
// store, which the run's bridge makes when it first asks, and its results
// name that store; the verdict is noted there, and not in the shared store
// (which its user may not write) for a trajectory a bookmark of an earlier
// build names there. An agent without credentials of its own stores in
// the shared store, and its results name none. The env fails the test on
// any permissions violation of the agent's connection.
func TestTrajectoryStoreOfItsOwn(t *testing.T) {
	env := jstest.Start(t, jstest.WithAuthority(testRun))
	membertest.NewBridge(t, env, testRun) // serves the store requests
	ctx := t.Context()
	_, ajs := env.WithCreds(env.MemberCreds(t, testRun, "agent.a1")).Connect(t)
	abus, err := jetstream.Open(ctx, ajs)
	if err != nil {
		t.Fatal(err)
	}
	a, err := newAgent(Config{Run: testRun, Name: "a1", Owner: "o1", JS: ajs, Bus: abus, Adapter: testAdapter{}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	r := &run{key: "r1", ctx: ctx, log: testLogger(t)}
	store, bucket, err := a.trajectoryStore(r)
	if err != nil {
		t.Fatal(err)
	}
	if want := events.TrajectoriesBucket(testRun, "agent.a1"); bucket != want {
		t.Fatalf("the agent stores its trajectories in %q, want its own %q", bucket, want)
	}
	data := []byte(`{"v":3,"id":"r1.l1.1"}` + "\n")
	sum := sha256.Sum256(data)
	ref := &agentapi.TrajectoryRef{Object: TrajectoryObject(testRun, "r1"), Bucket: bucket, SHA256: hex.EncodeToString(sum[:]), Bytes: int64(len(data)), Calls: 1}
	if err := putTrajectory(ctx, zerolog.Nop(), store, natsjs.ObjectMeta{Name: ref.Object}, data, func(int) {}); err != nil {
		t.Fatal(err)
	}
	a.noteVerdict(r, agentapi.Bookmark{Rollout: "r1"}, ref, []byte(`{"reward":1}`))
	if got, err := ref.Read(ctx, env.Bus); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the trajectory in the agent's store: %q, %v", got, err)
	}
	if info, err := store.GetInfo(ctx, ref.Object); err != nil || info.Metadata["verdict"] != `{"reward":1}` {
		t.Fatalf("the verdict in the agent's store: %+v, %v", info, err)
	}
	if _, err := env.Bus.Trajectories.GetInfo(ctx, ref.Object); !errors.Is(err, natsjs.ErrObjectNotFound) {
		t.Fatalf("the trajectory in the shared store: %v, want none", err)
	}
	// A trajectory of an earlier build, in the shared store: its verdict
	// is not noted, and nothing is written there.
	if _, err := env.Bus.Trajectories.Put(ctx, natsjs.ObjectMeta{Name: TrajectoryObject(testRun, "r0")}, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	old := *ref
	old.Object, old.Bucket = TrajectoryObject(testRun, "r0"), ""
	a.noteVerdict(r, agentapi.Bookmark{Rollout: "r0"}, &old, []byte(`{"reward":0}`))
	if info, err := env.Bus.Trajectories.GetInfo(ctx, old.Object); err != nil || info.Metadata["verdict"] != "" {
		t.Fatalf("the earlier trajectory in the shared store: %+v, %v; want it as it was", info, err)
	}

	// Without credentials of its own (the env's admin connection), the
	// shared store.
	b, err := newAgent(Config{Run: testRun, Name: "a2", Owner: "o1", JS: env.JS, Bus: env.Bus, Adapter: testAdapter{}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if store, bucket, err := b.trajectoryStore(r); err != nil || bucket != "" || store != env.Bus.Trajectories {
		t.Fatalf("an agent without credentials of its own stores in %q (%v), want the shared store", bucket, err)
	}
}
