package embedded_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
)

func TestRoleUsersSeedFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "auth")
	users, err := embedded.RoleUsers(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(dir); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("auth dir: %v, mode %v, want 0700", err, st.Mode().Perm())
	}
	if len(users) != len(embedded.Roles()) {
		t.Fatalf("%d users, want one per role (%d)", len(users), len(embedded.Roles()))
	}
	for i, role := range embedded.Roles() {
		u := users[i]
		if u.Name != string(role) || !strings.HasPrefix(u.NKey, "U") {
			t.Errorf("user %d: name %q nkey %q, want %s with a user nkey", i, u.Name, u.NKey, role)
		}
		want, err := embedded.RolePermissions(role, "")
		if err != nil || !reflect.DeepEqual(u.Permissions, want) {
			t.Errorf("%s: permissions %+v, want RolePermissions' %+v (%v)", role, u.Permissions, want, err)
		}
		st, err := os.Stat(embedded.SeedFile(dir, role))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: seed file mode %v, want 0600", role, st.Mode().Perm())
		}
		if b, _ := os.ReadFile(embedded.SeedFile(dir, role)); !strings.HasPrefix(string(b), "SU") {
			t.Errorf("%s: seed file does not hold a user seed", role)
		}
	}
	if users[len(users)-1].Permissions != nil {
		t.Errorf("admin has permissions %+v, want none (everything)", users[len(users)-1].Permissions)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, ".seed-*")); len(files) != 0 {
		t.Errorf("temporary files left: %v", files)
	}

	again, err := embedded.RoleUsers(dir, "")
	if err != nil {
		t.Fatal(err)
	}
	for i := range users {
		if again[i].NKey != users[i].NKey {
			t.Errorf("%s: a second RoleUsers made a new key, want the seed file's", users[i].Name)
		}
	}

	if err := os.WriteFile(embedded.SeedFile(dir, embedded.RoleOwner), []byte("not a seed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := embedded.RoleUsers(dir, ""); err == nil || !strings.Contains(err.Error(), "owner.nk") {
		t.Errorf("RoleUsers with a broken seed file: %v, want an error naming owner.nk", err)
	}
}

func TestRoleConfigErrors(t *testing.T) {
	if _, err := embedded.RolePermissions("wizard", ""); !errors.Is(err, embedded.ErrInvalidConfig) {
		t.Errorf("unknown role: %v, want ErrInvalidConfig", err)
	}
	if _, err := embedded.RolePermissions(embedded.RoleAgent, "a.b"); !errors.Is(err, embedded.ErrInvalidConfig) {
		t.Errorf("run with a dot: %v, want ErrInvalidConfig", err)
	}
	users, err := embedded.RoleUsers(t.TempDir(), "")
	if err != nil {
		t.Fatal(err)
	}
	ctx := testContext(t)
	_, err = embedded.Start(ctx, embedded.Config{Dir: t.TempDir(), Token: "t", Users: users})
	if !errors.Is(err, embedded.ErrInvalidConfig) || !strings.Contains(err.Error(), "Config.Users and Token") {
		t.Errorf("Start with Token and Users: %v", err)
	}
	bad := append([]embedded.User{{Name: "x", NKey: "SUAB"}}, users[0])
	_, err = embedded.StartCluster(ctx, embedded.ClusterConfig{Dir: t.TempDir(), Users: append(bad, users[0])})
	if !errors.Is(err, embedded.ErrInvalidConfig) || !strings.Contains(err.Error(), "ClusterConfig.Users[0] (x)") ||
		!strings.Contains(err.Error(), "also user bridge's") {
		t.Errorf("StartCluster with a bad and a repeated nkey: %v", err)
	}
}

// roleServer starts a server admitting the role users of run (all runs for ""), provisions the
// bus as admin, and returns the seed dir, the server and the admin's bus.
func roleServer(t *testing.T, run string) (string, *embedded.Server, *jetstream.Bus) {
	t.Helper()
	ctx := testContext(t)
	dir := t.TempDir()
	users, err := embedded.RoleUsers(dir, run)
	if err != nil {
		t.Fatal(err)
	}
	s, err := embedded.Start(ctx, embedded.Config{Dir: t.TempDir(), Users: users})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	if nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: s.ClientURL()}); err == nil {
		nc.Close()
		t.Fatal("connect without an nkey: got nil error")
	}
	_, js, _ := connectAs(t, s, dir, embedded.RoleAdmin)
	bus, err := jetstream.Provision(ctx, js, jetstream.Topology{})
	if err != nil {
		t.Fatal(err)
	}
	return dir, s, bus
}

