package bridge_test

import (
	"context"
	"encoding/json"
	"errors"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/client"
	"github.com/stillpoint/stillpoint/controller-bridge/internal/failpoint"
	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/child"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// listeningRE is the line a bridge process prints once it serves.
var listeningRE = regexp.MustCompile(`(?m)^listening (\S+)$`)

// startBridgeProcess starts a bridge as its own process, armed with the
// failpoints given, and returns it with a client of its API.
func startBridgeProcess(t *testing.T, env *jstest.Env, failpoints string) (*child.Process, *client.Client) {
	t.Helper()
	p := spawn(t, env, "bridge", failpoint.Env+"="+failpoints)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	m, err := p.WaitOutput(ctx, listeningRE)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New("http://"+m[1], testToken)
	if err != nil {
		t.Fatal(err)
	}
	return p, c
}

// TestBridgeCrashDuringCheckpoint kills the bridge (SIGKILL, a separate
// process) at every point of a checkpoint, starts another, and checks that
// it finished or aborted the checkpoint from the bus alone: an outcome
// exists, a failed checkpoint has an abort marker and never a manifest, a
// committed one is LATEST, every member has reopened, and the run goes on.
func TestBridgeCrashDuringCheckpoint(t *testing.T) {
	tier.E2E(t)
	cases := []struct {
		failpoint string
		block     bool // a blocker makes the prepare fail, to reach the abort path
		want      string
		late      bool // the next bridge starts after the phase's deadline
	}{
		{"bridge/after-prepare", false, bridgeapi.StatusFailed, false},
		{"bridge/after-prepare-acks", false, bridgeapi.StatusFailed, false},
		{"bridge/after-commit", false, bridgeapi.StatusCommitted, false},
		{"bridge/after-commit-acks", false, bridgeapi.StatusCommitted, false},
		{"bridge/after-member-list", false, bridgeapi.StatusCommitted, false},
		{"bridge/after-manifest", false, bridgeapi.StatusCommitted, false},
		{"bridge/after-latest", false, bridgeapi.StatusCommitted, false},
		{"bridge/after-outcome", false, bridgeapi.StatusCommitted, false},
		{"bridge/after-abort-marker", true, bridgeapi.StatusFailed, false},
		{"bridge/after-commit-acks", false, bridgeapi.StatusCommitted, true},
	}
	for _, c := range cases {
		name := c.failpoint
		if c.late {
			name += "/recovered-after-the-deadline"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := jstest.Start(t)
			hs := membertest.StartMembers(t, env, run, 2, membertest.Options{Episodes: 2})
			if c.block {
				hs[0].Participant.Block(events.Episode{Rollout: "t0-r0"})
			}
			dying, cl := startBridgeProcess(t, env, c.failpoint)
			cctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			// Each phase's deadline: long enough for two members to answer
			// on a loaded machine (ten of these run at once), so that the
			// checkpoint reaches the failpoint; shorter where the test
			// waits it out.
			deadline := 10 * time.Second
			if c.late {
				deadline = 5 * time.Second
			}
			asked := time.Now()
			if res, err := cl.Checkpoint(cctx, bridgeapi.CheckpointRequest{ID: "c1", TimeoutMS: deadline.Milliseconds()}); err == nil {
				t.Fatalf("the bridge answered %+v instead of dying at %s", res, c.failpoint)
			}
			exited(t, dying, 30*time.Second)
			if c.late {
				// Acks already on the bus count after the deadline too:
				// the prepare's and the commit's deadlines both passed.
				poll.Wait(t, 3*deadline, "the phase deadlines to pass", func() bool { return time.Since(asked) > 2*deadline })
			}
			if c.block {
				hs[0].Participant.Unblock(events.Episode{Rollout: "t0-r0"})
			}

			_, cl = startBridgeProcess(t, env, "")
			res, err := cl.Get(cctx, "c1")
			if err != nil {
				t.Fatalf("after recovery: %v", err)
			}
			if res.Status != c.want {
				t.Fatalf("c1 is %s after recovery, want %s (%+v)", res.Status, c.want, res)
			}
			st, err := cl.Status(cctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Open != "" {
				t.Errorf("still open after recovery: %s", st.Open)
			}
			m := manifestOf(t, env, "c1")
			switch c.want {
			case bridgeapi.StatusCommitted:
				if m == nil || m.Aborted || len(m.Continued) != 4 || st.Latest == nil || st.Latest.CheckpointID != "c1" {
					t.Errorf("committed c1: manifest %+v, LATEST %+v", m, st.Latest)
				}
				// The member list rebuilt from the stream's commit acks is
				// the one written before the crash, if one was: one object.
				if m != nil && (m.MemberList == nil || len(m.Members) != 2 || !slices.Equal(memberLists(t, env, "c1"), []string{m.MemberList.Object})) {
					t.Errorf("committed c1: member list %+v of %d members; sp_checkpoints holds %v", m.MemberList, len(m.Members), memberLists(t, env, "c1"))
				}
			case bridgeapi.StatusFailed:
				if m == nil || !m.Aborted || st.Latest != nil {
					t.Errorf("failed c1: manifest %+v (want an abort marker), LATEST %+v", m, st.Latest)
				}
			}
			poll.Wait(t, 10*time.Second, "every member to reopen admission", func() bool { return allOpen(hs) })
			if res, err := cl.Checkpoint(cctx, bridgeapi.CheckpointRequest{ID: "c2"}); err != nil || res.Status != bridgeapi.StatusCommitted {
				t.Fatalf("the run does not go on: %+v %v", res, err)
			}
		})
	}
}

// TestBridgeCrashDuringRestore does the same at every point of a restore,
// with a fleet that installs (completed) and one where a member fails
// (failed: the next attempts retired everywhere).
func TestBridgeCrashDuringRestore(t *testing.T) {
	tier.E2E(t)
	cases := []struct {
		failpoint string
		fail      bool
		want      string
		late      bool
	}{
		{"bridge/after-restore", false, bridgeapi.StatusCompleted, false},
		{"bridge/after-restore-acks", false, bridgeapi.StatusCompleted, false},
		{"bridge/after-restore-acks", false, bridgeapi.StatusCompleted, true},
		{"bridge/after-restore-acks", true, bridgeapi.StatusFailed, false},
		{"bridge/after-restore-retire", true, bridgeapi.StatusFailed, false},
	}
	for _, c := range cases {
		name := c.failpoint
		if c.fail {
			name += "/install-fails"
		}
		if c.late {
			name += "/recovered-after-the-deadline"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := jstest.Start(t)
			old := membertest.StartMembers(t, env, run, 2, membertest.Options{Episodes: 2})
			b := startBridge(t, env, bridge.Config{})
			if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1", Stop: true}); err != nil || res.Status != bridgeapi.StatusCommitted {
				t.Fatalf("%+v %v", res, err)
			}
			for _, h := range old {
				_ = h.Stop()
			}
			fresh := membertest.StartMembers(t, env, run, 2, membertest.Options{})
			if c.fail {
				fresh[1].Participant.FailInstall(errors.New("fork failed"))
			}
			dying, cl := startBridgeProcess(t, env, c.failpoint)
			cctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			// As in TestBridgeCrashDuringCheckpoint: deadlines the members
			// meet on a loaded machine, shorter where the test waits them out.
			deadline := 10 * time.Second
			if c.late {
				deadline = 5 * time.Second
			}
			asked := time.Now()
			if res, err := cl.Restore(cctx, bridgeapi.RestoreRequest{ID: "r1", TimeoutMS: deadline.Milliseconds()}); err == nil {
				t.Fatalf("the bridge answered %+v instead of dying", res)
			}
			exited(t, dying, 30*time.Second)
			if c.late {
				poll.Wait(t, 3*deadline, "the phase deadlines to pass", func() bool { return time.Since(asked) > 2*deadline })
			}
			_, cl = startBridgeProcess(t, env, "")
			st, err := cl.Status(cctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Open != "" || st.Epoch != 1 {
				t.Errorf("after recovery: open %q, epoch %d", st.Open, st.Epoch)
			}
			entries, err := timeline.Read(cctx, env.JS, run, "r1")
			if err != nil {
				t.Fatal(err)
			}
			var outcome events.Type
			for _, e := range entries {
				if e.Type == events.TypeRestoreCompleted || e.Type == events.TypeRestoreFailed {
					outcome = e.Type
				}
			}
			want := map[string]events.Type{bridgeapi.StatusCompleted: events.TypeRestoreCompleted, bridgeapi.StatusFailed: events.TypeRestoreFailed}[c.want]
			if outcome != want {
				t.Fatalf("outcome %q, want %q", outcome, want)
			}
			poll.Wait(t, 10*time.Second, "every member to reopen admission", func() bool { return allOpen(fresh) })
			if c.fail {
				for _, h := range fresh {
					if err := h.Member.Admit(events.Episode{Rollout: "t0-r0", Attempt: 1}); err == nil {
						t.Errorf("%s admits a next attempt of a failed restore", h.Name)
					}
				}
			} else if live := fresh[0].Participant.Live(); len(live) != 2 {
				t.Errorf("t0 holds %v after a completed restore", live)
			}
		})
	}
}

