package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/client"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/attack"
	"github.com/stillpoint/stillpoint/jetstream/embedded"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// liveRun is one run of the attack suite: its bridge's API and the
// credentials files of its members.
type liveRun struct {
	run   string
	api   *client.Client
	creds map[events.Member]string

	mu      sync.Mutex
	results []string       // each checkpoint's status, in order
	spans   [][2]time.Time // when each was asked and answered
}

// checkpoints asks a checkpoint every 300 ms until ctx ends, recording
// each status.
func (r *liveRun) checkpoints(ctx context.Context) {
	for i := 0; ctx.Err() == nil; i++ {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		asked := time.Now()
		res, err := r.api.Checkpoint(cctx, bridgeapi.CheckpointRequest{ID: fmt.Sprintf("c%03d", i)})
		cancel()
		st := "error"
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			st = "error: " + err.Error()
		case res.Status == bridgeapi.StatusCommitted && len(res.Members) == 3:
			st = "committed"
		default:
			st = string(res.Status) + " " + failure(res)
		}
		r.mu.Lock()
		r.results = append(r.results, st)
		r.spans = append(r.spans, [2]time.Time{asked, time.Now()})
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// since returns the statuses recorded from the n-th on.
func (r *liveRun) since(n int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.results[min(n, len(r.results)):]...)
}

// daemonLike is a test participant as a sandbox daemon is one: it
// prepares, resumes and retires, and exports and installs nothing.
type daemonLike struct {
	membertest.Subject
	p *membertest.Participant
}

func (s daemonLike) Resume(ctx context.Context, id string) error { return s.p.Resume(ctx, id) }

func (s daemonLike) Retire(ctx context.Context, eps []events.Episode) error {
	return s.p.Retire(ctx, eps)
}

