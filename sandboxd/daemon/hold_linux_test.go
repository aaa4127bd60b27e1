package daemon

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/relay"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// slowHolding is a relay whose first Holding waits for proceed: it widens
// the window between a launch's look at the relay and what it does with
// the answer.
type slowHolding struct {
	mu      sync.Mutex
	holding bool
	dropped string
	asked   bool
	entered chan struct{}
	proceed chan struct{}
}

func (r *slowHolding) Hold()    { r.mu.Lock(); r.holding = true; r.mu.Unlock() }
func (r *slowHolding) Release() { r.mu.Lock(); r.holding = false; r.mu.Unlock() }
func (r *slowHolding) Drop(why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.holding {
		r.holding, r.dropped = false, why
	}
}
func (r *slowHolding) Holding() bool {
	r.mu.Lock()
	first := !r.asked
	r.asked = true
	r.mu.Unlock()
	if first {
		close(r.entered)
		<-r.proceed
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.holding
}
func (r *slowHolding) Status() sandboxapi.RelayStatus { return sandboxapi.RelayStatus{} }
func (r *slowHolding) LabelBranch(string, string, []string, *sandboxapi.BranchLabel) error {
	return nil
}
func (r *slowHolding) Durable() bool       { return true }
func (r *slowHolding) Flush() error        { return nil }
func (r *slowHolding) CapturePath() string { return "" }
func (r *slowHolding) RepointBranch(string, uint64, *sandboxapi.BranchLabel) (sandboxapi.RelayStatus, error) {
	return sandboxapi.RelayStatus{}, nil
}

func (r *slowHolding) state() (bool, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.holding, r.dropped
}

// A prepare that comes while a launch looks at the relay (to drop a hold a
// restore left) does not take its hold in between: the launch's look and
// its drop are one step with admission, so the checkpoint's hold is never
// dropped by a launch that came before it.
func TestPrepareDuringALaunchKeepsTheHold(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, "run1")
	s := newSubject(t, env, time.Second)
	rl := &slowHolding{entered: make(chan struct{}), proceed: make(chan struct{})}
	s.useRelay(rl)
	hd := membertest.StartMember(t, env, "run1", "sandbox.sb1", s, membertest.Options{StateFile: filepath.Join(t.TempDir(), "position.json")})
	id := s.prefix + "-new"
	done := make(chan error, 1)
	go func() {
		_, err := s.launch(context.Background(), events.Episode{Rollout: "r1"}.String(), false, nil, nil, sandboxd.Spec{ID: id, Command: "sleep 30"})
		done <- err
	}()
	<-rl.entered
	bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c1", 30*time.Second, hd.Name)})
	poll.Holds(t, time.Second, func() error {
		if h, _ := rl.state(); h {
			return errors.New("the prepare held the relay while a launch was deciding on its hold")
		}
		return nil
	})
	close(rl.proceed)
	if err := <-done; err != nil {
		t.Fatalf("launch: %v", err)
	}
	poll.Wait(t, 10*time.Second, "the prepare to hold the relay", func() bool { h, _ := rl.state(); return h })
	if h, dropped := rl.state(); !h || dropped != "" {
		t.Fatalf("checkpoint c1 is open: relay holding %v, dropped %q", h, dropped)
	}
	_, _ = s.sup.Cancel(context.Background(), id)
}

// failContinue fails every continue, as a thaw that does not take: the
// launch is killed (as the supervisor does).
type failContinue struct {
	launches
}

func (f failContinue) Continue(ctx context.Context, id string) (sandboxapi.PauseResult, error) {
	_, _ = f.launches.Cancel(ctx, id)
	return sandboxapi.PauseResult{}, errors.New("thaw: injected failure")
}

// startRelay serves a real model relay at upstream for the test.
func startRelay(t *testing.T, upstream string) *relay.Relay {
	t.Helper()
	rl, err := relay.New(relay.Config{Upstream: upstream, Logger: zerolog.New(zerolog.NewTestWriter(t)).Level(zerolog.InfoLevel)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
	done := make(chan error, 1)
	go func() { done <- rl.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("relay Serve: %v", err)
		}
	})
	poll.Wait(t, 5*time.Second, "the relay serving", func() bool { return rl.URL() != "" })
	return rl
}

