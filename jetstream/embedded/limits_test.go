package embedded_test

import (
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

// TestRunConsumersAndConnectionsAreBounded: with Limits.Consumers and
// Limits.Connections set, an agent making watches past its run's bound is
// refused, and so is a sandbox's workload opening connections past it,
// while another run makes consumers and connects as before.
func TestRunConsumersAndConnectionsAreBounded(t *testing.T) {
	ctx := testContext(t)
	const consumers, connections = 6, 5
	auth, s, _ := twoRuns(t, embedded.Limits{Storage: -1, Consumers: consumers, Connections: connections})
	creds := func(run, member string) string {
		b, _, err := auth.MemberCreds(run, events.Member(member), time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), run+"-"+member+".creds")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}

	// Watches of sp_manifests, one ordered consumer each.
	watch := func(js natsjs.JetStream, run string, n int) (made int, err error) {
		kv, err := js.KeyValue(ctx, jetstream.BucketManifests)
		if err != nil {
			t.Fatal(err)
		}
		for range n {
			w, err := kv.Watch(ctx, run+".>")
			if err != nil {
				return made, err
			}
			t.Cleanup(func() { _ = w.Stop() })
			made++
		}
		return made, nil
	}
	_, a1, _ := connectCreds(t, s, creds("r1", "agent.a1"))
	made, err := watch(a1, "r1", consumers+4)
	if err == nil || made > consumers {
		t.Fatalf("r1's agent made %d watches of %d asked (bound %d): %v; want refused past the bound", made, consumers+4, consumers, err)
	}
	if !strings.Contains(strings.ToLower(err.Error()), "maximum consumers") {
		t.Errorf("r1's agent past the bound: %v, want a maximum consumers error", err)
	}
	_, a2, _ := connectCreds(t, s, creds("r2", "agent.a1"))
	if made, err := watch(a2, "r2", 2); err != nil {
		t.Fatalf("r2's agent, while r1 has all its consumers: %d watches, %v", made, err)
	}

	// r1 has its admin's and its agent's connections; its sandbox's
	// workload opens the rest.
	sb := creds("r1", "sandbox.sb1")
	var opened int
	var refused error
	for range connections + 4 {
		nc, err := nats.Connect(s.ClientURL(), nats.UserCredentials(sb), nats.NoReconnect())
		if err != nil {
			refused = err
			break
		}
		t.Cleanup(nc.Close)
		opened++
	}
	if refused == nil || opened > connections-2 {
		t.Fatalf("r1's sandbox opened %d connections beside 2 (bound %d): %v; want refused past the bound", opened, connections, refused)
	}
	if !errors.Is(refused, nats.ErrMaxAccountConnectionsExceeded) && !strings.Contains(strings.ToLower(refused.Error()), "maximum account active connections") {
		t.Errorf("r1's sandbox past the bound: %v, want the account's connections exceeded", refused)
	}
	nc, err := nats.Connect(s.ClientURL(), nats.UserCredentials(creds("r2", "sandbox.sb1")), nats.NoReconnect())
	if err != nil {
		t.Fatalf("r2's sandbox, while r1 has all its connections: %v", err)
	}
	nc.Close()
}

// twoRuns starts a server with the accounts of runs r1 and r2 under lim,
// each run's bus provisioned by its admin, whose JetStream it returns.
func twoRuns(t *testing.T, lim embedded.Limits) (*embedded.Authority, *embedded.Server, map[string]natsjs.JetStream) {
	t.Helper()
	ctx := testContext(t)
	dir := filepath.Join(t.TempDir(), "auth")
	auth, err := embedded.LoadAuthority(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := auth.SetLimits(lim); err != nil {
		t.Fatal(err)
	}
	for _, run := range []string{"r1", "r2"} {
		if err := auth.AddRun(run); err != nil {
			t.Fatal(err)
		}
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
	js := map[string]natsjs.JetStream{}
	for _, run := range []string{"r1", "r2"} {
		_, j, _ := connectCreds(t, s, embedded.CredsFile(embedded.RunDir(dir, run), embedded.RoleAdmin))
		if _, err := jetstream.Provision(ctx, j, jetstream.Topology{}); err != nil {
			t.Fatalf("provision %s: %v", run, err)
		}
		js[run] = j
	}
	return auth, s, js
}
