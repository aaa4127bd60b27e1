package daemon

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// slowContinue holds the continue of one launch until release, as a thaw
// under TCG takes its time.
type slowContinue struct {
	launches
	mu      sync.Mutex
	id      string // the launch whose next continue waits
	entered chan struct{}
	release chan struct{}
}

func (s *slowContinue) Continue(ctx context.Context, id string) (sandboxapi.PauseResult, error) {
	s.mu.Lock()
	slow := id == s.id
	if slow {
		s.id = "" // once
	}
	s.mu.Unlock()
	if slow {
		close(s.entered)
		<-s.release
	}
	return s.launches.Continue(ctx, id)
}

// A prepare that comes while a take-over (Resume) is continuing a launch a
// restore kept held neither takes it for one its agent paused (and leaves
// it running through the checkpoint) nor pauses it under a mark that the
// end of the take-over clears (and leaves it paused after the resume): it
// reports the launch as a blocker until the take-over is done, then pauses
// it, and the checkpoint's resume continues it.
func TestPrepareDuringATakeOver(t *testing.T) {
	env := jstest.Start(t)
	bridge := membertest.NewBridge(t, env, "run1")
	s := newSubject(t, env, time.Second)
	slow := &slowContinue{launches: s.gate, entered: make(chan struct{}), release: make(chan struct{})}
	s.Daemon.launches = slow
	hd := membertest.StartMember(t, env, "run1", "sandbox.sb1", s, membertest.Options{StateFile: filepath.Join(t.TempDir(), "position.json")})
	eps := s.AddWork(t, 1)
	id := s.ids[eps[0]]
	// The launch as a restored snapshot leaves it: paused (pause 1) by a
	// checkpoint this daemon never saw.
	if _, err := s.sup.Pause(t.Context(), id, sandboxapi.ModeHold); err != nil {
		t.Fatal(err)
	}
	slow.mu.Lock()
	slow.id = id
	slow.mu.Unlock()
	type result struct {
		rep sandboxapi.PauseResult
		err error
	}
	resumed := make(chan result, 1)
	go func() {
		rep, err := s.Resume(t.Context(), sandboxapi.ResumeRequest{LaunchID: id, PauseSeq: 1, Identity: s.sup.Identity()})
		resumed <- result{rep, err}
	}()
	<-slow.entered

	pseq := bridge.Publish(events.Prepare{PhaseHeader: bridge.Header("c3", 30*time.Second, hd.Name)})
	poll.Wait(t, 10*time.Second, "the prepare to find the launch resuming", func() bool {
		s.Daemon.mu.Lock()
		defer s.Daemon.mu.Unlock()
		return s.core.Open() == "c3"
	})
	s.Daemon.mu.Lock()
	pausing, mark := s.core.Pausing(id), s.core.Mark(id)
	s.Daemon.mu.Unlock()
	if pausing || mark != "" {
		t.Fatalf("the prepare touched a launch being taken over: pausing %v, mark %q", pausing, mark)
	}
	close(slow.release)
	if r := <-resumed; r.err != nil || r.rep.State != sandboxapi.StateRunning {
		t.Fatalf("Resume: %+v, %v", r.rep, r.err)
	}
	pa := bridge.Ack(pseq, events.PhasePrepare, hd.Name).(events.PrepareAck)
	if !pa.Ready || pa.Pause == nil || pa.Pause.PauseSeq != 2 {
		t.Fatalf("prepare ack: ready %v pause %+v; want the taken-over launch paused as pause 2", pa.Ready, pa.Pause)
	}
	rseq := bridge.Publish(events.Resume{PhaseHeader: bridge.Header("c3", 30*time.Second, hd.Name)})
	if ra := bridge.Ack(rseq, events.PhaseResume, hd.Name).(events.ResumeAck); !ra.OK || ra.Pause == nil {
		t.Fatalf("resume ack %+v: want the launch continued", ra)
	}
	if rec, err := s.sup.Status(id); err != nil || rec.State != sandboxapi.StateRunning || rec.Pauses.Seq != 2 {
		t.Fatalf("the launch after the checkpoint: %+v, %v; want running after pause 2", rec, err)
	}
}
