package embedded_test

import (
	"context"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/participants/member"
)

// operatorServer starts a server in operator mode trusting a new authority with one run, r,
// provisions r's bus as its admin, and returns the authority, r's dir (embedded.RunDir), the
// server and the admin's bus.
func operatorServer(t *testing.T) (*embedded.Authority, string, *embedded.Server, *jetstream.Bus) {
	t.Helper()
	ctx := testContext(t)
	dir := filepath.Join(t.TempDir(), "auth")
	auth, err := embedded.LoadAuthority(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.AddRun("r"); err != nil {
		t.Fatal(err)
	}
	trust, err := auth.Trust()
	if err != nil {
		t.Fatal(err)
	}
	s, err := embedded.Start(ctx, embedded.Config{Dir: t.TempDir(), Trust: trust})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	dir = embedded.RunDir(dir, "r")
	_, js, _ := connectCreds(t, s, embedded.CredsFile(dir, embedded.RoleAdmin))
	bus, err := jetstream.Provision(ctx, js, jetstream.Topology{})
	if err != nil {
		t.Fatal(err)
	}
	return auth, dir, s, bus
}

// connectCreds connects with a .creds file; the channel gets the connection's async errors.
func connectCreds(t *testing.T, s *embedded.Server, creds string) (*nats.Conn, natsjs.JetStream, chan error) {
	t.Helper()
	errs := make(chan error, 64)
	nc, err := jetstream.Connect(testContext(t), jetstream.ConnConfig{URL: s.ClientURL(), CredsFile: creds},
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatalf("connect with %s: %v", creds, err)
	}
	t.Cleanup(nc.Close)
	js, err := natsjs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, errs
}

// memberCreds mints member m of run r and writes its creds file.
func memberCreds(t *testing.T, auth *embedded.Authority, m events.Member) string {
	t.Helper()
	b, _, err := auth.MemberCreds("r", m, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), strings.ReplaceAll(string(m), ".", "-")+".creds")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestMembersOnTheBus tries, with the credentials of one sandbox, one agent and one owner, every
// action of issue 16's list (and its neighbours): each is refused by the server as a permissions
// violation and nothing of it reaches the stream or a bucket, while what each member does as
// itself works.
func TestMembersOnTheBus(t *testing.T) {
	auth, dir, s, bus := operatorServer(t)
	_, ajs, _ := connectCreds(t, s, embedded.CredsFile(dir, embedded.RoleAdmin))
	ctx := testContext(t)
	// A live member's durable consumer, as an agent makes it (member.DurableConfig).
	durable := "sp_r_agent_a1"
	if _, err := bus.Stream.CreateConsumer(ctx, member.DurableConfig("r", durable, "a1")); err != nil {
		t.Fatal(err)
	}
	// Another client's watches of the members and manifests buckets, as the bridge keeps them.
	watches := map[string]string{} // stream → its watch's consumer
	for _, kv := range []natsjs.KeyValue{bus.Members, bus.Manifests} {
		w, err := kv.Watch(ctx, "r.>")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = w.Stop() })
		stream := "KV_" + kv.Bucket()
		watches[stream] = watchConsumer(t, ajs, stream)
	}
	type conn struct {
		nc   *nats.Conn
		js   natsjs.JetStream
		errs chan error
	}
	conns := map[string]conn{}
	for _, m := range []events.Member{"sandbox.sb1", "agent.a1", "owner.o1"} {
		nc, js, errs := connectCreds(t, s, memberCreds(t, auth, m))
		conns[string(m.Kind())] = conn{nc, js, errs}
	}
	sb, ag, ow := conns["sandbox"], conns["agent"], conns["owner"]

	// What each does as itself is stored.
	for _, tc := range []struct {
		c       conn
		subject string
	}{
		{sb, "$KV.sp_daemons.r.sandbox.sb1"},
		{ag, "sp.r.ack.1.prepare.agent.a1"},
		{ow, "sp.r.ack.1.commit.owner.o1"},
		{ow, "$KV.sp_daemons.r.sandbox.sb9"},
	} {
		if _, err := tc.c.js.Publish(ctx, tc.subject, []byte("x")); err != nil {
			t.Errorf("publishing %s as itself: %v, want a stream ack", tc.subject, err)
		}
	}

	// An owner's own durable, as its member runtime makes and updates it (member.DurableConfig):
	// its create subject names its one filter, and the server refuses a body that names another
	// filter, more filters or another consumer.
	own := member.DurableConfig("r", "sp_r_owner_o1", "o1")
	if _, err := ow.js.CreateConsumer(ctx, jetstream.StreamName, own); err != nil {
		t.Errorf("owner making its durable: %v", err)
	}
	if _, err := ow.js.UpdateConsumer(ctx, jetstream.StreamName, own); err != nil {
		t.Errorf("owner updating its durable: %v", err)
	}
	create := "$JS.API.CONSUMER.CREATE.STILLPOINT.sp_r_owner_o1.sp.r.phase.>"
	for what, body := range map[string]string{
		"another filter":   `{"stream_name":"STILLPOINT","config":{"durable_name":"sp_r_owner_o1","filter_subject":"sp.>","ack_policy":"explicit"}}`,
		"more filters":     `{"stream_name":"STILLPOINT","config":{"durable_name":"sp_r_owner_o1","filter_subjects":["sp.r.phase.>","sp.>"],"ack_policy":"explicit"}}`,
		"another consumer": `{"stream_name":"STILLPOINT","config":{"durable_name":"sp_r_agent_a1","filter_subject":"sp.r.phase.>","ack_policy":"explicit"}}`,
	} {
		r, err := ow.nc.Request(create, []byte(body), 5*time.Second)
		if err != nil || !strings.Contains(string(r.Data), `"error"`) {
			t.Errorf("owner's durable create naming its filter with a body of %s: %v %s, want the server's error", what, err, r.Data)
		}
	}
	if ci, err := bus.Stream.Consumer(ctx, "sp_r_owner_o1"); err != nil || ci.CachedInfo().Config.FilterSubject != "sp.r.phase.>" ||
		len(ci.CachedInfo().Config.FilterSubjects) != 0 {
		t.Errorf("the owner's durable: %v, %v; want its one filter", ci, err)
	}

	refused := func(c conn, what, subject string, data string) {
		t.Helper()
		if err := c.nc.PublishRequest(subject, c.nc.NewRespInbox(), []byte(data)); err != nil {
			t.Fatal(err)
		}
		violation(t, c.errs, what, subject)
	}
	for _, tc := range []struct {
		c       conn
		what    string
		subject string
		data    string
	}{
		// The sandbox: nothing into the stream, even as itself (its acks travel on core NATS).
		{sb, "sandbox acking a prepare into the stream as itself", "sp.r.ack.1.prepare.sandbox.sb1", ""},
		{sb, "sandbox acking a commit into the stream as itself", "sp.r.ack.1.commit.sandbox.sb1", ""},
		{sb, "sandbox publishing a record of the bridge's", "sp.r.prepared.1.1", ""},
		{sb, "sandbox publishing under its run's prefix", "sp.r.x", ""},
		// The sandbox: another sandbox's and another run's subjects.
		{sb, "sandbox acking as another sandbox", "sp.r.ack.1.prepare.sandbox.sb2", ""},
		{sb, "sandbox acking in another run", "sp.other.ack.1.prepare.sandbox.sb1", ""},
		{sb, "sandbox acking as an agent", "sp.r.ack.1.prepare.agent.a1", ""},
		{sb, "sandbox acking on core NATS as another sandbox", "spl.r.ack.1.prepare.sandbox.sb2", ""},
		{sb, "sandbox acking on core NATS in another run", "spl.other.ack.1.commit.sandbox.sb1", ""},
		{ag, "agent acking a prepare on core NATS", "spl.r.ack.1.prepare.agent.a1", ""},
		{sb, "sandbox joining as another sandbox", "sp.r.member.sandbox.sb2", ""},
		{sb, "sandbox joining as itself (a daemon announces nothing)", "sp.r.member.sandbox.sb1", ""},
		{sb, "sandbox writing another's heartbeat", "$KV.sp_daemons.r.sandbox.sb2", ""},
		{sb, "sandbox writing another run's heartbeat", "$KV.sp_daemons.other.sandbox.sb1", ""},
		{sb, "sandbox writing its key of sp_members", "$KV.sp_members.r.sandbox.sb1", ""},
		{sb, "sandbox writing an agent's heartbeat", "$KV.sp_members.r.agent.a1", ""},
		{sb, "sandbox purging the daemons bucket", "$JS.API.STREAM.PURGE.KV_sp_daemons", "{}"},
		{ow, "owner writing a sandbox's key of sp_members", "$KV.sp_members.r.sandbox.sb9", ""},
		{sb, "sandbox publishing a phase", "sp.r.phase.prepare", ""},
		{sb, "sandbox writing a checkpoint manifest", "$KV.sp_manifests.r.c1", ""},
		// The sandbox reading every run's traffic, making and deleting consumers.
		{sb, "sandbox consuming everything", "$JS.API.CONSUMER.CREATE.STILLPOINT.x.sp.>", `{"stream_name":"STILLPOINT","config":{"name":"x","filter_subject":"sp.>"}}`},
		{sb, "sandbox consuming another run's phases", "$JS.API.CONSUMER.CREATE.STILLPOINT.x.sp.other.phase.>", ""},
		{sb, "sandbox consuming its run's acks", "$JS.API.CONSUMER.CREATE.STILLPOINT.x.sp.r.ack.>", ""},
		{sb, "sandbox consuming without a filter", "$JS.API.CONSUMER.CREATE.STILLPOINT.x", ""},
		{sb, "sandbox making a durable", "$JS.API.CONSUMER.DURABLE.CREATE.STILLPOINT.x", ""},
		// Issue 29: no consumer of any kind or name, not even of its own run's phases; a create on
		// an existing name would update that consumer.
		{sb, "sandbox making an ordered consumer of its run's phases", "$JS.API.CONSUMER.CREATE.STILLPOINT.x.sp.r.phase.>",
			`{"stream_name":"STILLPOINT","config":{"name":"x","filter_subject":"sp.r.phase.>","deliver_subject":"_INBOX.r.sandbox.sb1.x","ack_policy":"none"}}`},
		{sb, "sandbox making a durable of its run's phases", "$JS.API.CONSUMER.CREATE.STILLPOINT.y.sp.r.phase.>",
			`{"stream_name":"STILLPOINT","config":{"durable_name":"y","filter_subject":"sp.r.phase.>","ack_policy":"explicit"}}`},
		{sb, "sandbox re-pointing an agent's durable consumer", "$JS.API.CONSUMER.CREATE.STILLPOINT." + durable + ".sp.r.phase.>",
			`{"stream_name":"STILLPOINT","config":{"durable_name":"` + durable + `","filter_subject":"sp.r.phase.>","ack_policy":"explicit","deliver_policy":"all"}}`},
		{sb, "sandbox re-pointing an agent's durable consumer by name alone", "$JS.API.CONSUMER.CREATE.STILLPOINT." + durable,
			`{"stream_name":"STILLPOINT","config":{"durable_name":"` + durable + `","filter_subject":"sp.other.phase.>","ack_policy":"explicit"}}`},
		{sb, "sandbox answering a consumer's flow control", "$JS.FC.STILLPOINT.x.1.1", ""},
		// Nor any metadata: the stream's info lists every subject of it, every run's.
		{sb, "sandbox reading the account's info", "$JS.API.INFO", ""},
		{sb, "sandbox listing the stream's subjects", "$JS.API.STREAM.INFO.STILLPOINT", `{"subjects_filter":"sp.>"}`},
		{sb, "sandbox reading the members bucket's info", "$JS.API.STREAM.INFO.KV_sp_members", `{"subjects_filter":">"}`},
		{sb, "sandbox listing the streams", "$JS.API.STREAM.NAMES", ""},
		{sb, "sandbox deleting a member's durable consumer", "$JS.API.CONSUMER.DELETE.STILLPOINT." + durable, ""},
		{sb, "sandbox pulling from a member's durable consumer", "$JS.API.CONSUMER.MSG.NEXT.STILLPOINT." + durable, `{"batch":1}`},
		{sb, "sandbox acking a member's messages", "$JS.ACK.STILLPOINT." + durable + ".1.1.1.1.0", ""},
		{sb, "sandbox reading a message by sequence", "$JS.API.STREAM.MSG.GET.STILLPOINT", `{"seq":1}`},
		{sb, "sandbox reading a message directly by sequence", "$JS.API.DIRECT.GET.STILLPOINT", `{"seq":1}`},
		{sb, "sandbox reading an agent's ack", "$JS.API.DIRECT.GET.STILLPOINT.sp.r.ack.1.prepare.agent.a1", ""},
		{sb, "sandbox reading the next of its run's phases", "$JS.API.DIRECT.GET.STILLPOINT", `{"seq":1,"next_by_subj":"sp.r.phase.>"}`},
		{sb, "sandbox reading another run's last phase", "$JS.API.DIRECT.GET.STILLPOINT.sp.other.phase.>", ""},
		{sb, "sandbox reading every run's last phase", "$JS.API.DIRECT.GET.STILLPOINT.sp.*.phase.>", ""},
		{sb, "sandbox reading its run's last ack", "$JS.API.DIRECT.GET.STILLPOINT.sp.r.ack.>", ""},
		{sb, "sandbox reading another's heartbeat", "$JS.API.DIRECT.GET.KV_sp_members.$KV.sp_members.r.agent.a1", ""},
		{sb, "sandbox listing consumers", "$JS.API.CONSUMER.LIST.STILLPOINT", ""},
		{sb, "sandbox watching the members bucket", "$JS.API.CONSUMER.CREATE.KV_sp_members.x.$KV.sp_members.>", ""},
		{sb, "sandbox reading another daemon's heartbeat", "$JS.API.DIRECT.GET.KV_sp_daemons.$KV.sp_daemons.r.sandbox.sb2", ""},
		{sb, "sandbox watching the daemons bucket", "$JS.API.CONSUMER.CREATE.KV_sp_daemons.x.$KV.sp_daemons.r.>", ""},
		{sb, "sandbox writing records", "$O.sp_records.C.x", ""},
		{sb, "sandbox calling an owner", "spsvc.r.owner.o1.seed_session", ""},
		{sb, "sandbox discovering the services", "$SRV.PING", ""},
		{sb, "sandbox asking the agents' services for their stats", "$SRV.STATS.stillpoint-agent", ""},
		{ag, "agent discovering the services", "$SRV.INFO", ""},
		// The agent: another agent's names.
		{ag, "agent acking as another agent", "sp.r.ack.1.prepare.agent.a2", ""},
		{ag, "agent acking as an owner", "sp.r.ack.1.commit.owner.o1", ""},
		{ag, "agent writing another agent's manifest", "$KV.sp_manifests.r.c1.agent.a2", ""},
		{ag, "agent writing its own member manifest key (its commit ack records it)", "$KV.sp_manifests.r.c1.agent.a1", ""},
		{ag, "agent writing a member list", "$O.sp_checkpoints.C.x", ""},
		{ag, "agent writing another agent's heartbeat", "$KV.sp_members.r.agent.a2", ""},
		{ag, "agent acking in another run", "sp.other.ack.1.prepare.agent.a1", ""},
		{ag, "agent deleting another member's durable consumer", "$JS.API.CONSUMER.DELETE.STILLPOINT.sp_r_agent_a2", ""},
		{ag, "agent pulling from another member's durable consumer", "$JS.API.CONSUMER.MSG.NEXT.STILLPOINT.sp_r_owner_o1", ""},
		{ag, "agent making another member's durable consumer", "$JS.API.CONSUMER.CREATE.STILLPOINT.sp_r_agent_a2", ""},
		// Issue 29: its own durable's create subject names its one filter, the run's phases.
		{ag, "agent making another member's durable consumer of the run's phases", "$JS.API.CONSUMER.CREATE.STILLPOINT.sp_r_agent_a2.sp.r.phase.>", ""},
		{ag, "agent making a consumer of the run's phases under another name", "$JS.API.CONSUMER.CREATE.STILLPOINT.x.sp.r.phase.>",
			`{"stream_name":"STILLPOINT","config":{"name":"x","filter_subject":"sp.r.phase.>","ack_policy":"none"}}`},
		{ag, "agent making its durable with another filter", "$JS.API.CONSUMER.CREATE.STILLPOINT." + durable + ".sp.r.ack.>",
			`{"stream_name":"STILLPOINT","config":{"durable_name":"` + durable + `","filter_subject":"sp.r.ack.>","ack_policy":"explicit"}}`},
		{ag, "agent making its durable with another run's phases", "$JS.API.CONSUMER.CREATE.STILLPOINT." + durable + ".sp.other.phase.>",
			`{"stream_name":"STILLPOINT","config":{"durable_name":"` + durable + `","filter_subject":"sp.other.phase.>","ack_policy":"explicit"}}`},
		{ag, "agent making its durable by name alone, the filter in the body", "$JS.API.CONSUMER.CREATE.STILLPOINT." + durable,
			`{"stream_name":"STILLPOINT","config":{"durable_name":"` + durable + `","filter_subjects":["sp.r.phase.>","sp.>"],"ack_policy":"explicit"}}`},
		{ag, "agent making its durable the legacy way", "$JS.API.CONSUMER.DURABLE.CREATE.STILLPOINT." + durable,
			`{"stream_name":"STILLPOINT","config":{"durable_name":"` + durable + `","filter_subject":"sp.>","ack_policy":"explicit"}}`},
		{ow, "owner making an agent's durable consumer", "$JS.API.CONSUMER.CREATE.STILLPOINT." + durable + ".sp.r.phase.>", ""},
		{ag, "agent writing a snapshot key", "$KV.sp_snapshots.snap1", ""},
		// The owner: another owner's names, an agent's.
		{ow, "owner acking as another owner", "sp.r.ack.1.commit.owner.o2", ""},
		{ow, "owner acking as an agent", "sp.r.ack.1.commit.agent.a1", ""},
		{ow, "owner writing another owner's manifest", "$KV.sp_manifests.r.c1.owner.o2", ""},
		{ow, "owner deleting an agent's durable consumer", "$JS.API.CONSUMER.DELETE.STILLPOINT." + durable, ""},
	} {
		refused(tc.c, tc.what, tc.subject, tc.data)
	}
	// No member deletes another client's watch of a bucket.
	for kind, c := range conns {
		for stream, name := range watches {
			api := "$JS.API.CONSUMER.DELETE." + stream + "." + name
			refused(c, kind+" deleting another client's watch of "+stream, api, "")
		}
	}
	// No member manages a stream or a bucket.
	for kind, c := range conns {
		for _, api := range []string{"$JS.API.STREAM.DELETE.STILLPOINT", "$JS.API.STREAM.PURGE.STILLPOINT",
			"$JS.API.STREAM.MSG.DELETE.STILLPOINT", "$JS.API.STREAM.UPDATE.STILLPOINT", "$JS.API.STREAM.CREATE.OTHER",
			"$JS.API.STREAM.DELETE.KV_sp_members", "$JS.API.STREAM.PURGE.KV_sp_manifests"} {
			refused(c, kind+" calling "+api, api, "{}")
		}
	}
	// Nor reads replies meant for others, nor answers another service's discovery.
	otherService := map[string]string{"sandbox": "stillpoint-agent", "agent": "stillpoint-owner", "owner": "stillpoint-sandboxd"}
	for kind, c := range conns {
		subjects := []string{"_INBOX.>", "sp.>", "sp.r.phase.>", "spl.>", "spl.other.phase.>", "spl.*.phase.>", "sp.r.ack.>",
			"sp.r.outcome.>", "spsvc.r.agent.a2.>", "$SRV.>", "$SRV.INFO.stillpoint-bridge", "$SRV.PING.stillpoint-bridge.x",
			"$SRV.INFO." + otherService[kind], "$SRV.STATS." + otherService[kind] + ".x"}
		if kind != "sandbox" {
			// A sandbox's core feed subscribes to its run's phases as the stream republishes them
			// (TestSandboxFeedAndService).
			subjects = append(subjects, "spl.r.phase.>")
		}
		for _, subject := range subjects {
			if _, err := c.nc.SubscribeSync(subject); err != nil {
				t.Fatal(err)
			}
			violation(t, c.errs, kind+" subscribing to "+subject, subject)
		}
	}

	// Nothing refused reached the stream or a bucket.
	info, err := bus.Stream.Info(ctx, natsjs.WithSubjectFilter("sp.>"))
	if err != nil {
		t.Fatal(err)
	}
	for subj := range info.State.Subjects {
		switch subj {
		case "sp.r.ack.1.prepare.agent.a1", "sp.r.ack.1.commit.owner.o1":
		default:
			t.Errorf("the stream holds %s, which no one may publish", subj)
		}
	}
	if info.State.Msgs != 2 {
		t.Errorf("the stream holds %d messages, want the 2 allowed", info.State.Msgs)
	}
	for _, key := range []string{"r.sandbox.sb1", "r.sandbox.sb9", "r.agent.a2", "r.agent.a1"} {
		if _, err := bus.Members.Get(ctx, key); !errors.Is(err, natsjs.ErrKeyNotFound) {
			t.Errorf("heartbeat key %s of sp_members: %v, want not found", key, err)
		}
	}
	for _, key := range []string{"r.sandbox.sb2", "other.sandbox.sb1"} {
		if _, err := bus.Daemons.Get(ctx, key); !errors.Is(err, natsjs.ErrKeyNotFound) {
			t.Errorf("heartbeat key %s of sp_daemons: %v, want not found", key, err)
		}
	}
	for _, key := range []string{"r.c1.agent.a2", "r.c1.owner.o2", "r.c1"} {
		if _, err := bus.Manifests.Get(ctx, key); !errors.Is(err, natsjs.ErrKeyNotFound) {
			t.Errorf("manifest key %s: %v, want not found", key, err)
		}
	}
	if ci, err := bus.Stream.Consumer(ctx, durable); err != nil {
		t.Errorf("the member's durable consumer: %v, want it still there", err)
	} else if cfg := ci.CachedInfo().Config; cfg.FilterSubject != "sp.r.phase.>" || len(cfg.FilterSubjects) != 0 ||
		cfg.DeliverPolicy != natsjs.DeliverNewPolicy || cfg.Description != "a1" {
		t.Errorf("the member's durable consumer: filter %q %q, deliver %s, description %q; want it unchanged",
			cfg.FilterSubject, cfg.FilterSubjects, cfg.DeliverPolicy, cfg.Description)
	}
	for stream, name := range watches {
		if got := watchConsumer(t, ajs, stream); got != name {
			t.Errorf("the watch of %s: consumer %q, want %q still there", stream, got, name)
		}
	}
}

