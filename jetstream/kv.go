package jetstream

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/live"
)

// kvReadBatch is how many messages one request of KVEntries asks for.
const kvReadBatch = 1024

// KVValues reads the current values of a bucket's keys under filter in one
// pass rather than one request per key, keyed by key; deleted, purged and
// expired keys are left out (KVEntries, without the times).
func KVValues(ctx context.Context, js natsjs.JetStream, kv natsjs.KeyValue, filter string) (map[string][]byte, error) {
	entries, err := KVEntries(ctx, js, kv, filter)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]byte, len(entries))
	for k, e := range entries {
		out[k] = e.Value
	}
	return out, nil
}

// KVEntry is a key's current value as KVEntries reads it.
type KVEntry struct {
	// Value is the key's value.
	Value []byte
	// Stored is when the server stored it: a heartbeat's expiry is judged from it
	// (HeartbeatExpired), since a heartbeats bucket leaves no marker when a key expires.
	Stored time.Time
}

// KVEntries reads the current values of a bucket's keys under filter in one
// pass rather than one request per key, keyed by key, each with the time the
// server stored it; deleted, purged and expired keys are left out (a key the
// server has not yet removed at its max age is in: HeartbeatExpired tells).
//
// It reads the bucket's stream through a consumer of the last message of
// each key and stops once that consumer has nothing pending, not at a KV
// watcher's initial-values marker: the watcher counts the messages it
// received against the count at its start, so a key written again while it
// reads (its older message gone) lets another key's newer message stand in
// for it, and the marker comes before that key's value: under heartbeats a
// read of the members would leave live members out (TestKVValuesWhileKeysAreWritten).
// Its consumer is deleted when it returns, and no goroutine outlives it.
func KVEntries(ctx context.Context, js natsjs.JetStream, kv natsjs.KeyValue, filter string) (map[string]KVEntry, error) {
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
	out := map[string]KVEntry{}
	if info.NumPending == 0 {
		return out, nil
	}
	for {
		batch, drained, err := fetchSome(ctx, bucket, cons)
		if err != nil {
			return nil, err
		}
		if drained {
			return out, nil
		}
		done := false
		for _, msg := range batch {
			md, err := msg.Metadata()
			if err != nil {
				return nil, fmt.Errorf("jetstream: read %s: %w", bucket, err)
			}
			key := strings.TrimPrefix(msg.Subject(), prefix)
			if KVRemoved(msg.Headers()) {
				delete(out, key)
			} else {
				out[key] = KVEntry{Value: msg.Data(), Stored: md.Timestamp}
			}
			// Nothing after this one: every key's newest message is read.
			done = done || md.NumPending == 0
		}
		if done {
			return out, nil
		}
	}
}

// kvEmptyAgain is how KVEntries fetches again after a fetch that brought
// nothing though the consumer still had something pending.
var kvEmptyAgain = poll.Backoff(25*time.Millisecond, time.Second)

// fetchSome fetches the next messages of cons, or reports it drained: a
// fetch that brings nothing though something was pending when the read
// began (the messages may be gone since: a purge, an age limit) is done if
// the consumer has nothing left, else made again after a pause
// (kvEmptyAgain) rather than at once. ctx ending is returned as it is.
func fetchSome(ctx context.Context, bucket string, cons natsjs.Consumer) (batch []natsjs.Msg, drained bool, err error) {
	err = poll.Until(ctx, kvEmptyAgain, func() (bool, error) {
		if err := ctx.Err(); err != nil {
			return false, err
		}
		// On a cluster, the server of a consumer just made may not be
		// known to the one answering yet: asked again shortly.
		var err error
		batch, err = live.Retry(ctx, kvFetchAgain, func(context.Context) ([]natsjs.Msg, error) {
			return fetchNoWait(cons, kvReadBatch)
		})
		switch {
		case live.NoResponders(err) && ctx.Err() != nil:
			return false, ctx.Err()
		case err != nil && !errors.Is(err, natsjs.ErrNoMessages):
			return false, fmt.Errorf("jetstream: read %s: %w", bucket, err)
		case len(batch) > 0:
			return true, nil
		}
		ci, err := cons.Info(ctx)
		if err != nil {
			return false, fmt.Errorf("jetstream: read %s: %w", bucket, err)
		}
		drained = ci.NumPending == 0 && ci.NumAckPending == 0
		return drained, nil
	})
	return batch, drained, err
}

// kvFetchAgain is how KVEntries asks again a fetch that found no responder.
var kvFetchAgain = live.Policy{Interval: poll.Backoff(25*time.Millisecond, 200*time.Millisecond), Tries: 9}

