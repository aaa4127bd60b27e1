package agent

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
)

func record(t *testing.T, key string, bm agentapi.Bookmark) events.Record {
	t.Helper()
	b, err := json.Marshal(bm)
	if err != nil {
		t.Fatal(err)
	}
	return events.Record{Key: key, Data: b}
}

var task = json.RawMessage(`{"task":"t","prompt":"p"}`)

// A continuation at return returns the stored result: no owner call, no
// launch; the launch log of the checkpointed attempt comes with it.
func TestContinuationAtReturnReturnsTheStoredResult(t *testing.T) {
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stored := &agentapi.Result{RolloutID: "r1", Attempt: 0, Episode: "r1", Adapter: "scripted", Answer: json.RawMessage(`"done"`),
		Verdict: json.RawMessage(`{"reward":1}`)}
	launches := []agentapi.LaunchRecord{{ID: "r1.l1", Sandbox: "sb1", Ended: agentapi.LaunchFinished, Why: "first launch"}}
	bm := agentapi.Bookmark{V: 1, Next: agentapi.StageReturn, Rollout: "r1", Task: task, Session: "r1", Result: stored, Launches: launches}
	if eps, err := w.agent.Install(ctx, events.Restore{}, []events.Record{record(t, "r1", bm)}); err != nil || len(eps) != 1 {
		t.Fatalf("Install: %v %v", eps, err)
	}
	res, err := w.agent.Rollout(ctx, agentapi.Request{RolloutID: "r1", Attempt: 1, Task: task})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Verdict) != `{"reward":1}` || string(res.Answer) != `"done"` || len(res.Launches) != 1 || res.Launches[0].ID != "r1.l1" {
		t.Fatalf("result %+v, want the stored one", res)
	}
	if n := w.grades.Load(); n != 0 {
		t.Fatalf("%d grades, want none", n)
	}
}

// A continuation at verify grades again without launching, and the owner
// ends the session.
func TestContinuationAtVerifyGradesWithoutLaunching(t *testing.T) {
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// The session a restore forked for the next attempt.
	if _, err := w.owner.StartSession(ctx, "r1", events.Episode{Rollout: "r1", Attempt: 1}, provider.Spec{}); err != nil {
		t.Fatal(err)
	}
	launches := []agentapi.LaunchRecord{{ID: "r1.l1", Sandbox: "sb-r1", Ended: agentapi.LaunchFinished}}
	bm := agentapi.Bookmark{V: 1, Next: agentapi.StageVerify, Rollout: "r1", Task: task, Session: "r1", Owner: "o1", Answer: json.RawMessage(`"42"`),
		Launches: launches}
	if _, err := w.agent.Install(ctx, events.Restore{}, []events.Record{record(t, "r1", bm)}); err != nil {
		t.Fatal(err)
	}
	res, err := w.agent.Rollout(ctx, agentapi.Request{RolloutID: "r1", Attempt: 1, Task: task})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Restored || string(res.Verdict) != `{"reward":1}` || string(res.Answer) != `"42"` || len(res.Launches) != 1 || res.Episode != "r1-a1" {
		t.Fatalf("result %+v", res)
	}
	if n := w.grades.Load(); n != 1 {
		t.Fatalf("%d grades, want 1", n)
	}
	if _, ok := w.owner.Session("r1"); ok {
		t.Fatal("the verified session was not ended")
	}
}

// Install is all or none: a malformed or unknown-version bookmark fails the
// restore with an error naming the record, and nothing is installed.
func TestInstallRefusesABadBookmarkAndInstallsNothing(t *testing.T) {
	w := newWorld(t)
	ctx := t.Context()
	good := record(t, "r1", agentapi.Bookmark{V: 1, Next: agentapi.StageSeed, Rollout: "r1", Task: task})
	for _, bad := range []events.Record{
		{Key: "r2", Data: json.RawMessage(`{"v":9,"next":"seed","rollout":"r2"}`)},
		{Key: "r2", Data: json.RawMessage(`{"v":1,"next":"fly","rollout":"r2"}`)},
		{Key: "r3", Data: json.RawMessage(`{"v":1,"next":"seed","rollout":"r2","task":{}}`)},
		{Key: "r2-a", Data: good.Data},
	} {
		_, err := w.agent.Install(ctx, events.Restore{}, []events.Record{good, bad})
		if err == nil || !strings.Contains(err.Error(), "record") {
			t.Fatalf("Install with %s: %v, want an error naming the record", bad.Data, err)
		}
		if n := len(w.agent.installed); n != 0 {
			t.Fatalf("%d bookmarks installed after a failed install", n)
		}
	}
}

