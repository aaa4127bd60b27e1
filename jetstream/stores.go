package jetstream

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
)

// StoreRequestSubject returns the subject on which member m of run asks
// for a store of its own to be made (StoreKind: its records store,
// events.RecordsBucket, or an agent's trajectories store,
// events.TrajectoriesBucket), spsvc.<run>.stores.<kind>.<name>: the run's
// bridge answers it (ServeStores). A member's user may publish its own
// alone, so a member gets its own stores and no other's, and makes no
// stream itself: the store's configuration, subjects included, is the
// bridge's.
func StoreRequestSubject(run string, m events.Member) string {
	return events.ServicePrefix + "." + run + ".stores." + string(m.Kind()) + "." + m.Name()
}

// storeRequestFilter is the subject ServeStores answers.
func storeRequestFilter(run string) string {
	return events.ServicePrefix + "." + run + ".stores.*.*"
}

// StoreKind is the kind of store a member asks for (StoreRequestSubject),
// named in the request's body, {"store":"<kind>"}. A request without a
// body, or without a kind (every request before trajectories stores),
// asks for the member's records store.
type StoreKind string

// The kinds of store a member may ask for.
const (
	// StoreRecords is an agent's or an owner's own records store,
	// events.RecordsBucket.
	StoreRecords StoreKind = "records"
	// StoreTrajectories is an agent's own trajectories store,
	// events.TrajectoriesBucket.
	StoreTrajectories StoreKind = "trajectories"
)

// Bucket returns the bucket of member m's store of kind k in run, "" for a
// kind this build does not know.
func (k StoreKind) Bucket(run string, m events.Member) string {
	switch k {
	case StoreRecords:
		return events.RecordsBucket(run, m)
	case StoreTrajectories:
		return events.TrajectoriesBucket(run, m)
	}
	return ""
}

// storeRequest is the body of a store request; none asks for the records
// store.
type storeRequest struct {
	Store StoreKind `json:"store,omitempty"`
}

// storeReply is the answer to a store request: the store's bucket, or why
// not. A bridge of an earlier build answers {} to every request, and makes
// the records store whatever the body asks.
type storeReply struct {
	Bucket string `json:"bucket,omitempty"`
	Error  string `json:"error,omitempty"`
}

// MakeRecordsStore makes member m's own records store in run,
// events.RecordsBucket, with the shared store's (BucketRecords) storage
// and replicas and its own subjects only, or opens it if it exists.
func MakeRecordsStore(ctx context.Context, js natsjs.JetStream, shared natsjs.ObjectStore, run string, m events.Member) (natsjs.ObjectStore, error) {
	return makeStore(ctx, js, shared, events.RecordsBucket(run, m), fmt.Sprintf("records of %s in run %s", m, run))
}

// MakeTrajectoriesStore makes agent m's own trajectories store in run,
// events.TrajectoriesBucket, with the shared store's (BucketTrajectories)
// storage and replicas and its own subjects only, or opens it if it
// exists.
func MakeTrajectoriesStore(ctx context.Context, js natsjs.JetStream, shared natsjs.ObjectStore, run string, m events.Member) (natsjs.ObjectStore, error) {
	return makeStore(ctx, js, shared, events.TrajectoriesBucket(run, m), fmt.Sprintf("trajectories of %s in run %s", m, run))
}

// makeStore makes the object store bucket with shared's storage and
// replicas, or opens it if it exists.
func makeStore(ctx context.Context, js natsjs.JetStream, shared natsjs.ObjectStore, bucket, description string) (natsjs.ObjectStore, error) {
	if store, err := js.ObjectStore(ctx, bucket); err == nil || !errors.Is(err, natsjs.ErrBucketNotFound) {
		return store, err
	}
	st, err := shared.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("jetstream: store %s: the shared store's status: %w", bucket, err)
	}
	cfg := natsjs.ObjectStoreConfig{Bucket: bucket, Description: description, Replicas: st.Replicas(), Storage: natsjs.FileStorage}
	if st.Storage() == natsjs.MemoryStorage {
		cfg.Storage = natsjs.MemoryStorage
	}
	store, err := js.CreateObjectStore(ctx, cfg)
	if errors.Is(err, natsjs.ErrBucketExists) || errors.Is(err, natsjs.ErrStreamNameAlreadyInUse) {
		store, err = js.ObjectStore(ctx, bucket) // made meanwhile
	}
	if err != nil {
		return nil, fmt.Errorf("jetstream: create store %s: %w", bucket, err)
	}
	return store, nil
}