// heldCall posts a model call to rl and returns the channel its status
// code comes on (0: no answer).
func heldCall(t *testing.T, rl *relay.Relay, body string) <-chan int {
	t.Helper()
	got := make(chan int, 1)
	go func() {
		resp, err := http.Post(rl.URL()+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			got <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	poll.Wait(t, 10*time.Second, "the harness's call held", func() bool { return rl.Status().Calls.Held >= 1 })
	return got
}

// restoredHold makes launch id of s as a restored snapshot leaves it:
// paused in a hold (pause 1) by a checkpoint this daemon never saw, the
// relay holding a call of its harness.
func restoredHold(t *testing.T, s *subject, rl *relay.Relay) (id string, answered <-chan int) {
	t.Helper()
	eps := s.AddWork(t, 1)
	id = s.ids[eps[0]]
	if _, err := s.sup.Pause(t.Context(), id, sandboxapi.ModeHold); err != nil {
		t.Fatal(err)
	}
	rl.Hold()
	return id, heldCall(t, rl, `{"q":"held"}`)
}

// A take-over whose continue fails (the launch is stopped) drops the calls
// the relay held for it: they never reach the model server, the harness
// that made them gets 503, and the relay holds no more.
func TestFailedTakeOverDropsTheHeldCalls(t *testing.T) {
	env := jstest.Start(t)
	model := make(chan struct{}, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		model <- struct{}{}
		_, _ = io.WriteString(w, `{}`)
	}))
	t.Cleanup(srv.Close)
	s := newSubject(t, env, time.Second)
	rl := startRelay(t, srv.URL)
	s.useRelay(rl)
	membertest.StartMember(t, env, "run1", "sandbox.sb1", s, membertest.Options{StateFile: filepath.Join(t.TempDir(), "position.json")})
	id, answered := restoredHold(t, s, rl)
	s.Daemon.launches = failContinue{s.gate}
	if _, err := s.Resume(t.Context(), sandboxapi.ResumeRequest{LaunchID: id, PauseSeq: 1, Identity: s.sup.Identity()}); err == nil {
		t.Fatal("Resume with a failing continue succeeded")
	}
	if rl.Holding() {
		t.Fatal("the relay still holds after a failed take-over")
	}
	if code := <-answered; code != http.StatusServiceUnavailable {
		t.Fatalf("the held call got %d, want 503 call_abandoned", code)
	}
	select {
	case <-model:
		t.Fatal("the model server got the call of a launch whose take-over failed")
	default:
	}
	if st := rl.Status(); st.Calls.Failed != 1 || st.Calls.Delivered != 0 {
		t.Fatalf("relay calls %+v: want the held call failed", st.Calls)
	}
}