// TestSandboxPurgesNoHeartbeat: issue 29's attack 4. On sp_members a put with "Nats-Rollup: all"
// on a sandbox's own heartbeat key purged every member's key (the bucket allowed roll-ups, which
// its expiry markers needed). A sandbox's key is in sp_daemons now, which allows none: with its
// own credentials every roll-up, purge or TTL of its own is refused by the server, its key of
// sp_members is a permissions violation, and every other key of both buckets is still there
// (TestMembersRollUpNoOtherKey: sp_members takes no roll-up either).
func TestSandboxPurgesNoHeartbeat(t *testing.T) {
	auth, _, s, bus := operatorServer(t)
	ctx := testContext(t)
	put := func(kv natsjs.KeyValue, key string) {
		t.Helper()
		if _, err := kv.Put(ctx, key, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	members := []string{"r.agent.a1", "r.owner.o1"}
	daemons := []string{"r.sandbox.sb1", "r.sandbox.sb2", "r.sandbox.sb3"}
	for _, k := range members {
		put(bus.Members, k)
	}
	nc, js, errs := connectCreds(t, s, memberCreds(t, auth, "sandbox.sb1"))
	own := "$KV.sp_daemons.r.sandbox.sb1"
	if _, err := js.Publish(ctx, own, []byte(`{}`)); err != nil {
		t.Fatalf("the sandbox's heartbeat: %v", err)
	}
	for _, k := range daemons[1:] {
		put(bus.Daemons, k)
	}
	for _, h := range []nats.Header{
		{"Nats-Rollup": []string{"all"}},
		{"Nats-Rollup": []string{"sub"}},
		{"KV-Operation": []string{"PURGE"}, "Nats-Rollup": []string{"sub"}},
		{"Nats-TTL": []string{"never"}},
	} {
		if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: own, Header: h, Data: []byte(`{}`)}); err == nil {
			t.Errorf("the sandbox's put with %v on its own key was stored", h)
		} else {
			t.Logf("put with %v: %v", h, err)
		}
	}
	// Its key of sp_members, an earlier build's home of its heartbeat, is not its to write.
	rollup := &nats.Msg{Subject: "$KV.sp_members.r.sandbox.sb1", Header: nats.Header{"Nats-Rollup": []string{"all"}}, Data: []byte(`{}`)}
	if err := nc.PublishMsg(rollup); err != nil {
		t.Fatal(err)
	}
	violation(t, errs, "sandbox rolling up sp_members on its old key", rollup.Subject)
	for _, k := range members {
		if _, err := bus.Members.Get(ctx, k); err != nil {
			t.Errorf("heartbeat %s of sp_members after the attempts: %v", k, err)
		}
	}
	for _, k := range daemons {
		if _, err := bus.Daemons.Get(ctx, k); err != nil {
			t.Errorf("heartbeat %s of sp_daemons after the attempts: %v", k, err)
		}
	}
}

