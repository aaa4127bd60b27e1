package jetstream

import (
	"context"
	"errors"

	natsjs "github.com/nats-io/nats.go/jetstream"
)

// KVValues reads the current values of a bucket's keys under filter in one
// pass (a watcher's initial values) rather than one request per key, keyed
// by key; deleted keys are left out.
func KVValues(ctx context.Context, kv natsjs.KeyValue, filter string) (map[string][]byte, error) {
	w, err := kv.Watch(ctx, filter, natsjs.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
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