// ServeStores answers run's store requests (StoreRequestSubject) on js's
// connection until the returned stop is called: it makes the asking
// member's own store of the kind it names (MakeRecordsStore for an agent
// or an owner, MakeTrajectoriesStore for an agent), with the storage and
// replicas of the shared store of that kind in bus. The member is the
// subject's, which its permissions fix.
func ServeStores(ctx context.Context, js natsjs.JetStream, bus *Bus, run string) (stop func(), err error) {
	nc := js.Conn()
	sub, err := nc.QueueSubscribe(storeRequestFilter(run), "stores", func(msg *nats.Msg) {
		rep := serveStore(ctx, js, bus, run, msg)
		b, _ := json.Marshal(rep)
		_ = msg.Respond(b)
	})
	if err != nil {
		return nil, fmt.Errorf("jetstream: serve store requests of run %s: %w", run, err)
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// serveStore makes the store msg asks for.
func serveStore(ctx context.Context, js natsjs.JetStream, bus *Bus, run string, msg *nats.Msg) storeReply {
	tok := strings.Split(msg.Subject, ".")
	m, err := events.NewMember(events.MemberKind(tok[len(tok)-2]), tok[len(tok)-1])
	if err != nil {
		return storeReply{Error: err.Error()}
	}
	var req storeRequest
	if body := bytes.TrimSpace(msg.Data); len(body) > 0 {
		if err := json.Unmarshal(body, &req); err != nil {
			return storeReply{Error: fmt.Sprintf("the request is no store request: %v", err)}
		}
	}
	kind := cmp.Or(req.Store, StoreRecords)
	var (
		shared natsjs.ObjectStore
		makeIt func(context.Context, natsjs.JetStream, natsjs.ObjectStore, string, events.Member) (natsjs.ObjectStore, error)
	)
	switch {
	case kind == StoreRecords && (m.Kind() == events.KindAgent || m.Kind() == events.KindOwner):
		shared, makeIt = bus.Records, MakeRecordsStore
	case kind == StoreTrajectories && m.Kind() == events.KindAgent:
		shared, makeIt = bus.Trajectories, MakeTrajectoriesStore
	case kind.Bucket(run, m) == "":
		return storeReply{Error: fmt.Sprintf("no store of kind %.40q: want %s or %s", kind, StoreRecords, StoreTrajectories)}
	default:
		return storeReply{Error: fmt.Sprintf("%s has no %s store", m, kind)}
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := makeIt(cctx, js, shared, run, m); err != nil {
		return storeReply{Error: err.Error()}
	}
	return storeReply{Bucket: kind.Bucket(run, m)}
}

// AskStore asks run's bridge for member m's own store of kind
// (StoreRequestSubject) until it answers or ctx ends: a bridge that is not
// up yet (no responders) is asked again. A records request is sent
// without a body, as every member of an earlier build sent it; a bridge
// that answers another kind's without naming its bucket is of an earlier
// build, which makes none.
func AskStore(ctx context.Context, nc *nats.Conn, run string, m events.Member, kind StoreKind) error {
	want := kind.Bucket(run, m)
	if want == "" {
		return fmt.Errorf("jetstream: store of %s: no store of kind %q", m, kind)
	}
	var body []byte
	if kind != StoreRecords {
		body, _ = json.Marshal(storeRequest{Store: kind})
	}
	var msg *nats.Msg
	var askErr error
	err := poll.Until(ctx, poll.Backoff(100*time.Millisecond, 2*time.Second), func() (bool, error) {
		if ctx.Err() != nil {
			return false, nil // no request after the end
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		msg, askErr = nc.RequestWithContext(rctx, StoreRequestSubject(run, m), body)
		return !errors.Is(askErr, nats.ErrNoResponders) || ctx.Err() != nil, nil
	})
	switch {
	case err != nil:
		return fmt.Errorf("jetstream: %s store of %s: no bridge answered: %w", kind, m, err)
	case askErr != nil:
		return fmt.Errorf("jetstream: %s store of %s: ask the bridge: %w", kind, m, askErr)
	}
	var rep storeReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return fmt.Errorf("jetstream: %s store of %s: the bridge's answer: %w", kind, m, err)
	}
	switch {
	case rep.Error != "":
		return fmt.Errorf("jetstream: %s store of %s: the bridge: %s", kind, m, rep.Error)
	case rep.Bucket != want && (rep.Bucket != "" || kind != StoreRecords):
		return fmt.Errorf("jetstream: %s store of %s: the bridge made %q, want %s (a bridge of an earlier build makes records stores only)",
			kind, m, rep.Bucket, want)
	}
	return nil
}

// OwnStore opens member m's own store of kind in run (StoreKind.Bucket),
// asking the run's bridge to make it if it does not exist yet (AskStore),
// and waits for a replicated store's leader (WaitStoreLeader): a member
// with credentials of its own makes no stream itself.
func OwnStore(ctx context.Context, js natsjs.JetStream, run string, m events.Member, kind StoreKind) (natsjs.ObjectStore, error) {
	bucket := kind.Bucket(run, m)
	if bucket == "" {
		return nil, fmt.Errorf("jetstream: store of %s: no store of kind %q", m, kind)
	}
	store, err := js.ObjectStore(ctx, bucket)
	if err == nil || !errors.Is(err, natsjs.ErrBucketNotFound) {
		if err != nil {
			return nil, fmt.Errorf("jetstream: %s store %s: %w", kind, bucket, err)
		}
		return store, nil
	}
	if err := AskStore(ctx, js.Conn(), run, m, kind); err != nil {
		return nil, err
	}
	if store, err = js.ObjectStore(ctx, bucket); err != nil {
		return nil, fmt.Errorf("jetstream: %s store %s: %w", kind, bucket, err)
	}
	if st, err := store.Status(ctx); err == nil && st.Replicas() > 1 {
		if err := WaitStoreLeader(ctx, js, bucket); err != nil {
			return nil, fmt.Errorf("jetstream: %s store %s: %w", kind, bucket, err)
		}
	}
	return store, nil
}

// storeLeaderWait bounds WaitStoreLeader; a cluster elects a new stream's
// leader in well under a second.
const storeLeaderWait = 30 * time.Second

// WaitStoreLeader waits, at most 30 s, until the stream of object store
// bucket has a leader. A replicated stream exists once the cluster's meta
// layer has placed it, before its own group has elected a leader: a write
// to a store the bridge has just made (ServeStores) then finds no
// responders, and one that failed so may leave a part behind.
func WaitStoreLeader(ctx context.Context, js natsjs.JetStream, bucket string) error {
	stream := "OBJ_" + bucket
	ctx, cancel := context.WithTimeout(ctx, storeLeaderWait)
	defer cancel()
	var last error
	err := poll.Until(ctx, poll.Backoff(10*time.Millisecond, 500*time.Millisecond), func() (bool, error) {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			if ctx.Err() == nil {
				last = err
			}
			return false, nil
		}
		info := s.CachedInfo()
		return info.Cluster != nil && info.Cluster.Leader != "", nil
	})
	if err != nil {
		return fmt.Errorf("jetstream: stream %s has no leader after %v (last: %v)", stream, storeLeaderWait, last)
	}
	return nil
}
