package cli

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/agent"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// TestTrajectoryReadsTheAgentsOwnStores: `stillpoint trajectory`, as the
// run's controller, prints the trajectories of a run whose agents have
// users of their own, each in its own store (made by the bridge when it
// asked), beside those the shared store holds; of a rollout stored in both
// (an attempt sent again to another agent) the newest, naming the store
// it came from.
func TestTrajectoryReadsTheAgentsOwnStores(t *testing.T) {
	const run = "r"
	env := jstest.Start(t, jstest.WithAuthority(run))
	membertest.NewBridge(t, env, run)
	ctx := t.Context()
	put := func(store natsjs.ObjectStore, rollout, reply string) {
		t.Helper()
		data := []byte(`{"v":3,"id":"` + rollout + `.l1.1","link":"root","messages":[{"role":"user","content":"hi"}],"status":200,` +
			`"reply":{"role":"assistant","content":"` + reply + `"}}` + "\n")
		sum := sha256.Sum256(data)
		meta := natsjs.ObjectMeta{Name: agent.TrajectoryObject(run, rollout), Metadata: map[string]string{"sha256": hex.EncodeToString(sum[:])}}
		if _, err := store.Put(ctx, meta, bytes.NewReader(data)); err != nil {
			t.Fatal(err)
		}
	}
	// An earlier build's, in the shared store; r1 an attempt that a1 then
	// ran again.
	put(env.Bus.Trajectories, "r0", "shared")
	put(env.Bus.Trajectories, "r1", "shared")
	for _, a := range []struct {
		m       events.Member
		rollout string
	}{{"agent.a1", "r1"}, {"agent.a2", "r2"}} {
		_, js := env.WithCreds(env.MemberCreds(t, run, a.m)).Connect(t)
		store, err := agent.OwnTrajectories(ctx, js, run, a.m)
		if err != nil {
			t.Fatalf("%s's own trajectories store: %v", a.m, err)
		}
		put(store, a.rollout, string(a.m))
	}
	b, err := env.Authority.RoleCreds(embedded.RoleController, run)
	if err != nil {
		t.Fatal(err)
	}
	creds := filepath.Join(t.TempDir(), "controller.creds")
	if err := os.WriteFile(creds, b, 0o600); err != nil {
		t.Fatal(err)
	}
	export := func(args ...string) map[string]RolloutTrajectory {
		t.Helper()
		out, errb := &jstest.Buffer{}, &jstest.Buffer{}
		if code := Main(append([]string{"--nats-url", env.URL, "--creds", creds, "trajectory", "--run", run}, args...), out, errb); code != 0 {
			t.Fatalf("trajectory %v: exit %d\n%s", args, code, errb.String())
		}
		got := map[string]RolloutTrajectory{}
		for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
			var rt RolloutTrajectory
			if err := json.Unmarshal([]byte(line), &rt); err != nil {
				t.Fatalf("%q: %v", line, err)
			}
			got[rt.Rollout] = rt
		}
		return got
	}
	reply := func(rt RolloutTrajectory) string {
		if len(rt.Calls) != 1 {
			return ""
		}
		var r struct{ Content string }
		_ = json.Unmarshal(rt.Calls[0].Reply, &r)
		return r.Content
	}
	got := export()
	for rollout, want := range map[string]struct{ bucket, reply string }{
		"r0": {"", "shared"},
		"r1": {events.TrajectoriesBucket(run, "agent.a1"), "agent.a1"},
		"r2": {events.TrajectoriesBucket(run, "agent.a2"), "agent.a2"},
	} {
		if rt, ok := got[rollout]; !ok || rt.Bucket != want.bucket || reply(rt) != want.reply {
			t.Errorf("%s: bucket %q, reply %q; want %q from %q", rollout, rt.Bucket, reply(rt), want.reply, want.bucket)
		}
	}
	if len(got) != 3 {
		t.Errorf("%d trajectories, want r0, r1 and r2", len(got))
	}
	if got := export("--rollout", "r2"); len(got) != 1 || reply(got["r2"]) != "agent.a2" {
		t.Errorf("--rollout r2: %+v, want a2's", got)
	}
}