// Requests are checked at the boundary: bad ids, a negative attempt, a
// task that is not JSON get 400; an attempt below the restored one is
// stale.
func TestRunEndpointRefusesBadRequests(t *testing.T) {
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	c, err := agentapi.NewClient(w.env.Conn, testRun, "a1")
	if err != nil {
		t.Fatal(err)
	}
	for _, body := range []agentapi.Request{
		{RolloutID: "../etc", Task: task},
		{RolloutID: "r.a1", Attempt: -1, Task: task},
		{RolloutID: "r-a3", Task: task},
		{RolloutID: "r1"},
		{RolloutID: "r1", Task: json.RawMessage(`{"prompt":"no task name"}`)},
	} {
		_, err := c.Rollout(ctx, body)
		var se *jetstream.ServiceError
		if !errors.As(err, &se) || se.Status != 400 {
			t.Errorf("Rollout(%+v) = %v, want 400", body, err)
		}
	}
	var raw json.RawMessage
	if err := jetstream.Call(ctx, w.env.Conn, events.ServiceSubject(testRun, w.agent.Name())+"."+agentapi.EndpointRun, map[string]any{"rollout_id": "r1", "bogus": 1}, &raw); err == nil {
		t.Error("an unknown field was accepted")
	}
	bm := agentapi.Bookmark{V: 1, Next: agentapi.StageSeed, Rollout: "r1", Attempt: 2, Task: task}
	if _, err := w.agent.Install(ctx, events.Restore{}, []events.Record{record(t, "r1-a2", bm)}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.agent.Rollout(ctx, agentapi.Request{RolloutID: "r1", Attempt: 1, Task: task}); !errors.Is(err, member.ErrStaleAttempt) {
		t.Fatalf("attempt 1 of a rollout restored as attempt 3: %v, want ErrStaleAttempt", err)
	}
}

// A rollout whose owner cannot capture its session is a restart: a prepare
// reports it as one (never a blocker), a commit does not export it, and
// when it is cancelled the cleanup rule closes its session.
func TestRestartOnlyRolloutIsNeverParked(t *testing.T) {
	w := newWorldOn(t, true)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := w.agent.Rollout(rctx, agentapi.Request{RolloutID: "r1", Task: task})
		done <- err
	}()
	// The dir sandbox runs no daemon: the launch waits for one, and the run
	// stays in its launch stage.
	poll.Wait(t, 10*time.Second, "the rollout to be marked a restart", func() bool {
		w.agent.mu.Lock()
		defer w.agent.mu.Unlock()
		r := w.agent.runs["r1"]
		return r != nil && r.bm.Restart
	})
	cp := member.Checkpoint{Run: testRun, ID: "c1", Seq: 1, Deadline: time.Now().Add(10 * time.Second)}
	rep, err := w.agent.Prepare(ctx, cp)
	if err != nil || !rep.Ready || len(rep.Blockers) != 0 || len(rep.Restarts) != 1 || rep.Restarts[0] != "r1" {
		t.Fatalf("prepare: %+v %v, want ready with restart r1", rep, err)
	}
	recs, err := membertest.Drain(w.agent.Export(ctx, events.Commit{PhaseHeader: events.PhaseHeader{CheckpointID: "c1"}}))
	if err != nil || len(recs) != 0 {
		t.Fatalf("export: %v %v, want no records", recs, err)
	}
	if err := w.agent.Resume(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if _, ok := w.owner.Session("r1"); !ok {
		t.Fatal("the session is gone before the rollout ended")
	}
	stop()
	if err := <-done; err == nil {
		t.Fatal("a cancelled rollout returned a result")
	}
	poll.Wait(t, 10*time.Second, "the cancelled rollout's session to be closed", func() bool {
		_, ok := w.owner.Session("r1")
		return !ok
	})
}

// A request asked again after its rollout ended gets the same answer; no
// second run of the attempt starts.
func TestRequestAskedAgainGetsTheSameAnswer(t *testing.T) {
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	stored := &agentapi.Result{RolloutID: "r1", Attempt: 1, Episode: "r1-a1", Adapter: "scripted", Verdict: json.RawMessage(`{"reward":1}`)}
	bm := agentapi.Bookmark{V: 1, Next: agentapi.StageReturn, Rollout: "r1", Task: task, Result: stored}
	if _, err := w.agent.Install(ctx, events.Restore{}, []events.Record{record(t, "r1", bm)}); err != nil {
		t.Fatal(err)
	}
	c, _ := agentapi.NewClient(w.env.Conn, testRun, "a1")
	first, err := c.Rollout(ctx, agentapi.Request{RolloutID: "r1", Attempt: 1, Task: task})
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.Rollout(ctx, agentapi.Request{RolloutID: "r1", Attempt: 1, Task: task})
	if err != nil || string(again.Verdict) != string(first.Verdict) || !again.Restored {
		t.Fatalf("asked again: %+v %v, want the first answer %+v", again, err, first)
	}
	if _, err := c.Rollout(ctx, agentapi.Request{RolloutID: "r1", Attempt: 0, Task: task}); err == nil {
		t.Fatal("an earlier attempt of a finished rollout ran")
	}
}

// A grade in flight is a boundary (PROTOCOL §6): a checkpoint taken while
// it runs finds the agent and the owner ready at once and exports the run
// at its verify bookmark and the session being graded; the result comes
// only after the resume. A restore of that checkpoint grades again on the
// fork and returns one result.
func TestCheckpointDoesNotWaitForAGrade(t *testing.T) {
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	gate := make(chan struct{})
	w.gate.Store(&gate)
	if _, err := w.owner.StartSession(ctx, "r1", events.Episode{Rollout: "r1", Attempt: 1}, provider.Spec{}); err != nil {
		t.Fatal(err)
	}
	bm := agentapi.Bookmark{V: 1, Next: agentapi.StageVerify, Rollout: "r1", Task: task, Session: "r1", Owner: "o1", Answer: json.RawMessage(`"42"`)}
	if _, err := w.agent.Install(ctx, events.Restore{}, []events.Record{record(t, "r1", bm)}); err != nil {
		t.Fatal(err)
	}
	type outcome struct {
		res agentapi.Result
		err error
	}
	first := make(chan outcome, 1)
	go func() {
		res, err := w.agent.Rollout(ctx, agentapi.Request{RolloutID: "r1", Attempt: 1, Task: task})
		first <- outcome{res, err}
	}()
	poll.Wait(t, 10*time.Second, "the grade to start", func() bool { return w.grades.Load() == 1 })

	cp := member.Checkpoint{Run: testRun, ID: "c1", Seq: 1, Deadline: time.Now().Add(10 * time.Second)}
	var arep member.Report
	poll.Wait(t, 10*time.Second, "the agent to report the run waiting for its grade", func() bool {
		var err error
		arep, err = w.agent.Prepare(ctx, cp)
		return err == nil && arep.Counts["verifying"] == 1
	})
	orep, err := w.owner.Prepare(ctx, cp)
	if !arep.Ready || err != nil || !orep.Ready || orep.Counts["grading"] != 1 {
		t.Fatalf("prepare while the grade runs: agent %+v, owner %+v %v; want both ready", arep, orep, err)
	}
	commit := events.Commit{PhaseHeader: events.PhaseHeader{Run: testRun, CheckpointID: "c1"}}
	arecs, err := membertest.Drain(w.agent.Export(ctx, commit))
	if err != nil || len(arecs) != 1 {
		t.Fatalf("agent export: %v %v", arecs, err)
	}
	if got, err := agentapi.DecodeBookmark(arecs[0].Data); err != nil || got.Next != agentapi.StageVerify || arecs[0].Key != "r1-a1" {
		t.Fatalf("exported %s %+v %v, want r1-a1 at its verify bookmark", arecs[0].Key, got, err)
	}
	orecs, err := membertest.Drain(w.owner.Export(ctx, commit))
	if err != nil || len(orecs) != 1 {
		t.Fatalf("owner export: %v %v", orecs, err)
	}

	close(gate)
	poll.Wait(t, 10*time.Second, "the grade to end", func() bool {
		rep, err := w.owner.Prepare(ctx, cp)
		return err == nil && rep.Counts["grading"] == 0
	})
	select {
	case o := <-first:
		t.Fatalf("a result while the checkpoint is open: %+v", o)
	default:
	}
	if err := w.owner.Resume(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	if err := w.agent.Resume(ctx, "c1"); err != nil {
		t.Fatal(err)
	}
	o := <-first
	if o.err != nil || string(o.res.Verdict) != `{"reward":1}` || o.res.Episode != "r1-a1" {
		t.Fatalf("the result after the resume: %+v", o)
	}

	// The fleet crashed after the checkpoint, and the controller never got
	// that result: the restored attempt grades again on the fork.
	restore := events.Restore{PhaseHeader: events.PhaseHeader{Run: testRun, CheckpointID: "restore-e1", Epoch: 1}, Source: "c1"}
	if _, err := w.owner.Install(ctx, restore, orecs); err != nil {
		t.Fatal(err)
	}
	if _, err := w.agent.Install(ctx, restore, arecs); err != nil {
		t.Fatal(err)
	}
	res, err := w.agent.Rollout(ctx, agentapi.Request{RolloutID: "r1", Attempt: 2, Task: task})
	if err != nil || !res.Restored || res.Episode != "r1-a2" || string(res.Verdict) != `{"reward":1}` {
		t.Fatalf("the restored attempt: %+v %v", res, err)
	}
	if n := w.grades.Load(); n != 2 {
		t.Fatalf("%d grades, want 2: the checkpointed one and the restored attempt's", n)
	}
	if _, ok := w.owner.Session("r1"); ok {
		t.Fatal("the restored session was not ended by its grade")
	}
	snaps, err := w.prov.Snapshots()
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range snaps {
		if err := w.prov.DeleteSnapshot(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
}

// An attempt asked again names the process it was sent to. Another process
// of the agent's name (one started since) refuses it, attempt_lost, and
// runs nothing: the first may have made model calls a run from the task
// would make again. The process it went to answers it; so does one a
// restore installed it in.
func TestAttemptAskedAgainOfAnotherProcessIsLost(t *testing.T) {
	w := newWorld(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := w.agent.Rollout(ctx, agentapi.Request{RolloutID: "r1", Task: task, SentTo: "gone"})
	if !errors.Is(err, ErrAttemptLost) {
		t.Fatalf("asked again of a successor: %v, want ErrAttemptLost", err)
	}
	if status, code := classify(err); status != 409 || code != agentapi.CodeAttemptLost {
		t.Errorf("answered %d %s, want 409 %s", status, code, agentapi.CodeAttemptLost)
	}
	if n := w.grades.Load(); n != 0 {
		t.Fatalf("%d grades after a refusal, want none", n)
	}

	stored := &agentapi.Result{RolloutID: "r2", Attempt: 1, Episode: "r2-a1", Adapter: "scripted", Answer: json.RawMessage(`"done"`),
		Verdict: json.RawMessage(`{"reward":1}`)}
	bm := agentapi.Bookmark{V: 1, Next: agentapi.StageReturn, Rollout: "r2", Attempt: 1, Task: task, Session: "r2", Result: stored}
	if _, err := w.agent.Install(ctx, events.Restore{}, []events.Record{record(t, "r2-a1", bm)}); err != nil {
		t.Fatal(err)
	}
	// A restore continues a checkpointed attempt as the next one.
	res, err := w.agent.Rollout(ctx, agentapi.Request{RolloutID: "r2", Attempt: 2, Task: task, SentTo: "gone"})
	if err != nil || string(res.Verdict) != `{"reward":1}` {
		t.Fatalf("an attempt a restore installed, asked again: %+v %v, want the stored result", res, err)
	}

	r, err := w.agent.start(ctx, agentapi.Request{RolloutID: "r3", Task: task, SentTo: w.agent.member.Instance()})
	if err != nil {
		t.Fatalf("asked again of the process it went to: %v, want it run", err)
	}
	r.cancel(errors.New("test: done"))
	<-r.done
}
