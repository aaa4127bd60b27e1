package embedded_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
)

// TestRunsAreAccountsApart: two runs on one server are two accounts, each with
// its own bus. Even a run's admin, who may do anything in its run, hears
// nothing of the other run, and a message id used in one run's stream does
// not make the other's publish of the same id a duplicate; a run added while
// the server runs is admitted once the server has its account JWT, and a
// signer of one run mints users of that run alone.
func TestRunsAreAccountsApart(t *testing.T) {
	ctx := testContext(t)
	dir := filepath.Join(t.TempDir(), "auth")
	auth, err := embedded.LoadAuthority(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.AddRun("r1"); err != nil {
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

	// r2 comes after the server started: refused until the server has its account.
	if err := auth.AddRun("r2"); err != nil {
		t.Fatal(err)
	}
	r2admin := embedded.CredsFile(embedded.RunDir(dir, "r2"), embedded.RoleAdmin)
	if nc, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: s.ClientURL(), CredsFile: r2admin}, nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("a user of a run whose account the server does not have was admitted")
	}
	ajwt, err := auth.AccountJWT("r2")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateAccount(ajwt); err != nil {
		t.Fatal(err)
	}

	buses := map[string]*jetstream.Bus{}
	conns := map[string]*nats.Conn{}
	for _, run := range []string{"r1", "r2"} {
		nc, js, _ := connectCreds(t, s, embedded.CredsFile(embedded.RunDir(dir, run), embedded.RoleAdmin))
		bus, err := jetstream.Provision(ctx, js, jetstream.Topology{})
		if err != nil {
			t.Fatalf("provision %s: %v", run, err)
		}
		buses[run], conns[run] = bus, nc
	}

	// r1's admin listens to everything it may; r2 publishes.
	heard, err := conns["r1"].SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if err := conns["r1"].Flush(); err != nil {
		t.Fatal(err)
	}
	const id = "r2.7.commit.c1.guessed"
	pub := func(run, subject string) *natsjs.PubAck {
		t.Helper()
		js, err := natsjs.New(conns[run])
		if err != nil {
			t.Fatal(err)
		}
		ack, err := js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: []byte("{}"), Header: nats.Header{"Nats-Msg-Id": []string{id}}})
		if err != nil {
			t.Fatalf("%s publishing %s: %v", run, subject, err)
		}
		return ack
	}
	// r1 stores a message with an id r2 will use: r2's own is no duplicate.
	if ack := pub("r1", "sp.r1.ack.7.commit.sandbox.sb1"); ack.Duplicate {
		t.Fatal("r1's first publish of the id was a duplicate")
	}
	if ack := pub("r2", "sp.r2.phase.commit"); ack.Duplicate {
		t.Fatal("r2's publish was taken for a duplicate of r1's: deduplication crossed runs")
	}
	if err := conns["r2"].Publish("sp.r2.member.agent.a1", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if err := conns["r2"].Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := heard.NextMsg(500 * time.Millisecond)
		if err != nil {
			break
		}
		if strings.Contains(m.Subject, "r2") {
			t.Errorf("r1's admin heard %s of run r2", m.Subject)
		}
	}
	// r1's stream holds r1's subjects alone.
	info, err := buses["r1"].Stream.Info(ctx, natsjs.WithSubjectFilter(">"))
	if err != nil {
		t.Fatal(err)
	}
	for subj := range info.State.Subjects {
		if strings.Contains(subj, "r2") {
			t.Errorf("r1's stream lists %s", subj)
		}
	}
	b, _ := json.Marshal(info.State.Subjects)
	t.Logf("r1's stream subjects: %s", b)

	// A signer of r1 mints users of r1 alone.
	signerFile := filepath.Join(t.TempDir(), "signer.json")
	if err := auth.WriteSigner("r1", events.KindSandbox, signerFile); err != nil {
		t.Fatal(err)
	}
	signer, err := embedded.LoadSigner(signerFile)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := signer.Mint("r2", "sb1", 0, time.Now()); err == nil {
		t.Error("r1's signer minted a user of r2")
	}
}