// TestFleetOfProcesses: members as separate processes checkpoint through
// the bridge, and a kill -9 of one of them fails the next checkpoint at
// once, naming it.
func TestFleetOfProcesses(t *testing.T) {
	tier.E2E(t)
	env := jstest.Start(t, jstest.WithTopology(jetstream.Topology{MemberTTL: 3 * time.Second}))
	var procs []*child.Process
	for _, name := range []string{"agent.p0", "owner.p1"} {
		procs = append(procs, spawn(t, env, "member", nameEnv+"="+name, episodesEnv+"=3"))
	}
	for _, name := range []events.Member{"agent.p0", "owner.p1"} {
		membertest.WaitRegistered(t, env, run, name, nil)
	}
	b := startBridge(t, env, bridge.Config{})
	res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1"})
	if err != nil || res.Status != bridgeapi.StatusCommitted || len(res.Continued) != 6 {
		t.Fatalf("%+v %v", res, err)
	}
	kctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := procs[1].Kill(kctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err = b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c2", TimeoutMS: 30000})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != bridgeapi.StatusFailed || len(res.Failure.Errors) != 1 || res.Failure.Errors[0].Member != "owner.p1" ||
		res.Failure.Errors[0].Code != "member_dead" {
		t.Fatalf("after kill -9 of owner.p1: %+v", res.Failure)
	}
	// The heartbeat expires within its TTL (3 s here), long before the
	// 30 s deadline.
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the dead member failed the checkpoint after %s", took)
	}
}

