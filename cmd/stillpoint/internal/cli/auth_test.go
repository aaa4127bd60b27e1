package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/client"
	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// startCommand runs a command's run function until the test ends and
// returns the first match of re in its stdout.
func startCommand(t *testing.T, what string, re *regexp.Regexp, run func(ctx context.Context, g *globals) error, conn jetstream.ConnConfig) string {
	t.Helper()
	stdout, stderr := &jstest.Buffer{}, &jstest.Buffer{}
	g := &globals{stdout: stdout, stderr: stderr, logLevel: "warn", logFormat: "json", conn: conn}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, g) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s returned %v\n%s", what, err, stderr.String())
			}
		case <-time.After(30 * time.Second):
			t.Errorf("%s did not stop", what)
		}
		if t.Failed() {
			t.Logf("--- %s stdout:\n%s\n--- %s stderr:\n%s", what, stdout.String(), what, stderr.String())
		}
	})
	var m []string
	poll.Wait(t, 30*time.Second, what+" to be ready", func() bool {
		if m = re.FindStringSubmatch(stdout.String()); m != nil {
			return true
		}
		select {
		case err := <-done:
			t.Fatalf("%s exited early: %v\n%s", what, err, stderr.String())
		default:
		}
		return false
	})
	return m[1]
}

// TestServerAuthDir runs `stillpoint server --auth-dir --nkeys` (one node and a
// cluster): it writes a seed per role, admits no one else, provisions the
// bus as admin; an agent cannot publish a phase, and `stillpoint bridge`
// with the bridge's nkey checkpoints members connected as agents.
func TestServerAuthDir(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		name := "single"
		if cluster {
			name = "cluster"
		}
		t.Run(name, func(t *testing.T) {
			auth, store := filepath.Join(t.TempDir(), "auth"), t.TempDir()
			serve := func(ctx context.Context, g *globals) error {
				return runServer(ctx, g, serverFlags{dir: store, listen: "127.0.0.1:0", cluster: cluster, authDir: auth, nkeys: true})
			}
			url := startCommand(t, "server", readyRE, serve, jetstream.ConnConfig{})
			seeds := map[embedded.Role][]byte{}
			for _, role := range embedded.Roles() {
				b, err := os.ReadFile(embedded.SeedFile(auth, role))
				if err != nil || !bytes.HasPrefix(b, []byte("SU")) {
					t.Fatalf("%s seed: %v %q", role, err, b)
				}
				seeds[role] = b
			}
			ctx := t.Context()
			if nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: url}); err == nil {
				nc.Close()
				t.Fatal("a client without an nkey was admitted")
			}
			conn := func(role embedded.Role) jetstream.ConnConfig {
				return jetstream.ConnConfig{URL: url, NKeyFile: embedded.SeedFile(auth, role), Name: string(role)}
			}
			admin, err := jetstream.Connect(ctx, conn(embedded.RoleAdmin))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(admin.Close)
			ajs, _ := natsjs.New(admin)
			bus, err := jetstream.Open(ctx, ajs)
			if err != nil {
				t.Fatalf("the bus is not provisioned: %v", err)
			}

			violations := make(chan error, 4)
			agent, err := jetstream.Connect(ctx, conn(embedded.RoleAgent), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				violations <- err
			}))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(agent.Close)
			if err := agent.Publish("sp.r.phase.prepare", []byte("{}")); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-violations:
				if !errors.Is(err, nats.ErrPermissionViolation) {
					t.Errorf("agent publishing a phase: %v, want a permissions violation", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("agent publishing a phase: no permissions violation")
			}
			if _, err := bus.Stream.GetLastMsgForSubject(ctx, "sp.r.phase.prepare"); !errors.Is(err, natsjs.ErrMsgNotFound) {
				t.Errorf("the agent's phase reached the stream: %v", err)
			}

			// The bridge command under its role, members under theirs.
			tokenFile := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			api := startCommand(t, "bridge", regexp.MustCompile(`serving on (http://\S+)`), func(ctx context.Context, g *globals) error {
				return runBridge(ctx, g, bridgeFlags{run: "r1", name: "main", listen: "127.0.0.1:0", tokenFile: tokenFile, timeout: 10 * time.Second, replicas: 1})
			}, conn(embedded.RoleBridge))
			env := &jstest.Env{URL: url, Conn: admin, JS: ajs, Bus: bus, AuthDir: auth}
			membertest.StartMembers(t, env.As(embedded.RoleAgent), "r1", 2, membertest.Options{Episodes: 1})
			c, err := client.New(api, "s3cret")
			if err != nil {
				t.Fatal(err)
			}
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			if res, err := c.Checkpoint(cctx, bridgeapi.CheckpointRequest{ID: "c1"}); err != nil || res.Status != bridgeapi.StatusCommitted {
				t.Fatalf("checkpoint through the bridge command: %+v %v", res, err)
			}

			if cluster {
				return
			}
			// A server started again on the same dir admits the same keys.
			t.Run("restart", func(t *testing.T) {
				startCommand(t, "second server", readyRE, func(ctx context.Context, g *globals) error {
					return runServer(ctx, g, serverFlags{dir: t.TempDir(), listen: "127.0.0.1:0", authDir: auth, nkeys: true})
				}, jetstream.ConnConfig{})
				for role, b := range seeds {
					if now, _ := os.ReadFile(embedded.SeedFile(auth, role)); !bytes.Equal(now, b) {
						t.Errorf("%s: the seed changed", role)
					}
				}
			})
		})
	}
}

