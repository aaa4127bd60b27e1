package agent

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/jetstream/jstest"
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