// TestBridgeCrashDuringRelease: a bridge killed after publishing a release
// leaves it to the next bridge, which finishes the deletion and reports it.
func TestBridgeCrashDuringRelease(t *testing.T) {
	tier.E2E(t)
	env, hs := diesReleasingC1(t, "bridge/after-release")
	recoversRelease(t, env, hs)
	for _, o := range objects(t, env) {
		if strings.Contains(o, "/c1/") {
			t.Errorf("records %s of the released c1 are left", o)
		}
	}
}

// diesReleasingC1 commits c1 and c2 with two test members, then has a
// bridge process armed at failpoint die in a release that keeps c2.
func diesReleasingC1(t *testing.T, failpoint string) (*jstest.Env, []*membertest.Handle) {
	t.Helper()
	env := jstest.Start(t)
	hs := membertest.StartMembers(t, env, run, 2, membertest.Options{Episodes: 1})
	b := startBridge(t, env, bridge.Config{})
	for _, id := range []string{"c1", "c2"} {
		if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: id}); err != nil || res.Status != bridgeapi.StatusCommitted {
			t.Fatalf("%+v %v", res, err)
		}
	}
	dying, cl := startBridgeProcess(t, env, failpoint)
	cctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if res, err := cl.Release(cctx, bridgeapi.ReleaseRequest{KeepLatest: 1}); err == nil {
		t.Fatalf("the bridge answered %+v instead of dying", res)
	}
	exited(t, dying, 30*time.Second)
	return env, hs
}

// recoversRelease starts the next bridge process, which finishes the
// release: c2 alone is left, and every member released once.
func recoversRelease(t *testing.T, env *jstest.Env, hs []*membertest.Handle) {
	t.Helper()
	cctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, cl := startBridgeProcess(t, env, "")
	if st, err := cl.Status(cctx); err != nil || st.Open != "" || len(st.Checkpoints) != 1 || st.Checkpoints[0].CheckpointID != "c2" {
		t.Fatalf("after recovery: %+v %v", st, err)
	}
	for _, h := range hs {
		if h.Participant.Count("release") != 1 {
			t.Errorf("%s released %d times", h.Name, h.Participant.Count("release"))
		}
	}
}

// A bridge killed between a released checkpoint's records and its
// manifest leaves that manifest marked: its members deleted their side
// at the release phase, so it must read as restorable no more rather
// than as a checkpoint whose records went missing. The next bridge
// finishes the release.
func TestBridgeCrashMidReleaseLeavesTheCheckpointMarked(t *testing.T) {
	tier.E2E(t)
	env, hs := diesReleasingC1(t, "bridge/mid-release")
	cctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, o := range objects(t, env) {
		if strings.Contains(o, "/c1/") {
			t.Errorf("records %s of c1 are left: the bridge died before it deleted them", o)
		}
	}
	e, err := env.Bus.Manifests.Get(cctx, events.ManifestKey(run, "c1"))
	if err != nil {
		t.Fatalf("c1's manifest: %v (the bridge died before it deleted it)", err)
	}
	var c1 events.CheckpointManifest
	if err := json.Unmarshal(e.Value(), &c1); err != nil {
		t.Fatal(err)
	}
	if c1.Released == nil || c1.Released.Op == "" || len(c1.Released.Failed) != 0 {
		t.Fatalf("c1 half deleted, marked %+v; want a mark naming the release and no failure", c1.Released)
	}
	if c2, _ := env.Bus.Manifests.Get(cctx, events.ManifestKey(run, "c2")); c2 == nil || strings.Contains(string(c2.Value()), `"released"`) {
		t.Errorf("the kept c2: %v", c2)
	}
	recoversRelease(t, env, hs)
}
