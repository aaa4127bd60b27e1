package jetstream

import (
	"context"
	"errors"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
)

// StopWatch stops a KV watcher and drains its updates until nats.go closes
// them (for at most stopWatchDrain). Stop alone unsubscribes, but an update
// that arrived before it and finds the watcher's channel full (256 updates
// of a busy bucket, sp_members' heartbeats at 1,000 members) blocks its
// sender in a send nobody receives, for good: a goroutine, and the
// watcher's buffer, leaked at every watch stopped early.
func StopWatch(w natsjs.KeyWatcher) error {
	if w == nil {
		return nil
	}
	err := w.Stop()
	t := time.NewTimer(stopWatchDrain)
	defer t.Stop()
	for {
		select {
		case _, ok := <-w.Updates():
			if !ok {
				return err
			}
		case <-t.C:
			return err
		}
	}
}

// stopWatchDrain bounds StopWatch's drain: the subscription's goroutine
// closes the updates as soon as the send it was blocked in completes.
const stopWatchDrain = 5 * time.Second

// KVValues reads the current values of a bucket's keys under filter in one
// pass (a watcher's initial values) rather than one request per key, keyed
// by key; deleted keys are left out.
func KVValues(ctx context.Context, kv natsjs.KeyValue, filter string) (map[string][]byte, error) {
	w, err := kv.Watch(ctx, filter, natsjs.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = StopWatch(w) }()
	out := map[string][]byte{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("jetstream: watcher closed")
			}
			if e == nil {
				return out, nil
			}
			out[e.Key()] = e.Value()
		}
	}
}