func TestServerAuthDirAndTokenConflict(t *testing.T) {
	g := &globals{stdout: &jstest.Buffer{}, stderr: &jstest.Buffer{}, logLevel: "warn", logFormat: "json"}
	err := runServer(t.Context(), g, serverFlags{dir: t.TempDir(), listen: "127.0.0.1:0", authDir: t.TempDir(), token: "t"})
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != ExitUsage || !strings.Contains(err.Error(), "--auth-dir and --auth-token") {
		t.Errorf("runServer with both: %v, want a usage error naming both", err)
	}
}

// TestRolesCheckpointRestoreRelease runs the bridge and members of every
// kind, each connected with its own role: checkpoints, a restore into a
// fresh fleet and releases all work, and the controller reads the timeline.
func TestRolesCheckpointRestoreRelease(t *testing.T) {
	env := jstest.Start(t, jstest.WithRoles())
	const run = "r1"
	fleet := func() []*membertest.Handle {
		hs := membertest.StartMembers(t, env.As(embedded.RoleAgent), run, 2, membertest.Options{Episodes: 2})
		hs = append(hs, membertest.StartMembers(t, env.As(embedded.RoleOwner), run, 1, membertest.Options{Kind: events.KindOwner, Prefix: "o", Episodes: 1})...)
		return append(hs, membertest.StartMembers(t, env.As(embedded.RoleSandbox), run, 1, membertest.Options{Kind: events.KindSandbox, Prefix: "s",
			StateFile: filepath.Join(t.TempDir(), "sandboxd.state")})...)
	}
	old := fleet()
	nc, js := env.As(embedded.RoleBridge).Connect(t)
	bus, err := jetstream.Open(t.Context(), js)
	if err != nil {
		t.Fatal(err)
	}
	b, err := bridge.New(bridge.Config{Run: run, Name: "main", JS: js, Bus: bus, Conn: nc, PhaseTimeout: 10 * time.Second,
		Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)})
	if err != nil {
		t.Fatal(err)
	}
	bctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- b.Run(bctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("bridge Run: %v", err)
		}
	})
	ctx, cancelCtx := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancelCtx()

	if res, err := b.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: "c1"}); err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c1: %+v %v", res, err)
	}
	res, err := b.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: "c2", Stop: true})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c2: %+v %v", res, err)
	}
	if len(res.Members) != 4 {
		t.Errorf("c2 had members %v, want 2 agents, an owner and a sandbox", res.Members)
	}
	// A fresh fleet restores it, as after a crash.
	for _, h := range old {
		_ = h.Stop()
	}
	fleet()
	rr, err := b.Restore(ctx, bridgeapi.RestoreRequest{ID: "restore-1", Source: "c2"})
	if err != nil || rr.Status != bridgeapi.StatusCompleted || len(rr.Restored) != 5 {
		t.Fatalf("restore: %+v %v", rr, err)
	}
	if res, err := b.Checkpoint(ctx, bridgeapi.CheckpointRequest{ID: "c3"}); err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c3: %+v %v", res, err)
	}
	if op, err := b.Release(ctx, bridgeapi.ReleaseRequest{KeepLatest: 1}); err != nil || op.Status != bridgeapi.StatusCompleted {
		t.Fatalf("release: %+v %v", op, err)
	}

	_, cjs := env.As(embedded.RoleController).Connect(t)
	entries, err := timeline.Read(ctx, cjs, run, "")
	if err != nil || len(entries) == 0 {
		t.Fatalf("timeline as the controller: %d entries, %v", len(entries), err)
	}
}