// Resume is idempotent: asked again with the same launch, pause and
// identity once the launch is continued (its answer lost to a timeout),
// it answers as the first did; asked while the first may still be
// continuing, it waits for it and answers the same. Another pause seq is
// refused.
func TestResumeAnsweredAgain(t *testing.T) {
	env := jstest.Start(t)
	s := newSubject(t, env, time.Second)
	slow := &slowContinue{launches: s.gate, entered: make(chan struct{}), release: make(chan struct{})}
	s.Daemon.launches = slow
	membertest.StartMember(t, env, "run1", "sandbox.sb1", s, membertest.Options{StateFile: filepath.Join(t.TempDir(), "position.json")})
	eps := s.AddWork(t, 1)
	id := s.ids[eps[0]]
	if _, err := s.sup.Pause(t.Context(), id, sandboxapi.ModeHold); err != nil {
		t.Fatal(err)
	}
	slow.mu.Lock()
	slow.id = id
	slow.mu.Unlock()
	req := sandboxapi.ResumeRequest{LaunchID: id, PauseSeq: 1, Identity: s.sup.Identity()}
	type result struct {
		rep sandboxapi.PauseResult
		err error
	}
	first, second := make(chan result, 1), make(chan result, 1)
	go func() { rep, err := s.Resume(t.Context(), req); first <- result{rep, err} }()
	<-slow.entered
	go func() { rep, err := s.Resume(t.Context(), req); second <- result{rep, err} }()
	close(slow.release)
	a, b := <-first, <-second
	if a.err != nil || a.rep.State != sandboxapi.StateRunning {
		t.Fatalf("first Resume: %+v, %v", a.rep, a.err)
	}
	if b.err != nil || b.rep.PauseSeq != a.rep.PauseSeq || b.rep.State != a.rep.State || b.rep.Identity != a.rep.Identity {
		t.Fatalf("Resume asked during the first: %+v, %v; want %+v", b.rep, b.err, a.rep)
	}
	again, err := s.Resume(t.Context(), req)
	if err != nil || again.PauseSeq != a.rep.PauseSeq || again.State != sandboxapi.StateRunning {
		t.Fatalf("Resume asked again: %+v, %v; want %+v", again, err, a.rep)
	}
	if rec, err := s.sup.Status(id); err != nil || rec.State != sandboxapi.StateRunning || rec.Pauses.Count != 1 {
		t.Fatalf("launch after the take-over: %+v, %v", rec, err)
	}
	other := req
	other.PauseSeq = 2
	if _, err := s.Resume(t.Context(), other); !errors.Is(err, ErrNotHolding) {
		t.Fatalf("Resume of pause 2: %v, want ErrNotHolding", err)
	}
	_, _ = s.sup.Cancel(context.Background(), id)
}

// A prepare that comes while a take-over is continuing its launch finds
// the relay holding (the restore's hold): the take-over then leaves the
// relay held for that checkpoint, whose resume releases it, and the held
// call reaches the model server once, after the resume.
func TestPrepareDuringATakeOverHandsTheHoldOn(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, "run1")
	model := make(chan struct{}, 8)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		model <- struct{}{}
		_, _ = io.WriteString(w, `{}`)
	}))
	t.Cleanup(srv.Close)
	s := newSubject(t, env, time.Second)
	rl := startRelay(t, srv.URL)
	s.useRelay(rl)
	slow := &slowContinue{launches: s.gate, entered: make(chan struct{}), release: make(chan struct{})}
	s.Daemon.launches = slow
	hd := membertest.StartMember(t, env, "run1", "sandbox.sb1", s, membertest.Options{StateFile: filepath.Join(t.TempDir(), "position.json")})
	id, answered := restoredHold(t, s, rl)
	slow.mu.Lock()
	slow.id = id
	slow.mu.Unlock()
	resumed := make(chan error, 1)
	go func() {
		_, err := s.Resume(t.Context(), sandboxapi.ResumeRequest{LaunchID: id, PauseSeq: 1, Identity: s.sup.Identity()})
		resumed <- err
	}()
	<-slow.entered
	pseq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c3", 30*time.Second, hd.Name)})
	poll.Wait(t, 10*time.Second, "the prepare to open c3", func() bool {
		s.Daemon.mu.Lock()
		defer s.Daemon.mu.Unlock()
		return s.core.Open() == "c3"
	})
	close(slow.release)
	if err := <-resumed; err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if !rl.Holding() {
		t.Fatal("the take-over released the relay while checkpoint c3 is open")
	}
	if pa := bridge.Ack(pseq, events.PhasePrepare, hd.Name).(events.PrepareAck); !pa.Ready {
		t.Fatalf("c3's prepare: %+v", pa)
	}
	bridge.Ack(bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c3", 30*time.Second, hd.Name)}), events.PhaseResume, hd.Name)
	if rl.Holding() {
		t.Fatal("c3's resume left the relay holding: the hold the take-over handed on was never released")
	}
	if code := <-answered; code != http.StatusOK {
		t.Fatalf("the held call got %d after c3's resume, want 200", code)
	}
	if n := len(model); n != 1 {
		t.Fatalf("the model server got %d calls, want the held one once", n)
	}
	_, _ = s.sup.Cancel(context.Background(), id)
}
