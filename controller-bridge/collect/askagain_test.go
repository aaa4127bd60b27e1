package collect

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	agent "github.com/stillpoint/stillpoint/participants/agent/agentapi"
)

// A rollout request whose answer is lost with the agent's connection (the
// collector's own never reconnects) is asked again after AskAgain, and the
// repeat names the agent process the first went to, so that no other
// process runs the attempt again: the agent here takes the first request
// and never answers it, as one cut off before its answer got out.
func TestRolloutAskedAgainNamesTheProcessItWentTo(t *testing.T) {
	env := jstest.Start(t)
	agentConn, _ := env.Connect(t)
	collConn, _ := env.Connect(t)
	var (
		mu    sync.Mutex
		asked []agent.Request
	)
	if _, err := agentConn.Subscribe("run", func(m *nats.Msg) {
		var r agent.Request
		if err := json.Unmarshal(m.Data, &r); err != nil {
			t.Error(err)
			return
		}
		mu.Lock()
		asked = append(asked, r)
		n := len(asked)
		mu.Unlock()
		if n > 1 {
			b, _ := json.Marshal(agent.Result{RolloutID: r.RolloutID, Attempt: r.Attempt})
			_ = m.Respond(b)
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := agentConn.Flush(); err != nil {
		t.Fatal(err)
	}
	c := &Collector{cfg: Config{AskAgain: 200 * time.Millisecond}, log: zerolog.Nop(),
		sentTo: map[string]dispatchEntry{"r1": {RolloutID: "r1", Attempt: 2, Agent: "a1", Instance: "i-first"}}}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req := agent.Request{RolloutID: "r1", Attempt: 2}
	res, err := c.askAgain(ctx, &req, func(ctx context.Context, req agent.Request) (agent.Result, error) {
		var out agent.Result
		return out, jetstream.Call(ctx, collConn, "run", req, &out)
	})
	if err != nil || res.RolloutID != "r1" || res.Attempt != 2 {
		t.Fatalf("askAgain = %+v, %v; want the repeat's answer", res, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 2 || asked[0].SentTo != "" || asked[1].SentTo != "i-first" {
		t.Fatalf("asked %+v; want the first send, then a repeat naming instance i-first", asked)
	}
	if r := collConn.Stats().Reconnects; r != 0 {
		t.Fatalf("the collector's connection reconnected %d times; the repeat must come without one", r)
	}
}

// A request that ends with an answer, a refusal included, is not asked
// again, nor one whose caller gave up.
func TestRolloutAskedOnceWhenAnswered(t *testing.T) {
	c := &Collector{cfg: Config{AskAgain: time.Millisecond}, log: zerolog.Nop(), sentTo: map[string]dispatchEntry{}}
	refused := &jetstream.ServiceError{Status: 409, Code: agent.CodeParked}
	calls := 0
	req := agent.Request{RolloutID: "r1"}
	_, err := c.askAgain(t.Context(), &req, func(ctx context.Context, req agent.Request) (agent.Result, error) {
		calls++
		return agent.Result{}, refused
	})
	if err != refused || calls != 1 {
		t.Fatalf("err %v after %d calls, want the refusal after 1", err, calls)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	calls = 0
	_, err = c.askAgain(ctx, &req, func(ctx context.Context, req agent.Request) (agent.Result, error) {
		calls++
		<-ctx.Done()
		return agent.Result{}, ctx.Err()
	})
	if err != context.Canceled || calls != 1 {
		t.Fatalf("err %v after %d calls, want the caller's cancel after 1", err, calls)
	}
}

// A request whose agent process the dispatch log does not know (sent
// before the agent's heartbeat was seen) is asked once and waited for: a
// repeat naming no process could reach a successor, which would run the
// attempt again.
func TestRolloutToAnUnknownProcessIsNotAskedAgain(t *testing.T) {
	c := &Collector{cfg: Config{AskAgain: 50 * time.Millisecond}, log: zerolog.Nop(),
		sentTo: map[string]dispatchEntry{"r1": {RolloutID: "r1", Agent: "a1"}}}
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	calls := 0
	req := agent.Request{RolloutID: "r1"}
	_, err := c.askAgain(ctx, &req, func(ctx context.Context, req agent.Request) (agent.Result, error) {
		calls++
		<-ctx.Done()
		return agent.Result{}, ctx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) || calls != 1 {
		t.Fatalf("err %v after %d calls; want the caller's deadline after 1, with no repeat", err, calls)
	}
}

// A request whose tries found no responders when AskAgain ran out (its
// agent away) is asked again, not returned for a new dispatch.
func TestRolloutWithNoRespondersIsAskedAgain(t *testing.T) {
	c := &Collector{cfg: Config{AskAgain: 50 * time.Millisecond}, log: zerolog.Nop(),
		sentTo: map[string]dispatchEntry{"r1": {RolloutID: "r1", Agent: "a1", Instance: "i-first"}}}
	calls := 0
	req := agent.Request{RolloutID: "r1"}
	res, err := c.askAgain(t.Context(), &req, func(ctx context.Context, req agent.Request) (agent.Result, error) {
		calls++
		if calls < 3 {
			<-ctx.Done()
			return agent.Result{}, nats.ErrNoResponders
		}
		return agent.Result{RolloutID: req.RolloutID}, nil
	})
	if err != nil || res.RolloutID != "r1" || calls != 3 {
		t.Fatalf("askAgain = %+v, %v after %d calls; want the third ask's answer", res, err, calls)
	}
}
