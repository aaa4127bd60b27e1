package jetstream_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// TestServeStores: the bridge's store service makes an agent's records store for a request
// without a body (as every member of an earlier build sends it) and its trajectories store for
// one that names that kind, each with the shared store's storage and replicas, and answers
// with the bucket; an owner gets a records store and no trajectories store, a sandbox neither,
// and a body that names no known kind is refused. TrajectoryStores lists the run's agents'
// trajectories stores, and the bus opens the store a trajectory names, and no other kind.
func TestServeStores(t *testing.T) {
	env := jstest.Start(t)
	ctx := t.Context()
	stop, err := jetstream.ServeStores(ctx, env.JS, env.Bus, "run1")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	ask := func(m events.Member, body string) (bucket, why string) {
		t.Helper()
		msg, err := env.Conn.RequestWithContext(ctx, jetstream.StoreRequestSubject("run1", m), []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		var rep struct{ Bucket, Error string }
		if err := json.Unmarshal(msg.Data, &rep); err != nil {
			t.Fatalf("answer %q: %v", msg.Data, err)
		}
		return rep.Bucket, rep.Error
	}
	for _, tc := range []struct {
		m          events.Member
		body, want string // want: the bucket, or "" for a refusal
	}{
		{"agent.a1", "", "sp_records_run1_agent_a1"},
		{"agent.a1", `{}`, "sp_records_run1_agent_a1"},
		{"agent.a1", `{"store":"records"}`, "sp_records_run1_agent_a1"},
		{"agent.a1", `{"store":"trajectories"}`, "sp_trajectories_run1_agent_a1"},
		{"owner.o1", "", "sp_records_run1_owner_o1"},
		{"owner.o1", `{"store":"trajectories"}`, ""},
		{"sandbox.s1", "", ""},
		{"sandbox.s1", `{"store":"trajectories"}`, ""},
		{"agent.a1", `{"store":"snapshots"}`, ""},
		{"agent.a1", `not json`, ""},
	} {
		bucket, why := ask(tc.m, tc.body)
		if bucket != tc.want || (tc.want == "") != (why != "") {
			t.Errorf("%s asking %q: bucket %q, error %q; want bucket %q", tc.m, tc.body, bucket, why, tc.want)
		}
	}
	for _, b := range []string{"sp_trajectories_run1_owner_o1", "sp_trajectories_run1_sandbox_s1", "sp_records_run1_sandbox_s1"} {
		if _, err := env.JS.ObjectStore(ctx, b); !errors.Is(err, natsjs.ErrBucketNotFound) {
			t.Errorf("store %s: %v, want none made", b, err)
		}
	}
	shared, err := env.Bus.Trajectories.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	own, err := env.JS.ObjectStore(ctx, "sp_trajectories_run1_agent_a1")
	if err != nil {
		t.Fatal(err)
	}
	st, err := own.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Replicas() != shared.Replicas() || st.Storage() != shared.Storage() {
		t.Errorf("the agent's trajectories store: %d replicas on %v, want the shared store's %d on %v",
			st.Replicas(), st.Storage(), shared.Replicas(), shared.Storage())
	}

	// The agent's side: it asks, and the bridge names the store it made.
	if err := jetstream.AskStore(ctx, env.Conn, "run1", "agent.a2", jetstream.StoreTrajectories); err != nil {
		t.Fatalf("agent a2 asking for its trajectories store: %v", err)
	}
	if err := jetstream.AskStore(ctx, env.Conn, "run1", "owner.o1", jetstream.StoreTrajectories); err == nil ||
		!strings.Contains(err.Error(), "has no trajectories store") {
		t.Errorf("an owner asking for a trajectories store: %v, want refused", err)
	}
	stores, err := jetstream.TrajectoryStores(ctx, env.JS, "run1")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, s := range stores {
		st, err := s.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, st.Bucket())
	}
	if want := "sp_trajectories_run1_agent_a1 sp_trajectories_run1_agent_a2"; strings.Join(names, " ") != want {
		t.Errorf("TrajectoryStores: %v, want %s", names, want)
	}
	for bucket, want := range map[string]string{"": "sp_trajectories", "sp_trajectories": "sp_trajectories",
		"sp_trajectories_run1_agent_a1": "sp_trajectories_run1_agent_a1"} {
		s, err := env.Bus.TrajectoryStore(ctx, bucket)
		if err != nil {
			t.Fatalf("TrajectoryStore(%q): %v", bucket, err)
		}
		if st, err := s.Status(ctx); err != nil || st.Bucket() != want {
			t.Errorf("TrajectoryStore(%q) opened %v (%v), want %s", bucket, st, err, want)
		}
	}
	for _, bucket := range []string{"sp_records", "sp_records_run1_agent_a1", "sp_checkpoints"} {
		if _, err := env.Bus.TrajectoryStore(ctx, bucket); err == nil {
			t.Errorf("TrajectoryStore(%q) opened a store of another kind", bucket)
		}
	}
}

// An earlier build's bridge answers every store request with {} and makes the records store:
// an agent asking it for a trajectories store is told so, not left to find no store.
func TestAskStoreOfAnEarlierBridge(t *testing.T) {
	env := jstest.Start(t)
	sub, err := env.Conn.Subscribe("spsvc.run1.stores.*.*", func(msg *nats.Msg) { _ = msg.Respond([]byte(`{}`)) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := jetstream.AskStore(t.Context(), env.Conn, "run1", "agent.a1", jetstream.StoreRecords); err != nil {
		t.Errorf("records store of an earlier bridge: %v", err)
	}
	err = jetstream.AskStore(t.Context(), env.Conn, "run1", "agent.a1", jetstream.StoreTrajectories)
	if err == nil || !strings.Contains(err.Error(), "earlier build") {
		t.Errorf("trajectories store of an earlier bridge: %v, want refused naming it", err)
	}
}

// On a 3-node cluster an agent's trajectories store is made with the shared
// store's 3 replicas, and WaitStoreLeader returns once its stream has a
// leader, before which a write would find no responders.
func TestOwnStoreOnACluster(t *testing.T) {
	env := jstest.StartCluster(t)
	ctx := t.Context()
	stop, err := jetstream.ServeStores(ctx, env.JS, env.Bus, "run1")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	if err := jetstream.AskStore(ctx, env.Conn, "run1", "agent.a1", jetstream.StoreTrajectories); err != nil {
		t.Fatal(err)
	}
	bucket := events.TrajectoriesBucket("run1", "agent.a1")
	if err := jetstream.WaitStoreLeader(ctx, env.JS, bucket); err != nil {
		t.Fatal(err)
	}
	s, err := env.JS.Stream(ctx, "OBJ_"+bucket)
	if err != nil {
		t.Fatal(err)
	}
	if info := s.CachedInfo(); info.Config.Replicas != 3 || info.Cluster == nil || info.Cluster.Leader == "" {
		t.Fatalf("the agent's trajectories store: %d replicas, cluster %+v; want 3 and a leader", info.Config.Replicas, info.Cluster)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := jetstream.WaitStoreLeader(short, env.JS, "sp_trajectories_run1_agent_none"); err == nil {
		t.Fatal("WaitStoreLeader of a store that does not exist returned")
	}
}