// TestServerOperatorMode runs `stillpoint server --auth-dir --runs r1` (one
// node and a cluster): it writes r1's roles' creds,
// admits no one else, provisions r1's bus in its account as its admin; `stillpoint creds` mints
// agents and an owner users of their own, with which they take part in a
// checkpoint through `stillpoint bridge` without one permissions
// violation (and another once an agent's consumer was deleted under it),
// and an agent's user cannot ack as another agent.
func TestServerOperatorMode(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		t.Run(map[bool]string{false: "single", true: "cluster"}[cluster], func(t *testing.T) {
			auth, store := filepath.Join(t.TempDir(), "auth"), t.TempDir()
			url := startCommand(t, "server", readyRE, func(ctx context.Context, g *globals) error {
				return runServer(ctx, g, serverFlags{dir: store, listen: "127.0.0.1:0", cluster: cluster, authDir: auth, runs: []string{"r1"}})
			}, jetstream.ConnConfig{})
			run := embedded.RunDir(auth, "r1")
			for _, f := range []string{embedded.CredsFile(run, embedded.RoleBridge), embedded.CredsFile(run, embedded.RoleController),
				embedded.CredsFile(run, embedded.RoleAdmin)} {
				if st, err := os.Stat(f); err != nil || st.Mode().Perm() != 0o600 {
					t.Fatalf("%s: %v, want a file of mode 0600", f, err)
				}
			}
			ctx := t.Context()
			if nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: url}, nats.NoReconnect()); err == nil {
				nc.Close()
				t.Fatal("a client without credentials was admitted")
			}
			admin, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: url, CredsFile: embedded.CredsFile(run, embedded.RoleAdmin)})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(admin.Close)
			ajs, _ := natsjs.New(admin)
			bus, err := jetstream.Open(ctx, ajs)
			if err != nil {
				t.Fatalf("the bus is not provisioned: %v", err)
			}
			mint := func(m events.Member) string {
				out := filepath.Join(t.TempDir(), "member.creds")
				g := &globals{stdout: &jstest.Buffer{}, stderr: &jstest.Buffer{}}
				if err := runCreds(g, credsFlags{authDir: auth, run: "r1", member: string(m), out: out}); err != nil {
					t.Fatalf("creds %s: %v", m, err)
				}
				return out
			}

			tokenFile := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			api := startCommand(t, "bridge", regexp.MustCompile(`serving on (http://\S+)`), func(ctx context.Context, g *globals) error {
				return runBridge(ctx, g, bridgeflagsForTest(tokenFile))
			}, jetstream.ConnConfig{URL: url, CredsFile: embedded.CredsFile(run, embedded.RoleBridge)})
			env := &jstest.Env{URL: url, Conn: admin, JS: ajs, Bus: bus}
			for _, m := range []events.Member{"agent.a1", "agent.a2", "owner.o1"} {
				p := membertest.NewParticipant(m.Name())
				p.Add(events.Episode{Rollout: m.Name() + "-r0"})
				membertest.StartMember(t, env.WithCreds(mint(m)), "r1", m, p, membertest.Options{})
			}
			c, err := client.New(api, "s3cret")
			if err != nil {
				t.Fatal(err)
			}
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			res, err := c.Checkpoint(cctx, bridgeapi.CheckpointRequest{ID: "c1"})
			if err != nil || res.Status != bridgeapi.StatusCommitted || len(res.Members) != 3 {
				t.Fatalf("checkpoint through the bridge command: %+v (failure %s) %v, want committed with 3 members", res, failure(res), err)
			}
			// Each agent kept its records in a store of its own name. The
			// manifests are read by direct gets, which any replica that is
			// current enough answers, before it may have applied the
			// commit's last writes (on the cluster): the read is repeated
			// until the replicas have them, and must then find them.
			for _, m := range []events.Member{"agent.a1", "agent.a2"} {
				var man events.MemberManifest
				var err error
				poll.Wait(t, 10*time.Second, "the replicas to have "+string(m)+"'s manifest of c1", func() bool {
					man, err = member.FindManifest(ctx, bus, "r1", "c1", m, 0)
					return err == nil || !errors.Is(err, member.ErrNoManifest)
				})
				if err != nil {
					t.Fatal(err)
				}
				if want := events.RecordsBucket("r1", m); man.Count == 0 || man.Bucket != want {
					t.Errorf("%s's manifest of c1: %d records in %q, want some in %q", m, man.Count, man.Bucket, want)
				}
			}
			// A live member's durable consumer deleted under it: the run
			// goes on, and the next checkpoint commits with every member.
			if err := bus.Stream.DeleteConsumer(ctx, "sp_r1_agent_a1"); err != nil {
				t.Fatal(err)
			}
			res, err = c.Checkpoint(cctx, bridgeapi.CheckpointRequest{ID: "c2"})
			if err != nil || res.Status != bridgeapi.StatusCommitted || len(res.Members) != 3 {
				t.Fatalf("checkpoint after a member's consumer was deleted: %+v (failure %s) %v, want committed with 3 members", res, failure(res), err)
			}

			violations := make(chan error, 4)
			agent, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: url, CredsFile: mint("agent.a3")},
				nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { violations <- err }))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(agent.Close)
			if err := agent.Publish("sp.r1.ack.1.prepare.agent.a1", []byte("{}")); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-violations:
				if !errors.Is(err, nats.ErrPermissionViolation) {
					t.Errorf("agent a3 acking as a1: %v, want a permissions violation", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("agent a3 acking as a1: no permissions violation")
			}
		})
	}
}

