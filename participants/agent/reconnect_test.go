package agent

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// A request whose answer a server restart lost is asked again once the
// connection is back, instead of waiting out its timeout: the first
// request here is never answered (as one in flight when the server went
// away), the server restarts, and the second is.
func TestAskingAgainAfterAReconnect(t *testing.T) {
	env := jstest.Start(t)
	caller, _ := env.Connect(t)
	asked := gradeLosingTheFirst(t, env)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	type answer struct {
		got string
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		got, err := askingAgain(ctx, caller, 0, func(ctx context.Context) (string, error) {
			m, err := caller.RequestWithContext(ctx, "grade", nil)
			if err != nil {
				return "", err
			}
			return string(m.Data), nil
		})
		answered <- answer{got, err}
	}()
	poll.Wait(t, 10*time.Second, "the first request", func() bool { return asked.Load() > 0 })
	env.Restart(t)
	if a := <-answered; a.err != nil || a.got != "graded" {
		t.Fatalf("askingAgain = %q, %v; want the second request's answer", a.got, a.err)
	}
	if n := asked.Load(); n < 2 {
		t.Fatalf("the callee was asked %d times, want a second request after the reconnect", n)
	}
}

// Without a reconnect the request's own outcome is returned: a deadline
// is not retried.
func TestAskingAgainKeepsTheOutcome(t *testing.T) {
	env := jstest.Start(t)
	nc, _ := env.Connect(t)
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	calls := 0
	_, err := askingAgain(ctx, nc, 0, func(ctx context.Context) (string, error) {
		calls++
		<-ctx.Done()
		return "", ctx.Err()
	})
	if err != context.DeadlineExceeded || calls != 1 {
		t.Fatalf("err %v after %d calls, want the deadline after 1", err, calls)
	}
}

// A request whose answer was lost with the callee's connection, which the
// caller's own connection never sees, is asked again every period: the
// first request here is never answered, and no connection reconnects.
func TestAskingAgainEveryPeriod(t *testing.T) {
	env := jstest.Start(t)
	caller, _ := env.Connect(t)
	asked := gradeLosingTheFirst(t, env)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	got, err := askingAgain(ctx, caller, 200*time.Millisecond, func(ctx context.Context) (string, error) {
		m, err := caller.RequestWithContext(ctx, "grade", nil)
		if err != nil {
			return "", err
		}
		return string(m.Data), nil
	})
	if err != nil || got != "graded" {
		t.Fatalf("askingAgain = %q, %v; want the second request's answer", got, err)
	}
	if n, r := asked.Load(), caller.Stats().Reconnects; n != 2 || r != 0 {
		t.Fatalf("the callee was asked %d times with %d reconnects; want 2 asks, the second after the period, and none", n, r)
	}
}

// A refusal is the request's outcome, not a reason to ask again.
func TestAskingAgainKeepsARefusal(t *testing.T) {
	env := jstest.Start(t)
	nc, _ := env.Connect(t)
	refused := errors.New("admission closed")
	calls := 0
	_, err := askingAgain(t.Context(), nc, time.Millisecond, func(ctx context.Context) (string, error) {
		calls++
		return "", refused
	})
	if err != refused || calls != 1 {
		t.Fatalf("err %v after %d calls, want the refusal after 1", err, calls)
	}
}

