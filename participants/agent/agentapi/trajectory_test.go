package agentapi_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
)

// A trajectory its store does not have yet (a replica behind, on a
// cluster) is asked for again, and read once it is there; one whose bytes
// are not those its result names is refused at once.
func TestReadAsksAgainForATrajectoryNotThereYet(t *testing.T) {
	env := jstest.Start(t)
	data := []byte(`{"call":1}` + "\n")
	sum := sha256.Sum256(data)
	ref := &agentapi.TrajectoryRef{Object: "run/r1.jsonl", SHA256: hex.EncodeToString(sum[:]), Bytes: int64(len(data))}
	type read struct {
		data []byte
		err  error
	}
	got := make(chan read, 1)
	go func() {
		b, err := ref.Read(t.Context(), env.Bus)
		got <- read{b, err}
	}()
	// The reader has found nothing: the object comes after its first
	// read.
	select {
	case r := <-got:
		t.Fatalf("Read returned before the object was stored: %q, %v", r.data, r.err)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := env.Bus.Trajectories.PutBytes(t.Context(), ref.Object, data); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-got:
		if r.err != nil || !bytes.Equal(r.data, data) {
			t.Fatalf("Read: %q, %v; want the stored bytes", r.data, r.err)
		}
	case <-time.After(agentapi.NotFoundFor):
		t.Fatal("Read did not find the object stored after it began")
	}

	// Other bytes than the result names: refused, not asked again.
	other := *ref
	other.Bytes++
	if _, err := other.Read(t.Context(), env.Bus); !errors.Is(err, agentapi.ErrNotItsTrajectory) {
		t.Fatalf("Read of other bytes: %v, want ErrNotItsTrajectory", err)
	}
	// A context that ends stops the asking.
	missing := *ref
	missing.Object = "run/none.jsonl"
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	if _, err := missing.Read(ctx, env.Bus); !errors.Is(err, natsjs.ErrObjectNotFound) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Read of a missing object under a 500 ms context: %v, want not found and the deadline", err)
	}
}
