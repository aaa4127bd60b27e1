package jetstream_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// TestKVValuesWhileKeysAreWritten reads a bucket of 2,000 keys while every
// key is written again and again, as heartbeats are: each read must hold
// every key. The KV watcher's initial-values marker counts messages, not
// keys, so a key rewritten during the read (its older message gone) let
// another key's newer message stand in for it, and the marker came before
// its value: the bridge then left live members out of a checkpoint.
func TestKVValuesWhileKeysAreWritten(t *testing.T) {
	env := jstest.Start(t)
	ctx := testContext(t)
	const keys = 2000
	// A bucket of nats.go's KV create, whose keys may be purged (sp_manifests' are): the
	// heartbeats' buckets take no purge.
	kv, err := env.JS.CreateKeyValue(ctx, natsjs.KeyValueConfig{Bucket: "kv_read", History: 1})
	if err != nil {
		t.Fatal(err)
	}
	key := func(i int) string { return fmt.Sprintf("run.sandbox.m%04d", i) }
	for i := range keys {
		if _, err := kv.Put(ctx, key(i), []byte("v0")); err != nil {
			t.Fatal(err)
		}
	}
	// One deleted key and one purged: a read leaves both out.
	for _, k := range []string{"run.sandbox.gone", "run.sandbox.purged"} {
		if _, err := kv.Put(ctx, k, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := kv.Delete(ctx, "run.sandbox.gone"); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, "run.sandbox.purged"); err != nil {
		t.Fatal(err)
	}

	wctx, stop := context.WithCancel(ctx)
	var writers sync.WaitGroup
	for w := range 4 {
		writers.Go(func() {
			for n := 1; wctx.Err() == nil; n++ {
				for i := w; i < keys && wctx.Err() == nil; i += 4 {
					_, _ = kv.Put(wctx, key(i), []byte(fmt.Sprintf("v%d", n)))
				}
			}
		})
	}
	defer func() {
		stop()
		writers.Wait()
	}()

	for read := range 20 {
		vals, err := jetstream.KVValues(ctx, env.JS, kv, "run.>")
		if err != nil {
			t.Fatalf("read %d: %v", read, err)
		}
		var missing []string
		for i := range keys {
			if _, ok := vals[key(i)]; !ok {
				missing = append(missing, key(i))
			}
		}
		if len(missing) > 0 {
			t.Fatalf("read %d: %d of %d keys missing while they were written, first %v", read, len(missing), keys, missing[:min(5, len(missing))])
		}
		for _, k := range []string{"run.sandbox.gone", "run.sandbox.purged"} {
			if _, ok := vals[k]; ok {
				t.Fatalf("read %d: %s was removed, but the read holds it", read, k)
			}
		}
		if len(vals) != keys {
			t.Fatalf("read %d: %d keys, want %d", read, len(vals), keys)
		}
	}
}

// TestKVValuesOfAnEmptyFilter reads nothing, at once.
func TestKVValuesOfAnEmptyFilter(t *testing.T) {
	env := jstest.Start(t)
	ctx := testContext(t)
	vals, err := jetstream.KVValues(ctx, env.JS, env.Bus.Members, "nobody.>")
	if err != nil {
		t.Fatal(err)
	}
	if len(vals) != 0 {
		t.Fatalf("read %v from an empty filter", vals)
	}
}

// TestKVValuesOnACluster reads a replicated bucket just after writing it,
// many times: the read's consumer, just made, may sit on another node than
// the one answering its first request.
func TestKVValuesOnACluster(t *testing.T) {
	env := jstest.StartCluster(t)
	ctx := testContext(t)
	kv := env.Bus.Members
	for i := range 300 {
		if _, err := kv.Put(ctx, fmt.Sprintf("run.sandbox.m%03d", i), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	for read := range 20 {
		vals, err := jetstream.KVValues(ctx, env.JS, kv, "run.>")
		if err != nil {
			t.Fatalf("read %d: %v", read, err)
		}
		if len(vals) != 300 {
			t.Fatalf("read %d: %d keys, want 300", read, len(vals))
		}
	}
}