// connectAs connects with role's seed; the channel gets the connection's async errors
// (permission violations).
func connectAs(t *testing.T, s *embedded.Server, dir string, role embedded.Role) (*nats.Conn, natsjs.JetStream, chan error) {
	t.Helper()
	errs := make(chan error, 16)
	nc, err := jetstream.Connect(testContext(t), jetstream.ConnConfig{URL: s.ClientURL(), NKeyFile: embedded.SeedFile(dir, role), Name: string(role)},
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case errs <- err:
			default:
			}
		}))
	if err != nil {
		t.Fatalf("connect as %s: %v", role, err)
	}
	t.Cleanup(nc.Close)
	js, err := natsjs.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js, errs
}

// violation waits for the server's permissions violation naming subject.
func violation(t *testing.T, errs chan error, what, subject string) {
	t.Helper()
	timeout := time.After(5 * time.Second)
	for {
		select {
		case err := <-errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+subject+`"`) {
				return
			}
			t.Logf("other async error: %v", err)
		case <-timeout:
			t.Errorf("%s: no permissions violation for %s within 5 s", what, subject)
			return
		}
	}
}

// TestRolesOnTheBus publishes as each role to the subjects PROTOCOL §3 gives to one role: the
// owner gets a stream (or KV, object store) ack, anyone else a permissions violation from the
// server, and nothing reaches the stream.
func TestRolesOnTheBus(t *testing.T) {
	dir, s, bus := roleServer(t, "")
	type conn struct {
		nc   *nats.Conn
		js   natsjs.JetStream
		errs chan error
	}
	conns := map[embedded.Role]conn{}
	for _, role := range embedded.Roles() {
		nc, js, errs := connectAs(t, s, dir, role)
		conns[role] = conn{nc, js, errs}
	}
	const (
		B, A, O, S, C, Adm = embedded.RoleBridge, embedded.RoleAgent, embedded.RoleOwner, embedded.RoleSandbox, embedded.RoleController, embedded.RoleAdmin
	)
	for _, tc := range []struct {
		role    embedded.Role
		subject string
		allowed bool
	}{
		{A, "sp.r.phase.prepare", false},
		{B, "sp.r.phase.prepare", true},
		{A, "sp.r.outcome.checkpoint.committed", false},
		{O, "sp.r.outcome.checkpoint.failed", false},
		{B, "sp.r.outcome.checkpoint.committed", true},
		{S, "sp.r.ack.1.prepare.agent.a1", false},
		{S, "sp.r.ack.1.prepare.sandbox.s1", false}, // its acks travel on core NATS
		{B, "sp.r.ack.1.commit.sandbox.s1", true},   // the bridge's record of one
		{A, "spl.r.ack.1.prepare.sandbox.s1", false},
		{B, "sp.r.prepared.1.1", true},
		{S, "sp.r.prepared.1.1", false},
		{A, "sp.r.ack.1.prepare.agent.a1", true},
		{A, "sp.r.ack.1.commit.owner.o1", false},
		{O, "sp.r.ack.1.commit.owner.o1", true},
		{B, "sp.r.ack.2.prepare.agent.a1", false},
		{C, "sp.r.ack.2.prepare.agent.a2", false},
		{O, "sp.r.member.agent.a1", false},
		{A, "sp.r.member.agent.a1", true},
		{S, "sp.r.member.sandbox.s1", false}, // a sandbox daemon announces nothing
		{S, "$KV.sp_members.r.agent.a1", false},
		{S, "$KV.sp_members.r.sandbox.s1", false}, // its heartbeat is in sp_daemons
		{S, "$KV.sp_daemons.r.sandbox.s1", true},
		{S, "$KV.sp_daemons.r.agent.a1", false},
		{O, "$KV.sp_members.r.sandbox.s2", false},
		{O, "$KV.sp_daemons.r.sandbox.s2", true},
		{A, "$KV.sp_members.r.agent.a1", true},
		{A, "$KV.sp_manifests.r.c1", false},
		{A, "$KV.sp_manifests.r.LATEST", false},
		{A, "$KV.sp_manifests.r.c1.owner.o1", false},
		{A, "$KV.sp_manifests.r.c1.agent.a1", false}, // the commit ack records it (PROTOCOL-HISTORY §35)
		{S, "$KV.sp_manifests.r.c1.sandbox.s1", false},
		{B, "$O.sp_checkpoints.C.z", true},
		{B, "$KV.sp_manifests.r.c1", true},
		{B, "$KV.sp_manifests.r.LATEST", true},
		{A, "$KV.sp_snapshots.snap1", false},
		{O, "$KV.sp_snapshots.snap1", true},
		{S, "$O.sp_records.C.x", false},
		{A, "$O.sp_records.C.x", true},
		{C, "$O.sp_records.C.y", false},
		{Adm, "sp.r.phase.commit", true},
	} {
		c := conns[tc.role]
		what := string(tc.role) + " publishing " + tc.subject
		if tc.allowed {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			if _, err := c.js.Publish(ctx, tc.subject, []byte("x")); err != nil {
				t.Errorf("%s: %v, want a stream ack", what, err)
			}
			cancel()
			continue
		}
		if err := c.nc.Publish(tc.subject, []byte("x")); err != nil {
			t.Fatal(err)
		}
		violation(t, c.errs, what, tc.subject)
	}
	// What was refused never reached a stream: the phase, for one.
	ctx := testContext(t)
	if _, err := bus.Stream.GetLastMsgForSubject(ctx, "sp.r.phase.prepare"); err != nil {
		t.Fatalf("the bridge's phase: %v", err)
	}
	info, err := bus.Stream.Info(ctx, natsjs.WithSubjectFilter("sp.>"))
	if err != nil {
		t.Fatal(err)
	}
	for subj := range info.State.Subjects {
		switch subj {
		case "sp.r.phase.prepare", "sp.r.phase.commit", "sp.r.outcome.checkpoint.committed", "sp.r.ack.1.commit.sandbox.s1", "sp.r.prepared.1.1",
			"sp.r.ack.1.prepare.agent.a1", "sp.r.ack.1.commit.owner.o1", "sp.r.member.agent.a1":
		default:
			t.Errorf("the stream holds %s, which no role may publish", subj)
		}
	}
	if info.State.Msgs != 8 {
		t.Errorf("the stream holds %d messages, want the 8 allowed", info.State.Msgs)
	}
	if _, err := bus.Manifests.Get(ctx, "r.c1.owner.o1"); !errors.Is(err, natsjs.ErrKeyNotFound) {
		t.Errorf("the owner manifest an agent wrote: %v, want not found", err)
	}

	// The JetStream API: no role but admin removes or changes the audit log.
	for _, role := range []embedded.Role{B, A, O, S, C} {
		for _, api := range []string{"$JS.API.STREAM.DELETE.STILLPOINT", "$JS.API.STREAM.PURGE.STILLPOINT",
			"$JS.API.STREAM.MSG.DELETE.STILLPOINT", "$JS.API.STREAM.UPDATE.STILLPOINT", "$JS.API.STREAM.CREATE.OTHER"} {
			c := conns[role]
			if err := c.nc.PublishRequest(api, c.nc.NewRespInbox(), []byte("{}")); err != nil {
				t.Fatal(err)
			}
			violation(t, c.errs, string(role)+" calling "+api, api)
		}
	}
	if info, err := bus.Stream.Info(ctx); err != nil || info.State.Msgs != 8 {
		t.Errorf("stream after the refused calls: %v, %+v", err, info)
	}

	// Subscriptions: a role serves only its own kind's services and reads the stream through
	// JetStream, not core subscriptions (but an agent's to its sandboxes' prepare acks, and a
	// sandbox's to its run's phases as the stream republishes them and its committed outcomes,
	// its core feed).
	for _, subject := range []string{"spl.r.phase.>", "sp.r.outcome.checkpoint.committed"} {
		if _, err := conns[S].nc.SubscribeSync(subject); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		role    embedded.Role
		subject string
	}{
		{S, "spsvc.r.owner.o1.seed_session"},
		{S, "spsvc.r.agent.a1.run"},
		{A, "spsvc.r.owner.o1.>"},
		{O, "spsvc.r.sandbox.*.launch"},
		{A, "sp.r.phase.>"},
		{S, "sp.r.phase.>"},
		{S, "sp.r.ack.>"},
		{S, "sp.r.outcome.>"},
		{C, "sp.>"},
	} {
		c := conns[tc.role]
		if _, err := c.nc.SubscribeSync(tc.subject); err != nil {
			t.Fatal(err)
		}
		violation(t, c.errs, string(tc.role)+" subscribing to "+tc.subject, tc.subject)
	}
}

