package jetstream

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
)

// StoreRequestSubject returns the subject on which member m of run asks
// for its own records store (events.RecordsBucket) to be made,
// spsvc.<run>.stores.<kind>.<name>: the run's bridge answers it
// (ServeStores). A member's user may publish its own alone, so a member
// gets its own store and no other, and makes no stream itself: the store's
// configuration, subjects included, is the bridge's.
func StoreRequestSubject(run string, m events.Member) string {
	return events.ServicePrefix + "." + run + ".stores." + string(m.Kind()) + "." + m.Name()
}

// storeRequestFilter is the subject ServeStores answers.
func storeRequestFilter(run string) string {
	return events.ServicePrefix + "." + run + ".stores.*.*"
}

// storeReply is the answer to a store request: empty, or why not.
type storeReply struct {
	Error string `json:"error,omitempty"`
}

// MakeRecordsStore makes member m's own records store in run,
// events.RecordsBucket, with the shared store's storage and replicas and
// its own subjects only, or opens it if it exists.
func MakeRecordsStore(ctx context.Context, js natsjs.JetStream, shared natsjs.ObjectStore, run string, m events.Member) (natsjs.ObjectStore, error) {
	bucket := events.RecordsBucket(run, m)
	if store, err := js.ObjectStore(ctx, bucket); err == nil || !errors.Is(err, natsjs.ErrBucketNotFound) {
		return store, err
	}
	st, err := shared.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("jetstream: records store %s: the shared store's status: %w", bucket, err)
	}
	cfg := natsjs.ObjectStoreConfig{Bucket: bucket, Description: fmt.Sprintf("records of %s in run %s", m, run),
		Replicas: st.Replicas(), Storage: natsjs.FileStorage}
	if st.Storage() == natsjs.MemoryStorage {
		cfg.Storage = natsjs.MemoryStorage
	}
	store, err := js.CreateObjectStore(ctx, cfg)
	if errors.Is(err, natsjs.ErrBucketExists) || errors.Is(err, natsjs.ErrStreamNameAlreadyInUse) {
		store, err = js.ObjectStore(ctx, bucket) // made meanwhile
	}
	if err != nil {
		return nil, fmt.Errorf("jetstream: create records store %s: %w", bucket, err)
	}
	return store, nil
}

// ServeStores answers run's store requests (StoreRequestSubject) on js's
// connection until the returned stop is called: it makes the asking
// member's own records store (MakeRecordsStore). The member is the
// subject's, which its permissions fix; only agents and owners have
// stores.
func ServeStores(ctx context.Context, js natsjs.JetStream, shared natsjs.ObjectStore, run string) (stop func(), err error) {
	nc := js.Conn()
	sub, err := nc.QueueSubscribe(storeRequestFilter(run), "stores", func(msg *nats.Msg) {
		var rep storeReply
		tok := strings.Split(msg.Subject, ".")
		m, merr := events.NewMember(events.MemberKind(tok[len(tok)-2]), tok[len(tok)-1])
		switch {
		case merr != nil:
			rep.Error = merr.Error()
		case m.Kind() != events.KindAgent && m.Kind() != events.KindOwner:
			rep.Error = fmt.Sprintf("a %s has no records store", m.Kind())
		default:
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			_, err := MakeRecordsStore(cctx, js, shared, run, m)
			cancel()
			if err != nil {
				rep.Error = err.Error()
			}
		}
		b, _ := json.Marshal(rep)
		_ = msg.Respond(b)
	})
	if err != nil {
		return nil, fmt.Errorf("jetstream: serve records store requests of run %s: %w", run, err)
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// AskRecordsStore asks run's bridge for member m's own records store
// (StoreRequestSubject) until it answers or ctx ends: a bridge that is not
// up yet (no responders) is asked again.
func AskRecordsStore(ctx context.Context, nc *nats.Conn, run string, m events.Member) error {
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		msg, err := nc.RequestWithContext(rctx, StoreRequestSubject(run, m), nil)
		cancel()
		if err == nil {
			var rep storeReply
			if jerr := json.Unmarshal(msg.Data, &rep); jerr != nil {
				return fmt.Errorf("jetstream: records store of %s: the bridge's answer: %w", m, jerr)
			}
			if rep.Error != "" {
				return fmt.Errorf("jetstream: records store of %s: the bridge: %s", m, rep.Error)
			}
			return nil
		}
		if !errors.Is(err, nats.ErrNoResponders) || ctx.Err() != nil {
			return fmt.Errorf("jetstream: records store of %s: ask the bridge: %w", m, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("jetstream: records store of %s: no bridge answered: %w", m, ctx.Err())
		case <-time.After(wait):
		}
	}
}
