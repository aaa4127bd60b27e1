package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
)

// kvReadBatch is how many messages one request of KVValues asks for.
const kvReadBatch = 1024

// KVValues reads the current values of a bucket's keys under filter in one
// pass rather than one request per key, keyed by key; deleted, purged and
// expired keys are left out.
//
// It reads the bucket's stream through a consumer of the last message of
// each key and stops once that consumer has nothing pending, not at a KV
// watcher's initial-values marker: the watcher counts the messages it
// received against the count at its start, so a key written again while it
// reads (its older message gone) lets another key's newer message stand in
// for it, and the marker comes before that key's value. Under heartbeats a
// read of the members then left live members out (TestKVValuesWhileKeysAreWritten).
// Its consumer is deleted when it returns, and no goroutine outlives it.
func KVValues(ctx context.Context, js natsjs.JetStream, kv natsjs.KeyValue, filter string) (map[string][]byte, error) {
	bucket := kv.Bucket()
	stream, prefix := "KV_"+bucket, "$KV."+bucket+"."
	cons, err := js.CreateConsumer(ctx, stream, natsjs.ConsumerConfig{
		FilterSubject: prefix + filter,
		DeliverPolicy: natsjs.DeliverLastPerSubjectPolicy,
		AckPolicy:     natsjs.AckNonePolicy,
		// The server drops it by itself if the delete below is lost.
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
		Replicas:          1,
	})
	if err != nil {
		return nil, fmt.Errorf("jetstream: read %s: %w", bucket, err)
	}
	info := cons.CachedInfo()
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = js.DeleteConsumer(dctx, stream, info.Name)
	}()
	out := map[string][]byte{}
	if info.NumPending == 0 {
		return out, nil
	}
	noResponders := 0
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		batch, err := cons.FetchNoWait(kvReadBatch)
		if err != nil {
			return nil, fmt.Errorf("jetstream: read %s: %w", bucket, err)
		}
		done, got := false, 0
		for msg := range batch.Messages() {
			got++
			md, err := msg.Metadata()
			if err != nil {
				return nil, fmt.Errorf("jetstream: read %s: %w", bucket, err)
			}
			key := strings.TrimPrefix(msg.Subject(), prefix)
			if KVRemoved(msg.Headers()) {
				delete(out, key)
			} else {
				out[key] = msg.Data()
			}
			// Nothing after this one: every key's newest message is read.
			done = done || md.NumPending == 0
		}
		err = batch.Error()
		if got == 0 && errors.Is(err, nats.ErrNoResponders) && noResponders < 8 {
			// On a cluster, the server of a consumer just made may not be
			// known to the one answering yet: ask again shortly.
			noResponders++
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Duration(noResponders) * 25 * time.Millisecond):
			}
			continue
		}
		if err != nil && !errors.Is(err, natsjs.ErrNoMessages) {
			return nil, fmt.Errorf("jetstream: read %s: %w", bucket, err)
		}
		if done {
			return out, nil
		}
	}
}

// KVRemoved reports whether a message of a KV bucket's stream marks its
// key deleted, purged or expired (a marker the server leaves when a key's
// TTL runs out), rather than putting a value.
func KVRemoved(h map[string][]string) bool {
	if len(h) == 0 {
		return false
	}
	if op := first(h, "KV-Operation"); op == "DEL" || op == "PURGE" {
		return true
	}
	return first(h, natsjs.MarkerReasonHeader) != ""
}

func first(h map[string][]string, name string) string {
	if v := h[name]; len(v) > 0 {
		return v[0]
	}
	return ""
}