// fetchNoWait fetches up to n messages of cons that are there now, and the
// batch's error.
func fetchNoWait(cons natsjs.Consumer, n int) ([]natsjs.Msg, error) {
	batch, err := cons.FetchNoWait(n)
	if err != nil {
		return nil, err
	}
	var msgs []natsjs.Msg
	for msg := range batch.Messages() {
		msgs = append(msgs, msg)
	}
	return msgs, batch.Error()
}

// KVRemoved reports whether a message of a KV bucket's stream marks its
// key deleted, purged or expired (a marker the server leaves when a key's
// TTL runs out, in a bucket that has them: sp_members of an earlier build
// held some, and a store upgraded from it may still), rather than putting a
// value.
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

// KVWrite writes value to key of a KV bucket, as kv.Put would when expect
// is negative, kv.Create when it is 0 (the key has no value: none yet, or
// deleted, purged or expired) and kv.Update when it is the key's current
// revision, by a publish to the key's subject alone (no stream info); it
// returns the new revision. A write whose expected revision is not the
// key's returns an error wrapping natsjs.ErrKeyExists.
func KVWrite(ctx context.Context, js natsjs.JetStream, bucket, key string, value []byte, expect int64) (uint64, error) {
	msg := nats.NewMsg("$KV." + bucket + "." + key)
	msg.Data = value
	var opts []natsjs.PublishOpt
	if expect >= 0 {
		opts = append(opts, natsjs.WithExpectLastSequencePerSubject(uint64(expect)))
	}
	ack, err := js.PublishMsg(ctx, msg, opts...)
	if expect == 0 && IsWrongLastSequence(err) {
		// Create of a key whose last message removed it: write over that.
		last, gerr := kvLast(ctx, js, bucket, key)
		if gerr == nil && last != nil && KVRemoved(last.Header) {
			return KVWrite(ctx, js, bucket, key, value, int64(last.Sequence))
		}
	}
	if IsWrongLastSequence(err) {
		return 0, fmt.Errorf("jetstream: write %s %s: %w: %w", bucket, key, natsjs.ErrKeyExists, err)
	}
	if err != nil {
		return 0, fmt.Errorf("jetstream: write %s %s: %w", bucket, key, err)
	}
	return ack.Sequence, nil
}

// kvLast returns the last message of key in bucket's stream, nil if none: a direct get whose
// subject names the key (DirectGet), which a member's user may make for its own key without
// the stream's info.
func kvLast(ctx context.Context, js natsjs.JetStream, bucket, key string) (*natsjs.RawStreamMsg, error) {
	m, err := DirectGet(ctx, js.Conn(), "KV_"+bucket, "$KV."+bucket+"."+key)
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return nil, nil
	}
	return m, err
}

// KVGet returns the value of key in a KV bucket and its revision, as kv.Get does, by a direct get
// whose subject names the key (DirectGet): no stream info, which a sandbox's own user may not
// read. A key deleted, purged or expired (KVRemoved), or never written, is natsjs.ErrKeyNotFound.
func KVGet(ctx context.Context, js natsjs.JetStream, bucket, key string) (value []byte, revision uint64, err error) {
	m, err := kvLast(ctx, js, bucket, key)
	if err != nil {
		return nil, 0, fmt.Errorf("jetstream: get %s %s: %w", bucket, key, err)
	}
	if m == nil || KVRemoved(m.Header) {
		return nil, 0, fmt.Errorf("jetstream: get %s %s: %w", bucket, key, natsjs.ErrKeyNotFound)
	}
	return m.Data, m.Sequence, nil
}

// KVDelete deletes key of a KV bucket if its revision is still revision, as kv.Delete with
// natsjs.LastRevision does, by a publish to the key's subject alone (no stream info). A key
// written since returns an error wrapping natsjs.ErrKeyExists.
func KVDelete(ctx context.Context, js natsjs.JetStream, bucket, key string, revision uint64) error {
	msg := nats.NewMsg("$KV." + bucket + "." + key)
	msg.Header.Set("KV-Operation", "DEL")
	_, err := js.PublishMsg(ctx, msg, natsjs.WithExpectLastSequencePerSubject(revision))
	if IsWrongLastSequence(err) {
		return fmt.Errorf("jetstream: delete %s %s: %w: %w", bucket, key, natsjs.ErrKeyExists, err)
	}
	if err != nil {
		return fmt.Errorf("jetstream: delete %s %s: %w", bucket, key, err)
	}
	return nil
}