// TestRolesOfOneRun: with a run, the member roles speak only in that run.
func TestRolesOfOneRun(t *testing.T) {
	dir, s, _ := roleServer(t, "r")
	nc, js, errs := connectAs(t, s, dir, embedded.RoleAgent)
	ctx := testContext(t)
	if _, err := js.Publish(ctx, "sp.r.ack.1.prepare.agent.a1", nil); err != nil {
		t.Errorf("agent acking in its run: %v", err)
	}
	if err := nc.Publish("sp.other.ack.1.prepare.agent.a1", nil); err != nil {
		t.Fatal(err)
	}
	violation(t, errs, "agent acking in another run", "sp.other.ack.1.prepare.agent.a1")
}

// TestRolesServe: a sandbox serves its micro service, an agent calls it, the controller may
// not (it calls agents only), and micro's discovery works for the controller.
func TestRolesServe(t *testing.T) {
	dir, s, _ := roleServer(t, "")
	snc, _, serrs := connectAs(t, s, dir, embedded.RoleSandbox)
	svc, err := jetstream.NewService(snc, micro.Config{Name: events.ServiceName(events.KindSandbox), Version: "1.0.0"}, "spsvc.r.sandbox.s1",
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
	ctx := testContext(t)
	anc, _, aerrs := connectAs(t, s, dir, embedded.RoleAgent)
	var out string
	if err := jetstream.Call(ctx, anc, "spsvc.r.sandbox.s1.echo", "hi", &out); err != nil || out != `"hi"` {
		t.Errorf("agent calling the sandbox: %q, %v", out, err)
	}
	cnc, _, cerrs := connectAs(t, s, dir, embedded.RoleController)
	if err := cnc.Publish("spsvc.r.sandbox.s1.echo", nil); err != nil {
		t.Fatal(err)
	}
	violation(t, cerrs, "controller calling a sandbox", "spsvc.r.sandbox.s1.echo")
	msg, err := cnc.Request("$SRV.PING.stillpoint-sandboxd", nil, 5*time.Second)
	if err != nil || !strings.Contains(string(msg.Data), "stillpoint-sandboxd") {
		t.Errorf("controller pinging the service: %v", err)
	}

	// An agent serves rollouts to the controller, and hears its sandboxes' prepare acks.
	asvc, err := jetstream.NewService(anc, micro.Config{Name: events.ServiceName(events.KindAgent), Version: "1.0.0"}, "spsvc.r.agent.a1",
		func(error) (int, string) { return 500, "internal" })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = asvc.Stop() })
	if err := asvc.Handle("run", func(body []byte) (any, error) { return "ran", nil }); err != nil {
		t.Fatal(err)
	}
	if err := anc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := jetstream.Call(ctx, cnc, "spsvc.r.agent.a1.run", "r1", &out); err != nil || out != "ran" {
		t.Errorf("controller calling the agent: %q, %v", out, err)
	}
	// A sandbox daemon's prepare ack travels on core NATS (events.LiveAck).
	acks, err := anc.SubscribeSync("spl.r.ack.*.prepare.sandbox.*")
	if err != nil {
		t.Fatal(err)
	}
	if err := anc.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := snc.Publish("spl.r.ack.7.prepare.sandbox.s1", []byte("ack")); err != nil {
		t.Fatal(err)
	}
	if m, err := acks.NextMsg(5 * time.Second); err != nil || m.Subject != "spl.r.ack.7.prepare.sandbox.s1" {
		t.Errorf("the agent hearing a sandbox's prepare ack: %v %v", m, err)
	}
	noViolations(t, snc, serrs, "sandbox")
	noViolations(t, anc, aerrs, "agent")
}

// noViolations checks that nc got no async error so far: it makes a
// permissions violation on purpose (a phase, which only the bridge
// publishes) and, nats.go calling a connection's error handler in order,
// fails the test on any error that comes before that one.
func noViolations(t *testing.T, nc *nats.Conn, errs chan error, who string) {
	t.Helper()
	noViolationsBefore(t, nc, errs, who, "sp.r.phase.prepare")
}

// noViolationsBefore is noViolations with marker, a subject who may not publish to.
func noViolationsBefore(t *testing.T, nc *nats.Conn, errs chan error, who, marker string) {
	t.Helper()
	if err := nc.Publish(marker, nil); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(5 * time.Second)
	for {
		select {
		case err := <-errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), `"`+marker+`"`) {
				return
			}
			t.Errorf("%s: %v", who, err)
		case <-timeout:
			t.Errorf("%s: no permissions violation for the marker %s within 5 s", who, marker)
			return
		}
	}
}