func bridgeflagsForTest(tokenFile string) bridgeFlags {
	return bridgeFlags{run: "r1", name: "main", listen: "127.0.0.1:0", tokenFile: tokenFile, timeout: 10 * time.Second, replicas: 1}
}

// TestRevokeOnARunningServer: a run added to the dir of a running `stillpoint server --auth-dir`
// (its first creds) is admitted and provisioned within seconds; `stillpoint creds --revoke`
// cuts a member's user off the server and it cannot connect again; a key that is not a user's is
// a usage error.
func TestRevokeOnARunningServer(t *testing.T) {
	auth := filepath.Join(t.TempDir(), "auth")
	url := startCommand(t, "server", readyRE, func(ctx context.Context, g *globals) error {
		return runServer(ctx, g, serverFlags{dir: t.TempDir(), listen: "127.0.0.1:0", authDir: auth})
	}, jetstream.ConnConfig{})
	a, err := embedded.LoadAuthority(auth)
	if err != nil {
		t.Fatal(err)
	}
	b, user, err := a.MemberCreds("r1", "agent.a1", 0)
	if err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(t.TempDir(), "a1.creds")
	if err := os.WriteFile(creds, b, 0o600); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	// r1 is a run the server did not know at its start: it picks its
	// account up from the dir and provisions its bus there.
	var nc *nats.Conn
	poll.Wait(t, 10*time.Second, "the server to admit a user of r1, a run added after its start", func() bool {
		nc, err = jetstream.Connect(ctx, jetstream.ConnConfig{URL: url, CredsFile: creds}, nats.NoReconnect())
		return err == nil
	})
	t.Cleanup(nc.Close)
	admin, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: url, CredsFile: embedded.CredsFile(embedded.RunDir(auth, "r1"), embedded.RoleAdmin)})
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	ajs, _ := natsjs.New(admin)
	poll.Wait(t, 10*time.Second, "r1's bus to be provisioned in its account", func() bool {
		_, err := jetstream.Open(ctx, ajs)
		return err == nil
	})
	g := &globals{stdout: &jstest.Buffer{}, stderr: &jstest.Buffer{}}
	if err := runCreds(g, credsFlags{authDir: auth, run: "r1", revoke: user}); err != nil {
		t.Fatalf("creds --revoke: %v", err)
	}
	poll.Wait(t, 30*time.Second, "the revoked agent to be cut off", func() bool { return nc.IsClosed() })
	if nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: url, CredsFile: creds}, nats.NoReconnect()); err == nil {
		nc.Close()
		t.Error("a revoked agent connected again")
	}
	var ee *exitError
	if err := runCreds(g, credsFlags{authDir: auth, run: "r1", revoke: "not-a-key"}); !errors.As(err, &ee) || ee.code != ExitUsage {
		t.Errorf("creds --revoke not-a-key: %v, want a usage error", err)
	}
}

