package agent

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

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

// lostSeedOwner seeds on the world's owner but loses the answers of its
// first lose seed_session asks, as a NATS node that went away with the
// owner's answer does: the caller waits until its ask runs out.
type lostSeedOwner struct {
	*stallingOwner
	lose  int32
	seeds atomic.Int32
}

func (o *lostSeedOwner) SeedSession(ctx context.Context, r ownerapi.SeedRequest) (ownerapi.SessionInfo, error) {
	info, err := o.stallingOwner.SeedSession(ctx, r)
	if o.seeds.Add(1) <= o.lose {
		<-ctx.Done()
		return ownerapi.SessionInfo{}, fmt.Errorf("owner seed_session: %w", ctx.Err())
	}
	return info, err
}

// A seed whose answer is lost on the bus is asked again within seedAsk,
// not waited on for seedWait (a fault-matrix round stalled five minutes,
// every checkpoint aborted on the agent's seed in flight); the owner
// answers the repeat with the session it made.
func TestLostSeedAnswerIsAskedAgain(t *testing.T) {
	defer func(d time.Duration) { seedAsk = d }(seedAsk)
	seedAsk = 300 * time.Millisecond
	w := newWorld(t)
	o := &lostSeedOwner{stallingOwner: newStallingOwner(t, w, ""), lose: 2}
	sb := newEndlessSandbox()
	a, _ := startAgent(t, w, o, func(string) (Sandbox, error) { return sb, nil })
	ctx, cancel := context.WithCancel(t.Context())
	done := startEndlessOn(t, a, sb, ctx) // returns once it launched
	if n := o.seeds.Load(); n != 3 {
		t.Errorf("%d seed asks, want 3 (two answers lost, one taken)", n)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled rollout: %v, want context.Canceled", err)
	}
}