// TestMintService: a run's owners mint their sandboxes' users through the
// run's authority (ServeMint), never holding a key that could mint any
// other name: a sandbox name is minted, and its user connects as that
// sandbox; a wildcard, a dotted name or a validity beyond MaxSandboxTTL is
// refused with a reason; a sandbox or an agent may not ask at all.
func TestMintService(t *testing.T) {
	auth, dir, s, _ := operatorServer(t)
	adm, _, _ := connectCreds(t, s, embedded.CredsFile(dir, embedded.RoleAdmin))
	stop, err := auth.ServeMint(adm, "r")
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	onc, _, _ := connectCreds(t, s, memberCreds(t, auth, "owner.o1"))
	m := jetstream.Minter{NC: onc, Run: "r"}
	creds, user, err := m.Mint("r", "sb-1", time.Minute, time.Time{})
	if err != nil || user == "" {
		t.Fatalf("an owner minting sandbox sb-1: %q %v", user, err)
	}
	path := filepath.Join(t.TempDir(), "sb-1.creds")
	if err := os.WriteFile(path, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	snc, _, serrs := connectCreds(t, s, path)
	if err := snc.Publish("spl.r.ack.1.prepare.sandbox.sb-1", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	noViolationsBefore(t, snc, serrs, "the minted sandbox", "sp.r.phase.prepare")

	for _, bad := range []struct {
		name string
		ttl  time.Duration
	}{{"*", time.Minute}, {">", time.Minute}, {"sb.x", time.Minute}, {"", time.Minute}, {"sb-2", 2 * embedded.MaxSandboxTTL}, {"sb-2", 0}} {
		if _, _, err := m.Mint("r", bad.name, bad.ttl, time.Time{}); !errors.Is(err, jetstream.ErrMintRefused) {
			t.Errorf("minting %q for %s: %v, want ErrMintRefused", bad.name, bad.ttl, err)
		}
	}
	for _, who := range []events.Member{"sandbox.sb-9", "agent.a1"} {
		nc, _, errs := connectCreds(t, s, memberCreds(t, auth, who))
		if _, _, err := (jetstream.Minter{NC: nc, Run: "r"}).Mint("r", "sb-3", time.Minute, time.Time{}); err == nil {
			t.Errorf("%s minted a sandbox user", who)
		}
		select {
		case err := <-errs:
			if !errors.Is(err, nats.ErrPermissionViolation) {
				t.Errorf("%s asking the minting service: %v, want a permissions violation", who, err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("%s asking the minting service: no permissions violation", who)
		}
	}
}

// TestRunStorageBoundsAFlood: a member flooding its run's stream fills its
// own run's storage quota (Limits.Storage) and is refused past it, while
// another run's writes go on; a sandbox's user holds at most SandboxSubs
// subscriptions.
func TestRunStorageBoundsAFlood(t *testing.T) {
	ctx := testContext(t)
	const quota = 4 << 20
	auth, s, js := twoRuns(t, embedded.Limits{Storage: quota})
	b, _, err := auth.MemberCreds("r1", "agent.a1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "a1.creds")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, ajs, _ := connectCreds(t, s, path)
	chunk := make([]byte, 256<<10)
	stored, refused := 0, 0
	var lastErr error
	for i := range 32 { // 8 MiB, twice the quota
		_, err := ajs.Publish(ctx, events.AckSubject("r1", uint64(1000+i), events.PhaseCommit, "agent.a1"), chunk)
		if err != nil {
			refused++
			lastErr = err
			continue
		}
		stored++
	}
	if refused == 0 || stored*len(chunk) > quota {
		t.Fatalf("a flood of 8 MiB: %d chunks of 256 KiB stored, %d refused; want it stopped at the quota (%d MiB)", stored, refused, quota>>20)
	}
	t.Logf("flood: %d stored, %d refused (%v)", stored, refused, lastErr)
	if _, err := js["r2"].Publish(ctx, "sp.r2.phase.prepare", []byte("{}")); err != nil {
		t.Fatalf("r2 writing while r1 is full: %v", err)
	}

	// A sandbox's subscriptions are bounded.
	sb, _, err := auth.MemberCreds("r1", "sandbox.sb1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	sbPath := filepath.Join(t.TempDir(), "sb1.creds")
	if err := os.WriteFile(sbPath, sb, 0o600); err != nil {
		t.Fatal(err)
	}
	snc, _, serrs := connectCreds(t, s, sbPath)
	for range embedded.SandboxSubs + 8 {
		if _, err := snc.Subscribe("spl.r1.phase.>", func(*nats.Msg) {}); err != nil {
			break
		}
	}
	_ = snc.Flush()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case err := <-serrs:
			if strings.Contains(strings.ToLower(err.Error()), "maximum subscriptions") {
				return
			}
		case <-deadline:
			t.Fatalf("%d subscriptions of a sandbox: no 'maximum subscriptions exceeded'", embedded.SandboxSubs+8)
		}
	}
}
