package owner

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
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
	g := newGatedGrade(t)
	o, c, d, ctx, entered, release := g.o, g.c, g.d, g.ctx, g.entered, g.release
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

// The members of a checkpoint prepare each on their own: an agent's
// prepare may hold a run at its verify bookmark while the owner, whose
// prepare comes after, has ended the graded session and sent the verdict.
// The owner's export carries the verdict of the ended
// session, and a restored owner answers the restored run's verify with
// it: the grade ran once, and the rollout is not lost for want of a
// sandbox. A retire forgets the verdict; a malformed verdict record is
// refused by name.
func TestVerdictOfAnEndedSessionIsExportedAndRestored(t *testing.T) {
	env := jstest.Start(t)
	d := newDir(t)
	grades := 0
	cfg := baseConfig(t, env, d, "o1")
	cfg.TaskKind = TaskFuncs{GradeFn: func(ctx context.Context, _ Execer, s *Session) (json.RawMessage, error) {
		grades++
		return json.RawMessage(`{"reward":0.5}`), nil
	}}
	a := newOwner(t, cfg)
	ca := serve(t, env, a)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	start(t, a, "s1", ep("r1", 0))
	start(t, a, "s2", ep("r2", 0))
	if v, err := ca.VerifyEnd(ctx, ownerapi.VerifyRequest{SessionID: "s1", End: true}); err != nil || string(v.Result) != `{"reward":0.5}` {
		t.Fatalf("verify: %+v %v", v, err)
	}
	if _, ok := a.Session("s1"); ok {
		t.Fatal("the graded session was not ended")
	}
	recs := checkpoint(t, a, "c1")
	if len(recs) != 2 || recs[0].Key != "r1" || recs[1].Key != "r2" {
		t.Fatalf("records %+v, want the verdict of r1 and the session of r2", recs)
	}
	if r := decode(t, recs[0]); r.Session != "s1" || string(r.Verdict) != `{"reward":0.5}` || r.Sandbox != (ownerapi.SandboxRef{}) {
		t.Fatalf("verdict record %s", recs[0].Data)
	}
	if got := snapshots(t, d); !slices.Equal(got, []string{"c1-s2"}) {
		t.Fatalf("snapshots %v: the ended session has none", got)
	}

	// A fresh owner (after a crash) restores the checkpoint; the restored
	// run at its verify bookmark asks again.
	cfgB := cfg
	cfgB.Name = "o2" // its own service: o1's answers from memory are not asked
	b := newOwner(t, cfgB)
	cb := serve(t, env, b)
	restore := events.Restore{PhaseHeader: events.PhaseHeader{Run: testRun, CheckpointID: "restore-1", Epoch: 1}, Source: "c1"}
	installed, err := b.Install(ctx, restore, recs)
	if err != nil || !slices.Equal(installed, []events.Episode{ep("r1", 0), ep("r2", 0)}) {
		t.Fatalf("Install: %v %v", installed, err)
	}
	if _, ok := b.Session("s1"); ok {
		t.Fatal("a verdict was installed as a live session")
	}
	v, err := cb.VerifyEnd(ctx, ownerapi.VerifyRequest{SessionID: "s1", End: true})
	if err != nil || string(v.Result) != `{"reward":0.5}` {
		t.Fatalf("verify of the restored graded session: %+v %v, want the kept verdict", v, err)
	}
	if grades != 1 {
		t.Fatalf("graded %d times, want once", grades)
	}
	// The restored owner exports the verdict again (the restored run may
	// still be at verify at its next checkpoint).
	if recs := checkpoint(t, b, "c2"); len(recs) != 2 || decode(t, recs[0]).Session != "s1" || decode(t, recs[0]).Verdict == nil {
		t.Fatalf("records after the restore: %+v", recs)
	}
	// A retire of the restored attempt forgets it.
	if err := b.Retire(ctx, []events.Episode{ep("r1", 1)}); err != nil {
		t.Fatal(err)
	}
	if _, err := cb.VerifyEnd(ctx, ownerapi.VerifyRequest{SessionID: "s1", End: true}); !isServiceCode(err, "no_sandbox") {
		t.Fatalf("verify after the retire: %v, want no_sandbox", err)
	}

	// A verdict record that names a sandbox too is refused, naming it.
	bad := events.Record{Key: "r3", Data: json.RawMessage(`{"session":"s3","verdict":{"reward":1},"sandbox":{"provider":"dir","snapshot":"x","sandbox_id":"y"}}`)}
	c := newOwner(t, cfg)
	if _, err := c.Install(ctx, restore, []events.Record{bad}); !errors.Is(err, ErrRecord) || !strings.Contains(err.Error(), "data.verdict") {
		t.Fatalf("Install of a verdict naming a sandbox: %v, want ErrRecord naming data.verdict", err)
	}
	if err := b.EndSession(ctx, "s2"); err != nil {
		t.Fatal(err)
	}
	// Each owner releases the snapshots it took: b those of c2, a those of
	// c1 (b stands for a's successor under another name, which releases
	// none of a's).
	for _, o := range []*Owner{b, a} {
		if _, err := o.Release(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
}

func isServiceCode(err error, code string) bool {
	var se *jetstream.ServiceError
	return errors.As(err, &se) && se.Code == code
}

// A verify asked again and again while its grade runs (an agent asks
// again every AskAgain) holds one waiter: each repeat takes the place of
// the one before it, which is answered that a later request gets the
// verdict, while the grade goes on once.
func TestVerifyRepeatTakesThePlaceOfTheOneBefore(t *testing.T) {
	g := newGatedGrade(t)
	o, c, ctx, entered, release := g.o, g.c, g.ctx, g.entered, g.release
	type answer struct {
		v   ownerapi.VerifyResult
		err error
	}
	ask := func() <-chan answer {
		got := make(chan answer, 1)
		go func() {
			v, err := c.VerifyEnd(ctx, ownerapi.VerifyRequest{SessionID: "s1", End: true})
			got <- answer{v, err}
		}()
		return got
	}
	waiter := func() chan struct{} {
		o.mu.Lock()
		defer o.mu.Unlock()
		if f := o.verifies["s1"]; f != nil {
			return f.waiter
		}
		return nil
	}
	first := ask()
	<-entered
	second := ask()
	poll.Wait(t, 10*time.Second, "the repeat to wait", func() bool { return waiter() != nil })
	w := waiter()
	third := ask()
	a := <-second // before the grade ends
	if !isServiceCode(a.err, "asked_again") {
		t.Fatalf("the repeat a later one replaced: %+v, want told a later request gets the verdict", a)
	}
	poll.Wait(t, 10*time.Second, "the third to wait", func() bool { return waiter() != w })
	close(release)
	for _, got := range []<-chan answer{first, third} {
		if a := <-got; a.err != nil || string(a.v.Result) != `{"reward":1}` {
			t.Fatalf("verdict: %+v, want the one grade's", a)
		}
	}
}

// gatedGrade is an owner o1, served, whose grade signals entered and waits
// for release, with session s1 started: a grade that runs as long as a
// test wants.
type gatedGrade struct {
	o                *Owner
	c                *ownerapi.Client
	d                fullProvider
	ctx              context.Context
	entered, release chan struct{}
}

func newGatedGrade(t *testing.T) gatedGrade {
	t.Helper()
	env := jstest.Start(t)
	d := newDir(t)
	g := gatedGrade{d: d, entered: make(chan struct{}, 1), release: make(chan struct{})}
	cfg := baseConfig(t, env, d, "o1")
	cfg.TaskKind = TaskFuncs{GradeFn: func(ctx context.Context, _ Execer, s *Session) (json.RawMessage, error) {
		g.entered <- struct{}{}
		select {
		case <-g.release:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		return json.RawMessage(`{"reward":1}`), nil
	}}
	g.o = newOwner(t, cfg)
	g.c = serve(t, env, g.o)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	g.ctx = ctx
	if _, err := g.o.StartSession(ctx, "s1", ep("r1", 0), provider.Spec{}); err != nil {
		t.Fatal(err)
	}
	return g
}