// failure is a checkpoint result's failure as JSON, for a test's message.
func failure(res *bridgeapi.CheckpointResult) string {
	if res == nil || res.Failure == nil {
		return "none"
	}
	b, _ := json.Marshal(res.Failure)
	return string(b)
}

// TestServerRunLimitFlags: the server's --run-* flags change only the
// limits they name, keep the rest the auth dir had, and every run's account
// carries them.
func TestServerRunLimitFlags(t *testing.T) {
	auth := filepath.Join(t.TempDir(), "auth")
	a, err := embedded.LoadAuthority(auth)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.SetLimits(embedded.Limits{Storage: 64 << 20, Connections: 40}); err != nil {
		t.Fatal(err)
	}
	startCommand(t, "server", readyRE, func(ctx context.Context, g *globals) error {
		return runServer(ctx, g, serverFlags{dir: t.TempDir(), listen: "127.0.0.1:0", authDir: auth, runs: []string{"r1"}, runConsumers: 300})
	}, jetstream.ConnConfig{})
	a, err = embedded.LoadAuthority(auth)
	if err != nil {
		t.Fatal(err)
	}
	want := embedded.Limits{Storage: 64 << 20, Consumers: 300, Connections: 40}
	if got := a.Limits(); got != want {
		t.Fatalf("limits after --run-consumers 300: %+v, want %+v", got, want)
	}
	ajwt, err := a.AccountJWT("r1")
	if err != nil {
		t.Fatal(err)
	}
	ac, err := jwt.DecodeAccountClaims(ajwt)
	if err != nil {
		t.Fatal(err)
	}
	if l := ac.Limits; l.Consumer != 300 || l.Conn != 40 || l.DiskStorage != 64<<20 {
		t.Errorf("r1's account: consumers %d, connections %d, storage %d; want 300, 40, %d", l.Consumer, l.Conn, l.DiskStorage, 64<<20)
	}
}