// TestSandboxFloodStoresNothing: issue 29's attack 6, a sandbox flooding acks on subjects whose
// sequence and phase tokens it chose, which would grow a stream that stored them without bound.
// Everything its credentials may publish is core NATS (its acks, on every phase and sequence it
// likes, which no server keeps) or its one heartbeat key (one message a key): a flood of both
// leaves the stream's bytes and messages as they were, and the daemons'
// bucket with one message of it.
func TestSandboxFloodStoresNothing(t *testing.T) {
	auth, _, s, bus := operatorServer(t)
	ctx := testContext(t)
	before, err := bus.Stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	nc, js, errs := connectCreds(t, s, memberCreds(t, auth, "sandbox.sb1"))
	payload := make([]byte, 4<<10)
	for i := range 20000 {
		p := []events.Phase{events.PhasePrepare, events.PhaseCommit, events.PhaseResume, events.PhaseRelease}[i%4]
		if err := nc.Publish(events.LiveAckSubject("r", uint64(i), p, "sandbox.sb1"), payload); err != nil {
			t.Fatal(err)
		}
	}
	for range 200 {
		if _, err := js.Publish(ctx, "$KV.sp_daemons.r.sandbox.sb1", []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	noViolations(t, nc, errs, "sandbox")
	after, err := bus.Stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.State.Bytes != before.State.Bytes || after.State.Msgs != before.State.Msgs {
		t.Errorf("the stream went from %d messages (%d bytes) to %d (%d bytes) under the flood",
			before.State.Msgs, before.State.Bytes, after.State.Msgs, after.State.Bytes)
	}
	st, err := bus.Daemons.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Values() != 1 {
		t.Errorf("the daemons' bucket holds %d messages after 200 heartbeats of one key, want 1", st.Values())
	}
}

// watchConsumer returns the name of the one consumer of stream (a bucket's, with one watch).
func watchConsumer(t *testing.T, js natsjs.JetStream, stream string) string {
	t.Helper()
	ctx := testContext(t)
	st, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	names := st.ConsumerNames(ctx)
	var got []string
	for n := range names.Name() {
		got = append(got, n)
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("stream %s has consumers %v, want the one watch", stream, got)
	}
	return got[0]
}

// TestSandboxFeedAndService: with its own credentials a sandbox reads its run's phases on a core
// subscription of their live copies, and the newest of them, of each phase kind and of the
// committed outcomes by direct gets whose subjects name them (its core feed), writes, reads and
// deletes its heartbeat and checks its own acks, all without a consumer or the stream's info, and
// serves its own service to an agent of its run.
func TestSandboxFeedAndService(t *testing.T) {
	auth, dir, s, _ := operatorServer(t)
	ctx := testContext(t)
	snc, sjs, serrs := connectCreds(t, s, memberCreds(t, auth, "sandbox.sb1"))
	bnc, bjs, _ := connectCreds(t, s, embedded.CredsFile(dir, embedded.RoleBridge))
	core, err := snc.SubscribeSync(events.LivePhaseFilter("r"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := snc.SubscribeSync(events.OutcomeSubject("r", events.TypeCheckpointCommitted)); err != nil {
		t.Fatal(err)
	}
	if err := snc.Flush(); err != nil {
		t.Fatal(err)
	}
	if _, err := bjs.Publish(ctx, "sp.r.phase.prepare", []byte("p")); err != nil {
		t.Fatal(err)
	}
	stored := &nats.Msg{Subject: "sp.r.phase.commit", Data: []byte("c"), Header: nats.Header{}}
	ack, err := bjs.PublishMsg(ctx, stored)
	if err != nil {
		t.Fatal(err)
	}
	if err := bnc.PublishMsg(events.LiveCopy(stored, ack.Sequence, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := bjs.Publish(ctx, events.OutcomeSubject("r", events.TypeCheckpointCommitted), []byte("o")); err != nil {
		t.Fatal(err)
	}
	if m, err := core.NextMsg(10 * time.Second); err != nil || m.Subject != "spl.r.phase.commit" {
		t.Errorf("the sandbox's core subscription of its phases: %v, %v", m, err)
	}
	for subject, want := range map[string]string{
		events.PhaseFilter("r"): "sp.r.phase.commit",
		"sp.r.phase.prepare":    "sp.r.phase.prepare",
		"sp.r.phase.commit":     "sp.r.phase.commit",
		events.OutcomeSubject("r", events.TypeCheckpointCommitted): events.OutcomeSubject("r", events.TypeCheckpointCommitted),
	} {
		if m, err := jetstream.DirectGet(ctx, snc, jetstream.StreamName, subject); err != nil || m.Subject != want {
			t.Errorf("sandbox reading the newest of %s: %v, %v; want %s", subject, m, err, want)
		}
	}
	// Its acks as the bridge recorded them: the sandbox reads its own back.
	if _, err := bjs.Publish(ctx, "sp.r.ack.1.commit.sandbox.sb1", nil); err != nil {
		t.Fatalf("the bridge recording a sandbox's ack: %v", err)
	}
	if _, err := jetstream.DirectGet(ctx, snc, jetstream.StreamName, "sp.r.ack.1.commit.sandbox.sb1"); err != nil {
		t.Errorf("sandbox reading its own ack: %v", err)
	}
	// Its heartbeat, as its member runtime writes, reads and deletes it: in sp_daemons, which
	// takes no TTL of a put's own (the bucket's max age is the TTL).
	rev, err := jetstream.KVWrite(ctx, sjs, jetstream.BucketDaemons, "r.sandbox.sb1", []byte("hb"), -1)
	if err != nil {
		t.Fatalf("sandbox writing its heartbeat: %v", err)
	}
	if v, got, err := jetstream.KVGet(ctx, sjs, jetstream.BucketDaemons, "r.sandbox.sb1"); err != nil || string(v) != "hb" || got != rev {
		t.Errorf("sandbox reading its heartbeat: %q at %d, %v", v, got, err)
	}
	if err := jetstream.KVDelete(ctx, sjs, jetstream.BucketDaemons, "r.sandbox.sb1", rev); err != nil {
		t.Errorf("sandbox deleting its heartbeat: %v", err)
	}
	if _, err := jetstream.KVWrite(ctx, sjs, jetstream.BucketDaemons, "r.sandbox.sb1", []byte("again"), 0); err != nil {
		t.Errorf("sandbox writing its heartbeat again over the deleted key: %v", err)
	}
	noViolations(t, snc, serrs, "sandbox")

	// What jetstream.Open reads, and what its catch-up made before, are refused.
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := jetstream.Open(short, sjs); err == nil {
		t.Error("a sandbox opened the bus, which reads every stream's info")
	}
	violation(t, serrs, "sandbox opening the bus", "$JS.API.STREAM.INFO.STILLPOINT")
	short, cancel = context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := sjs.CreateConsumer(short, jetstream.StreamName, natsjs.ConsumerConfig{Name: "x", FilterSubject: events.PhaseFilter("r"),
		AckPolicy: natsjs.AckNonePolicy}); err == nil {
		t.Error("a sandbox made a consumer of its run's phases")
	}
	violation(t, serrs, "sandbox making a consumer of its run's phases", "$JS.API.CONSUMER.CREATE.STILLPOINT.x.sp.r.phase.>")

	svc, err := jetstream.NewService(snc, micro.Config{Name: events.ServiceName(events.KindSandbox), Version: "1.0.0"}, "spsvc.r.sandbox.sb1",
		func(error) (int, string) { return 500, "internal" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	if err := svc.Handle("echo", func(body []byte) (any, error) { return string(body), nil }); err != nil {
		t.Fatal(err)
	}
	if err := snc.Flush(); err != nil {
		t.Fatal(err)
	}
	anc, _, aerrs := connectCreds(t, s, memberCreds(t, auth, "agent.a1"))
	var out string
	if err := jetstream.Call(ctx, anc, "spsvc.r.sandbox.sb1.echo", "hi", &out); err != nil || out != `"hi"` {
		t.Errorf("agent calling its sandbox: %q, %v", out, err)
	}
	// The sandbox's prepare ack travels on core NATS (events.LiveAck), and its agent hears it.
	acks, err := anc.SubscribeSync("spl.r.ack.*.prepare.sandbox.*")
	if err != nil {
		t.Fatal(err)
	}
	if err := anc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := snc.Publish("spl.r.ack.3.prepare.sandbox.sb1", []byte("ack")); err != nil {
		t.Fatal(err)
	}
	if m, err := acks.NextMsg(5 * time.Second); err != nil || m.Subject != "spl.r.ack.3.prepare.sandbox.sb1" {
		t.Errorf("the agent hearing its sandbox's prepare ack on core NATS: %v, %v", m, err)
	}
	// The sandbox answers discovery of its own service, as `nats micro ls` asks it as admin.
	adm, _, _ := connectCreds(t, s, embedded.CredsFile(dir, embedded.RoleAdmin))
	for _, subject := range []string{"$SRV.PING", "$SRV.INFO.stillpoint-sandboxd", "$SRV.STATS.stillpoint-sandboxd"} {
		if _, err := adm.Request(subject, nil, 5*time.Second); err != nil {
			t.Errorf("admin asking %s: %v, want the sandbox's answer", subject, err)
		}
	}
	noViolations(t, snc, serrs, "sandbox")
	noViolations(t, anc, aerrs, "agent")
}

// TestExpiredAndRevokedSandbox: a sandbox JWT past its expiry is refused; a revoked one is cut
// off and refused from then on; the authority's role credentials connect.
func TestExpiredAndRevokedSandbox(t *testing.T) {
	auth, dir, s, _ := operatorServer(t)
	ctx := testContext(t)
	signerFile := filepath.Join(t.TempDir(), "sandbox-signer.json")
	if err := auth.WriteSigner("r", events.KindSandbox, signerFile); err != nil {
		t.Fatal(err)
	}
	signer, err := embedded.LoadSigner(signerFile)
	if err != nil {
		t.Fatal(err)
	}
	write := func(b []byte) string {
		path := filepath.Join(t.TempDir(), "nats.creds")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	expired, _, err := signer.Mint("r", "sb1", time.Minute, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: s.ClientURL(), CredsFile: write(expired)}, nats.NoReconnect()); err == nil {
		nc.Close()
		t.Error("an expired sandbox JWT connected")
	} else if !strings.Contains(strings.ToLower(err.Error()), "authorization") && !strings.Contains(strings.ToLower(err.Error()), "expired") {
		t.Errorf("connect with an expired JWT: %v, want an authorization error", err)
	}

	live, user, err := signer.Mint("r", "sb1", 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	creds := write(live)
	nc, _, _ := connectCreds(t, s, creds)
	if err := auth.Revoke("r", user); err != nil {
		t.Fatal(err)
	}
	ajwt, err := auth.AccountJWT("r")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateAccount(ajwt); err != nil {
		t.Fatal(err)
	}
	poll.Wait(t, 10*time.Second, "the revoked sandbox to be cut off", func() bool { return !nc.IsConnected() })
	if nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: s.ClientURL(), CredsFile: creds}, nats.NoReconnect()); err == nil {
		nc.Close()
		t.Error("a revoked sandbox JWT connected")
	}
	// A sandbox of its own kind only: the signer mints no agent.
	if _, _, err := auth.MemberCreds("R", "agent.a1", 0); !errors.Is(err, embedded.ErrNotMember) {
		t.Errorf("an upper-case run: %v, want ErrNotMember", err)
	}
	for _, role := range []embedded.Role{embedded.RoleBridge, embedded.RoleController, embedded.RoleAdmin} {
		nc, _, _ := connectCreds(t, s, embedded.CredsFile(dir, role))
		nc.Close()
	}
}

// TestRevocationSurvivesRestart: a sandbox JWT revoked on a running server stays refused when the
// server is started again on the same auth and store dirs, by an authority loaded afresh from the
// auth dir (as `stillpoint server --auth-dir` does), while a user minted after it connects.
func TestRevocationSurvivesRestart(t *testing.T) {
	ctx := testContext(t)
	authDir, storeDir := filepath.Join(t.TempDir(), "auth"), t.TempDir()
	start := func() (*embedded.Authority, *embedded.Server) {
		t.Helper()
		auth, err := embedded.LoadAuthority(authDir)
		if err != nil {
			t.Fatal(err)
		}
		if err := auth.AddRun("r"); err != nil {
			t.Fatal(err)
		}
		trust, err := auth.Trust()
		if err != nil {
			t.Fatal(err)
		}
		s, err := embedded.Start(ctx, embedded.Config{Dir: storeDir, Trust: trust})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Shutdown)
		return auth, s
	}
	auth, s := start()
	creds, user, err := auth.MemberCreds("r", "sandbox.sb1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "sb1.creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	if nc, _, _ := connectCreds(t, s, path); !nc.IsConnected() {
		t.Fatal("the sandbox is not connected before its revocation")
	}
	if err := auth.Revoke("r", user); err != nil {
		t.Fatal(err)
	}
	if err := auth.Revoke("r", "not-a-key"); !errors.Is(err, embedded.ErrInvalidConfig) {
		t.Errorf("revoking a non-key: %v, want ErrInvalidConfig", err)
	}
	s.Shutdown()

	auth, s = start()
	if nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: s.ClientURL(), CredsFile: path}, nats.NoReconnect()); err == nil {
		nc.Close()
		t.Error("a sandbox JWT revoked before the restart connected after it")
	} else if !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		t.Errorf("connect with a revoked JWT after a restart: %v, want an authorization error", err)
	}
	fresh := memberCreds(t, auth, "sandbox.sb2")
	if nc, _, _ := connectCreds(t, s, fresh); !nc.IsConnected() {
		t.Error("a sandbox minted after the restart is not connected")
	}

	// An account JWT in the dir that is not this authority's is refused, not ignored.
	if err := os.WriteFile(embedded.AccountJWTFile(embedded.RunDir(authDir, "r")), []byte("not a jwt\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := embedded.LoadAuthority(authDir); err == nil {
		t.Error("LoadAuthority read a corrupt account JWT without an error")
	}
}

// TestSandboxJWTRenewedOnReconnect: a sandbox's connection takes the JWT its
// creds file holds at each connect, so when its first JWT expires the server
// cuts it off and it comes back with the renewed one written meanwhile.
func TestSandboxJWTRenewedOnReconnect(t *testing.T) {
	auth, _, s, _ := operatorServer(t)
	ctx := testContext(t)
	signerFile := filepath.Join(t.TempDir(), "sandbox-signer.json")
	if err := auth.WriteSigner("r", events.KindSandbox, signerFile); err != nil {
		t.Fatal(err)
	}
	signer, err := embedded.LoadSigner(signerFile)
	if err != nil {
		t.Fatal(err)
	}
	short, _, err := signer.Mint("r", "sb1", 2*time.Second, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "nats.creds")
	if err := os.WriteFile(path, short, 0o600); err != nil {
		t.Fatal(err)
	}
	reconnected := make(chan struct{}, 1)
	nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: s.ClientURL(), CredsFile: path},
		nats.ReconnectHandler(func(*nats.Conn) {
			select {
			case reconnected <- struct{}{}:
			default:
			}
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	renewed, _, err := signer.Mint("r", "sb1", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, renewed, 0o600); err != nil {
		t.Fatal(err)
	}
	select {
	case <-reconnected:
	case <-ctx.Done():
		t.Fatal("the sandbox did not come back after its first JWT expired")
	}
	js, err := natsjs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "$KV.sp_daemons.r.sandbox.sb1", []byte("{}")); err != nil {
		t.Errorf("heartbeating with the renewed JWT: %v", err)
	}
}

// TestRecordsOfTheirOwn: an agent with its own user makes no stream, its own records store
// included, and asks for no other's; it writes its records to a store of its own name, which
// the bridge made when it asked, and reads them back; another agent and an owner cannot overwrite, delete, purge or
// recreate that store's objects, nor write the shared store, and nothing of theirs reaches
// either; records an earlier run left in the shared store stay readable; the bridge releases
// the agent's objects and cannot purge the audit log.
func TestRecordsOfTheirOwn(t *testing.T) {
	auth, dir, s, bus := operatorServer(t)
	ctx := testContext(t)
	const a1 events.Member = "agent.a1"
	recs := []events.Record{{Key: "r1-a1", Data: []byte(`{"n":1}`)}}

	// Records of an earlier run in the shared store, as every member wrote them before.
	old, err := member.WriteRecords(ctx, bus.Records, "r", "c0", a1, recs)
	if err != nil {
		t.Fatal(err)
	}
	if err := member.CreateManifest(ctx, bus.Manifests, old); err != nil {
		t.Fatal(err)
	}

	// The bridge makes the members' own stores when they ask.
	_, sjs, _ := connectCreds(t, s, embedded.CredsFile(dir, embedded.RoleBridge))
	sbus, err := jetstream.Open(ctx, sjs)
	if err != nil {
		t.Fatal(err)
	}
	stopStores, err := jetstream.ServeStores(ctx, sjs, sbus, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer stopStores()
	anc, ajs, aerrs := connectCreds(t, s, memberCreds(t, auth, a1))
	abus, err := jetstream.Open(ctx, ajs)
	if err != nil {
		t.Fatal(err)
	}
	// It makes no stream itself, its own store included: the create subject names the
	// stream, not its subjects (issue 29, attack 9: a store on another's service subjects).
	if err := anc.PublishRequest("$JS.API.STREAM.CREATE.OBJ_"+events.RecordsBucket("r", a1), anc.NewRespInbox(),
		[]byte(`{"name":"OBJ_`+events.RecordsBucket("r", a1)+`","subjects":["spsvc.r.owner.>"]}`)); err != nil {
		t.Fatal(err)
	}
	violation(t, aerrs, "agent a1 making a stream", "$JS.API.STREAM.CREATE.OBJ_"+events.RecordsBucket("r", a1))
	if err := anc.PublishRequest(jetstream.StoreRequestSubject("r", "agent.a2"), anc.NewRespInbox(), nil); err != nil {
		t.Fatal(err)
	}
	violation(t, aerrs, "agent a1 asking for a2's store", jetstream.StoreRequestSubject("r", "agent.a2"))
	store, err := member.OwnRecords(ctx, ajs, "r", a1)
	if err != nil {
		t.Fatalf("agent making its own records store: %v", err)
	}
	man, err := member.WriteRecords(ctx, store, "r", "c1", a1, recs)
	if err != nil {
		t.Fatalf("agent writing its own records: %v", err)
	}
	if want := events.RecordsBucket("r", a1); man.Bucket != want {
		t.Errorf("manifest bucket %q, want %q", man.Bucket, want)
	}
	// Its commit ack is the manifest's record (PROTOCOL §5, commit): published as itself.
	ack, err := events.Marshal(a1, events.CommitAck{AckHeader: events.AckHeader{Run: "r", Member: a1, Seq: 5, CheckpointID: "c1", OK: true,
		State: events.StateCommitted}, Manifest: &man})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jetstream.PublishOnce(ctx, ajs, ack); err != nil {
		t.Fatalf("agent acking its commit: %v", err)
	}
	for id, seq := range map[string]uint64{"c0": 0, "c1": 5} {
		if _, got, err := member.ReadRecordsAt(ctx, abus, "r", id, a1, seq, nil); err != nil || len(got) != 1 {
			t.Errorf("agent reading its records of %s: %d records, %v", id, len(got), err)
		}
	}
	noViolations(t, anc, aerrs, "agent a1")

	own := events.RecordsBucket("r", a1)
	ownStream, err := ajs.Stream(ctx, "OBJ_"+own)
	if err != nil {
		t.Fatal(err)
	}
	before, err := ownStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sharedBefore, err := bus.Records.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	meta := "$O." + own + ".M." + base64.URLEncoding.EncodeToString([]byte(man.Object))
	for _, m := range []events.Member{"agent.a2", "owner.o1"} {
		nc, _, errs := connectCreds(t, s, memberCreds(t, auth, m))
		c := struct {
			nc   *nats.Conn
			errs chan error
		}{nc, errs}
		for _, tc := range []struct{ what, subject, data string }{
			{"overwriting or deleting another's records object", meta, `{"name":"x","deleted":true}`},
			{"writing chunks into another's records store", "$O." + own + ".C.forged", "x"},
			{"purging another's records store", "$JS.API.STREAM.PURGE.OBJ_" + own, "{}"},
			{"deleting another's records store", "$JS.API.STREAM.DELETE.OBJ_" + own, ""},
			{"making another's records store", "$JS.API.STREAM.CREATE.OBJ_" + own, "{}"},
			{"deleting a message of another's records store", "$JS.API.STREAM.MSG.DELETE.OBJ_" + own, `{"seq":1}`},
			{"deleting a reader of another's records store", "$JS.API.CONSUMER.DELETE.OBJ_" + own + ".x", ""},
			{"overwriting or deleting a records object of the shared store", "$O.sp_records.M." + base64.URLEncoding.EncodeToString([]byte(old.Object)), `{"deleted":true}`},
			{"writing chunks into the shared store", "$O.sp_records.C.forged", "x"},
			{"purging the shared store", "$JS.API.STREAM.PURGE.OBJ_sp_records", "{}"},
		} {
			if err := c.nc.PublishRequest(tc.subject, c.nc.NewRespInbox(), []byte(tc.data)); err != nil {
				t.Fatal(err)
			}
			violation(t, c.errs, string(m)+" "+tc.what, tc.subject)
		}
	}
	after, err := ownStream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.State.Msgs != before.State.Msgs || after.State.LastSeq != before.State.LastSeq {
		t.Errorf("the agent's store went from %d messages (last %d) to %d (last %d)", before.State.Msgs,
			before.State.LastSeq, after.State.Msgs, after.State.LastSeq)
	}
	sharedAfter, err := bus.Records.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sharedAfter.Size() != sharedBefore.Size() {
		t.Errorf("the shared store went from %d bytes to %d", sharedBefore.Size(), sharedAfter.Size())
	}
	for id, seq := range map[string]uint64{"c0": 0, "c1": 5} {
		if _, got, err := member.ReadRecordsAt(ctx, bus, "r", id, a1, seq, nil); err != nil || len(got) != 1 {
			t.Errorf("the records of %s after the attempts: %d records, %v", id, len(got), err)
		}
	}

	// The bridge releases them; it purges no stream but the records stores.
	bnc, bjs, berrs := connectCreds(t, s, embedded.CredsFile(dir, embedded.RoleBridge))
	stores, err := jetstream.RecordStores(ctx, bjs, events.RecordsBucketPrefix("r"))
	if err != nil || len(stores) != 1 {
		t.Fatalf("bridge listing the run's records stores: %d, %v; want the agent's", len(stores), err)
	}
	if err := stores[0].Delete(ctx, man.Object); err != nil {
		t.Errorf("bridge releasing the agent's records: %v", err)
	}
	if _, _, err := member.ReadRecordsAt(ctx, bus, "r", "c1", a1, 5, nil); !errors.Is(err, member.ErrCorruptRecords) {
		t.Errorf("the released records: %v, want them gone", err)
	}
	noViolationsBefore(t, bnc, berrs, "bridge", "sp.r.ack.1.prepare.agent.a1")
	for _, api := range []string{"$JS.API.STREAM.PURGE.STILLPOINT", "$JS.API.STREAM.PURGE.KV_sp_members",
		"$JS.API.STREAM.PURGE.KV_sp_manifests", "$JS.API.STREAM.DELETE.OBJ_" + own} {
		if err := bnc.PublishRequest(api, bnc.NewRespInbox(), []byte("{}")); err != nil {
			t.Fatal(err)
		}
		violation(t, berrs, "bridge calling "+api, api)
	}
}
