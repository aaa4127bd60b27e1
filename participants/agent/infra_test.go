package agent

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
)

// failingOwner fails its first fail seed_session asks on its side (a 5xx:
// a sandbox that would not start), then seeds as the world's owner does.
type failingOwner struct {
	*stallingOwner
	fail  int32
	seeds atomic.Int32
}

func (o *failingOwner) SeedSession(ctx context.Context, r ownerapi.SeedRequest) (ownerapi.SessionInfo, error) {
	if o.seeds.Add(1) <= o.fail {
		return ownerapi.SessionInfo{}, &jetstream.ServiceError{Status: 500, Code: "internal",
			Detail: "owner: start sandbox of session r1: guest refused: identify: jetstream: connect"}
	}
	return o.stallingOwner.SeedSession(ctx, r)
}

// An infrastructure fault (the owner fails a step on its side) is never
// the rollout's result: the stage runs again from its bookmark, and only
// after InfraTries in a row does the attempt end, as ErrInfra, which the
// agent answers with code infra, not rollout_failed.
func TestInfraFaultRunsTheStageAgain(t *testing.T) {
	t.Run("passes on a later try", func(t *testing.T) {
		w := newWorld(t)
		o := &failingOwner{stallingOwner: newStallingOwner(t, w, ""), fail: InfraTries - 1}
		sb := newEndlessSandbox()
		a, _ := startAgent(t, w, o, func(string) (Sandbox, error) { return sb, nil })
		ctx, cancel := context.WithCancel(t.Context())
		done := startEndlessOn(t, a, sb, ctx) // returns once it launched
		if n := o.seeds.Load(); n != InfraTries {
			t.Errorf("%d seeds, want %d (%d failed, one answered)", n, InfraTries, InfraTries-1)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("the rollout ended with %v, want its caller's cancel", err)
		}
	})
	t.Run("ends as infra", func(t *testing.T) {
		w := newWorld(t)
		o := &failingOwner{stallingOwner: newStallingOwner(t, w, ""), fail: 1 << 20}
		a, _ := startAgent(t, w, o, nil)
		_, err := a.Rollout(t.Context(), agentapi.Request{RolloutID: "r1", Task: task})
		if !errors.Is(err, ErrInfra) {
			t.Fatalf("the rollout ended with %v, want ErrInfra", err)
		}
		if status, code := classify(err); status != 502 || code != agentapi.CodeInfra {
			t.Errorf("answered %d %s, want 502 %s", status, code, agentapi.CodeInfra)
		}
		if n := o.seeds.Load(); n != InfraTries {
			t.Errorf("%d seeds, want %d", n, InfraTries)
		}
	})
}
