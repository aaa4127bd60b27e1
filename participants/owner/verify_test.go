package owner

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

// A grade is a boundary, not a request a checkpoint waits for (PROTOCOL
// §6): a prepare while one runs is ready at once, and the commit exports
// the session it grades. The end after the grade waits for the resume, so
// the verdict comes only then, and the session ends after it; a verify
// asked while the checkpoint is open is refused.
func TestVerifyInFlightIsABoundary(t *testing.T) {
	env := jstest.Start(t)
	d := newDir(t)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	cfg := baseConfig(t, env, d, "o1")
	cfg.TaskKind = TaskFuncs{GradeFn: func(ctx context.Context, _ Execer, s *Session) (json.RawMessage, error) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return json.RawMessage(`{"reward":1}`), nil
	}}
	o := newOwner(t, cfg)
	c := serve(t, env, o)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := o.StartSession(ctx, "s1", ep("r1", 0), provider.Spec{}); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		v   ownerapi.VerifyResult
		err error
	}
	got := make(chan answer, 1)
	go func() {
		v, err := c.VerifyEnd(ctx, ownerapi.VerifyRequest{SessionID: "s1", End: true})
		got <- answer{v, err}
	}()
	<-entered

	t0 := time.Now()
	rep, err := o.Prepare(ctx, member.Checkpoint{Run: testRun, ID: "c1"})
	if err != nil || !rep.Ready || len(rep.Blockers) != 0 || rep.Counts["grading"] != 1 {
		t.Fatalf("Prepare while a grade runs: %+v %v, want ready with one grading", rep, err)
	}
	var se *jetstream.ServiceError
	if _, err := c.VerifyEnd(ctx, ownerapi.VerifyRequest{SessionID: "s1", End: true}); !errors.As(err, &se) || se.Code != "admission_closed" {
		t.Fatalf("a verify asked while the checkpoint is open: %v, want admission_closed", err)
	}
	recs, err := membertest.Drain(o.Export(ctx, events.Commit{PhaseHeader: events.PhaseHeader{Run: testRun, CheckpointID: "c1"}}))
	if err != nil || len(recs) != 1 || decode(t, recs[0]).Session != "s1" {
		t.Fatalf("Export while the grade runs: %v %v, want the graded session", recs, err)
	}
	t.Logf("prepare and commit with a grade in flight took %s", time.Since(t0))

	close(release)
	poll.Wait(t, 10*time.Second, "the grade to end", func() bool {
		rep, err := o.Prepare(ctx, member.Checkpoint{Run: testRun, ID: "c1"})
		return err == nil && rep.Counts["grading"] == 0
	})
	select {
	case a := <-got:
		t.Fatalf("the verdict came before the checkpoint resumed: %+v", a)
	default:
	}
	if _, ok := o.Session("s1"); !ok {
		t.Fatal("the graded session ended while the checkpoint was open")
	}
	if err := o.Resume(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.err != nil || string(a.v.Result) != `{"reward":1}` {
		t.Fatalf("verdict after the resume: %+v", a)
	}
	if _, ok := o.Session("s1"); ok {
		t.Fatal("the graded session was not ended after the resume")
	}
	snaps := snapshots(t, d)
	for _, id := range snaps {
		if err := d.DeleteSnapshot(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// A verify asked again (an agent whose connection reconnected while it
// waited, the first answer perhaps lost) gets the answer of the grade
// already asked: the grade runs once, and the repeat of a verify that
// ended its session is not answered no_sandbox.
func TestVerifyAskedAgainIsAnsweredOnce(t *testing.T) {
	env := jstest.Start(t)
	d := newDir(t)
	entered, release := make(chan struct{}, 2), make(chan struct{})
	grades := 0
	cfg := baseConfig(t, env, d, "o1")
	cfg.TaskKind = TaskFuncs{GradeFn: func(ctx context.Context, _ Execer, s *Session) (json.RawMessage, error) {
		grades++
		entered <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return json.RawMessage(`{"reward":1}`), nil
	}}
	o := newOwner(t, cfg)
	c := serve(t, env, o)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if _, err := o.StartSession(ctx, "s1", ep("r1", 0), provider.Spec{}); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		v   ownerapi.VerifyResult
		err error
	}
	got := make(chan answer, 2)
	ask := func() {
		v, err := c.VerifyEnd(ctx, ownerapi.VerifyRequest{SessionID: "s1", End: true})
		got <- answer{v, err}
	}
	go ask()
	<-entered
	go ask() // while the grade runs
	close(release)
	for range 2 {
		if a := <-got; a.err != nil || string(a.v.Result) != `{"reward":1}` {
			t.Fatalf("verdict: %+v, want the one grade's", a)
		}
	}
	go ask() // after the answer, the session ended
	if a := <-got; a.err != nil || string(a.v.Result) != `{"reward":1}` {
		t.Fatalf("verdict asked again after the session ended: %+v, want the same", a)
	}
	if grades != 1 {
		t.Fatalf("the session was graded %d times, want once", grades)
	}
	if _, ok := o.Session("s1"); ok {
		t.Fatal("the graded session was not ended")
	}
}