// TestAttacksAcrossTwoRuns is the attack suite of issue 29 (docs/PERMISSIONS.md):
// two live runs, r1 and r2, on one `stillpoint server --auth-dir`, each an
// agent, an owner and a sandbox daemon with users of their own, checkpointing
// through their bridges. With the credentials of r1's sandbox (what its
// workload reads), of r1's agent and of r1's owner, every attack of
// jetstream/attack is tried twice. A sandbox's are all refused by the server,
// and so is the rollup of an agent or an owner (of its own heartbeat key in
// sp_members, and an owner's of a key of sp_snapshots: neither bucket allows
// roll-ups); an agent's or owner's other attacks that get through are
// harmless: every checkpoint of both runs taken during and after the attacks
// commits with every member, and r2's admin hears nothing of r1.
func TestAttacksAcrossTwoRuns(t *testing.T) {
	auth, store := filepath.Join(t.TempDir(), "auth"), t.TempDir()
	url := startCommand(t, "server", readyRE, func(ctx context.Context, g *globals) error {
		return runServer(ctx, g, serverFlags{dir: store, listen: "127.0.0.1:0", authDir: auth, runs: []string{"r1", "r2"}})
	}, jetstream.ConnConfig{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	g := &globals{stdout: &jstest.Buffer{}, stderr: &jstest.Buffer{}}
	members := []events.Member{"agent.a1", "owner.o1", "sandbox.sb1"}
	runs := map[string]*liveRun{}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for _, run := range []string{"r1", "r2"} {
		dir := embedded.RunDir(auth, run)
		tokenFile := filepath.Join(t.TempDir(), "token")
		if err := os.WriteFile(tokenFile, []byte("s3cret-"+run+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		api := startCommand(t, "bridge "+run, regexp.MustCompile(`serving on (http://\S+)`), func(ctx context.Context, g *globals) error {
			f := bridgeflagsForTest(tokenFile)
			f.run = run
			return runBridge(ctx, g, f)
		}, jetstream.ConnConfig{URL: url, CredsFile: embedded.CredsFile(dir, embedded.RoleBridge)})
		c, err := client.New(api, "s3cret-"+run)
		if err != nil {
			t.Fatal(err)
		}
		lr := &liveRun{run: run, api: c, creds: map[events.Member]string{}}
		admin, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: url, CredsFile: embedded.CredsFile(dir, embedded.RoleAdmin)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(admin.Close)
		ajs, _ := natsjs.New(admin)
		bus, err := jetstream.Open(ctx, ajs)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range members {
			out := filepath.Join(t.TempDir(), string(m)+".creds")
			if err := runCreds(g, credsFlags{authDir: auth, run: run, member: string(m), out: out}); err != nil {
				t.Fatal(err)
			}
			lr.creds[m] = out
			env := &jstest.Env{URL: url, Conn: admin, JS: ajs, Bus: bus}
			p := membertest.NewParticipant(m.Name())
			opts := membertest.Options{}
			if m.Kind() == events.KindSandbox {
				opts = membertest.Options{StateFile: filepath.Join(t.TempDir(), "state"), NoPull: true}
			} else {
				p.Add(events.Episode{Rollout: m.Name() + "-r0"})
			}
			var subj membertest.Subject = p
			if m.Kind() == events.KindSandbox {
				subj = daemonLike{p, p}
			}
			membertest.StartMember(t, env.WithCreds(out), run, m, subj, opts)
		}
		runs[run] = lr
	}
	// Both runs checkpoint from now on; the first of each must commit
	// before the attacks start.
	for _, lr := range runs {
		wg.Go(func() { lr.checkpoints(ctx) })
	}
	for _, lr := range runs {
		waitCommitted(t, lr, 0, 1)
	}
	started := map[string]int{}
	for run, lr := range runs {
		started[run] = len(lr.since(0))
	}

	// r2's admin hears everything it may: nothing of r1 must come.
	r2admin, err := jetstream.Connect(ctx, jetstream.ConnConfig{URL: url, CredsFile: embedded.CredsFile(embedded.RunDir(auth, "r2"), embedded.RoleAdmin)})
	if err != nil {
		t.Fatal(err)
	}
	defer r2admin.Close()
	heard, err := r2admin.SubscribeSync("sp.>")
	if err != nil {
		t.Fatal(err)
	}

	r1 := runs["r1"]
	// When an agent's or owner's flood ran: those credentials are the
	// run's own trusted components' (never in a sandbox), and may write
	// their run's quota as fast as the server takes it, which can hold
	// their own run's next acks past a checkpoint's deadline.
	var floods [][2]time.Time
	for _, self := range members {
		a, err := attack.Connect(ctx, jetstream.ConnConfig{URL: url, CredsFile: r1.creds[self]},
			attack.Target{Run: "r1", Self: self, Victims: members})
		if err != nil {
			t.Fatal(err)
		}
		for round := 1; round <= 2; round++ {
			for _, n := range attack.Names {
				began := time.Now()
				o := a.Run(ctx, n)
				if n == attack.Flood && self.Kind() != events.KindSandbox {
					floods = append(floods, [2]time.Time{began, time.Now()})
				}
				t.Logf("%s, round %d: %s", self, round, o)
				if (self.Kind() == events.KindSandbox || n == attack.Rollup) && !o.Refused {
					t.Errorf("with %s's credentials, %s got through: %s", self, o.Attack, o.Detail)
				}
			}
		}
		a.Close()
	}
	// The runs checkpoint on: a few more each, after the attacks, all committed.
	for _, lr := range runs {
		waitCommitted(t, lr, len(lr.since(0)), 3)
	}
	cancel()
	wg.Wait()
	for run, lr := range runs {
		lr.mu.Lock()
		spans := lr.spans[started[run]:]
		lr.mu.Unlock()
		for i, st := range lr.since(started[run]) {
			if st == "committed" || strings.Contains(st, "context canceled") {
				continue
			}
			// The one allowance: r1's own checkpoint asked while its own
			// agent's or owner's flood ran, or within a phase timeout of
			// its end (the server still storing it). The other run, and
			// r1 under a sandbox's attacks, commit every checkpoint.
			if run == "r1" && slices.ContainsFunc(floods, func(f [2]time.Time) bool {
				return spans[i][0].Before(f[1].Add(10*time.Second)) && spans[i][1].After(f[0])
			}) {
				t.Logf("run %s, checkpoint %d, asked during its own member's flood: %s", run, started[run]+i, st)
				continue
			}
			t.Errorf("run %s, checkpoint %d during or after the attacks: %s", run, started[run]+i, st)
		}
	}
	for {
		m, err := heard.NextMsg(200 * time.Millisecond)
		if err != nil {
			break
		}
		if strings.HasPrefix(m.Subject, "sp.r1.") {
			t.Errorf("r2's admin heard %s", m.Subject)
		}
	}
}

// waitCommitted waits until n checkpoints of lr from the from-th on have
// committed.
func waitCommitted(t *testing.T, lr *liveRun, from, n int) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		got := 0
		for _, st := range lr.since(from) {
			if st == "committed" {
				got++
			}
		}
		if got >= n {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("run %s: fewer than %d checkpoints committed from the %d-th: %q", lr.run, n, from, lr.since(from))
}