// A rollout request asked again (the controller asks every AskAgain while
// it has no answer) takes the place of the one before it: the earlier
// request is answered rollout_busy, never the rollout's result, and the
// run goes on once, for the later request.
func TestRolloutAskedAgainReplacesTheWaiter(t *testing.T) {
	w := newWorld(t)
	cl, err := agentapi.NewClient(w.env.Conn, testRun, "a1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	req := agentapi.Request{RolloutID: "r1", Task: task}
	ask := func() <-chan error {
		got := make(chan error, 1)
		go func() {
			_, err := cl.Rollout(ctx, req)
			got <- err
		}()
		return got
	}
	waiter := func() chan struct{} {
		w.agent.mu.Lock()
		defer w.agent.mu.Unlock()
		if r := w.agent.runs["r1"]; r != nil {
			return r.waiter
		}
		return nil
	}
	first := ask()
	poll.Wait(t, 10*time.Second, "the first request to wait", func() bool { return waiter() != nil })
	req.SentTo = w.agent.member.Instance()
	second := ask()
	var se *jetstream.ServiceError
	if err := <-first; !errors.As(err, &se) || se.Code != agentapi.CodeRolloutBusy {
		t.Fatalf("the request a repeat replaced: %v, want rollout_busy", err)
	}
	select {
	case err := <-second:
		t.Fatalf("the repeat was answered %v while the run goes on", err)
	default:
	}
	w.agent.mu.Lock()
	n := len(w.agent.runs)
	w.agent.mu.Unlock()
	if n != 1 {
		t.Fatalf("%d runs, want the one the first request began", n)
	}
}

// askingOwner is the world's owner as the agent calls it, except that its
// first verify answer is lost (as with a connection cut off), and its
// second is asked_again (the repeat before it took its place: repeats
// buffered through a cut reach the owner in any order).
type askingOwner struct {
	*stallingOwner
	asks atomic.Int32
}

func (o *askingOwner) VerifyEnd(ctx context.Context, r ownerapi.VerifyRequest) (ownerapi.VerifyResult, error) {
	switch o.asks.Add(1) {
	case 1:
		return ownerapi.VerifyResult{}, o.hang(ctx)
	case 2:
		return ownerapi.VerifyResult{}, &jetstream.ServiceError{Status: 409, Code: codeOwnerAskedAgain, Detail: "a later request gets the answer"}
	}
	return o.stallingOwner.Owner.VerifyEnd(ctx, r)
}

// A grade whose answer was lost is asked again after AskAgain; a repeat
// another took the place of is no outcome, and waits for the next ask:
// the rollout gets the owner's verdict, not a failure.
func TestVerifyAskedAgainUntilAnswered(t *testing.T) {
	w := newWorld(t)
	if _, err := w.owner.StartSession(t.Context(), "r1", events.Episode{Rollout: "r1", Attempt: 1}, provider.Spec{}); err != nil {
		t.Fatal(err)
	}
	o := &askingOwner{stallingOwner: newStallingOwner(t, w, "")}
	a, _ := startAgent(t, w, o, nil, func(c *Config) { c.AskAgain = 300 * time.Millisecond })
	bm := agentapi.Bookmark{V: 1, Next: agentapi.StageVerify, Rollout: "r1", Task: task, Session: "r1", Owner: "o1",
		Answer: []byte(`"42"`), Launches: []agentapi.LaunchRecord{{ID: "r1.l1", Sandbox: "sb-r1", Ended: agentapi.LaunchFinished}}}
	if _, err := a.Install(t.Context(), events.Restore{}, []events.Record{record(t, "r1", bm)}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	res, err := a.Rollout(ctx, agentapi.Request{RolloutID: "r1", Attempt: 1, Task: task})
	if err != nil || string(res.Verdict) != `{"reward":1}` {
		t.Fatalf("Rollout = %+v, %v; want the owner's verdict", res, err)
	}
	if n := o.asks.Load(); n != 3 {
		t.Fatalf("verify asked %d times, want 3 (one answer lost, one replaced, one answered)", n)
	}
}

// gradeLosingTheFirst serves subject "grade" on a connection of its own,
// answering "graded" to every request but the first, which it takes and
// never answers (as one whose answer was lost); it counts the requests.
func gradeLosingTheFirst(t *testing.T, env *jstest.Env) *atomic.Int32 {
	t.Helper()
	callee, _ := env.Connect(t)
	asked := new(atomic.Int32)
	if _, err := callee.Subscribe("grade", func(m *nats.Msg) {
		if asked.Add(1) > 1 {
			_ = m.Respond([]byte("graded"))
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := callee.Flush(); err != nil {
		t.Fatal(err)
	}
	return asked
}
