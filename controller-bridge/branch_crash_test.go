package bridge_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/internal/tier"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// TestBridgeCrashDuringBranch kills the bridge (SIGKILL, a separate
// process) at every point of a branch, starts another, and checks that it
// finished the branch from the bus alone: the outcome, and on a failure
// the branches retired on every member.
func TestBridgeCrashDuringBranch(t *testing.T) {
	tier.E2E(t)
	cases := []struct {
		failpoint string
		fail      bool
		want      events.Type
	}{
		{"bridge/after-branch", false, events.TypeBranchCompleted},
		{"bridge/after-branch-acks", false, events.TypeBranchCompleted},
		{"bridge/after-branch-acks", true, events.TypeBranchFailed},
		{"bridge/after-branch-retire", true, events.TypeBranchFailed},
	}
	for _, c := range cases {
		name := c.failpoint
		if c.fail {
			name += "/branch-fails"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := jstest.Start(t)
			hs := membertest.StartMembers(t, env, run, 2, membertest.Options{Episodes: 1})
			b := startBridge(t, env, bridge.Config{})
			if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1"}); err != nil || res.Status != bridgeapi.StatusCommitted {
				t.Fatalf("%+v %v", res, err)
			}
			if c.fail {
				hs[1].Participant.FailBranch(errors.New("fork failed"))
			}
			dying, cl := startBridgeProcess(t, env, c.failpoint)
			cctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			req := bridgeapi.BranchRequest{ID: "branch-b1", Rollouts: []string{"t0-r0", "t1-r0"}, N: 2, Seed: 3, TimeoutMS: (10 * time.Second).Milliseconds()}
			if res, err := cl.Branch(cctx, req); err == nil {
				t.Fatalf("the bridge answered %+v instead of dying", res)
			}
			exited(t, dying, 30*time.Second)
			_, cl = startBridgeProcess(t, env, "")
			st, err := cl.Status(cctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.Open != "" || st.Epoch != 0 {
				t.Errorf("after recovery: open %q, epoch %d", st.Open, st.Epoch)
			}
			entries, err := timeline.Read(cctx, env.JS, run, "branch-b1")
			if err != nil {
				t.Fatal(err)
			}
			var outcome events.Type
			for _, e := range entries {
				if e.Type == events.TypeBranchCompleted || e.Type == events.TypeBranchFailed {
					outcome = e.Type
				}
			}
			if outcome != c.want {
				t.Fatalf("outcome %q, want %q", outcome, c.want)
			}
			branches := 0
			for _, h := range hs {
				for _, k := range h.Participant.Live() {
					if strings.Contains(k, ".b") {
						branches++
					}
				}
			}
			if c.fail {
				poll.Wait(t, 10*time.Second, "the branches to be retired", func() bool {
					for _, h := range hs {
						if h.Member.Admit(events.Episode{Rollout: "t0-r0.b1", Attempt: 1}) == nil {
							return false
						}
					}
					return true
				})
				if branches != 0 {
					t.Errorf("%d branches run after a failed branch", branches)
				}
			} else if branches != 4 {
				t.Errorf("%d branches run after a completed branch, want 4", branches)
			}
			// The run goes on.
			if res, err := cl.Checkpoint(cctx, bridgeapi.CheckpointRequest{ID: "c2"}); err != nil || res.Status != bridgeapi.StatusCommitted {
				t.Fatalf("checkpoint after the recovered branch: %+v %v", res, err)
			}
		})
	}
}
