package membertest_test

import (
	"slices"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

func TestMain(m *testing.M) {
	leak.VerifyTestMain(m, jstest.LeakOptions()...)
}

// StartMembers gives a bridge test a fleet it can checkpoint: three
// members, agent.t0..t2, one blocked until released.
func TestStartMembers(t *testing.T) {
	env := jstest.Start(t)
	hs := membertest.StartMembers(t, env, "run1", 3, membertest.Options{Episodes: 2})
	var names []events.Member
	for i, h := range hs {
		if want := events.Member("agent.t" + string(rune('0'+i))); h.Name != want {
			t.Fatalf("member %d named %s, want %s", i, h.Name, want)
		}
		if live := h.Participant.Live(); len(live) != 2 {
			t.Fatalf("%s holds %v", h.Name, live)
		}
		names = append(names, h.Name)
	}
	b := membertest.NewBridge(t, env, "run1")
	hs[1].Participant.Block(events.Episode{Rollout: "t1-r0"})
	// The blocked member answers not ready shortly before the deadline;
	// the others must take the prepare before it, on a loaded machine too.
	seq := b.Publish(events.Prepare{PhaseHeader: b.Header("c1", 3*time.Second, names...)})
	for i, m := range names {
		a := b.Ack(seq, events.PhasePrepare, m).(events.PrepareAck)
		if a.Ready != (i != 1) {
			t.Fatalf("%s ready %v", m, a.Ready)
		}
	}
	if a := b.Ack(seq, events.PhasePrepare, names[1]).(events.PrepareAck); !slices.Equal(a.Blockers, []string{"t1-r0"}) {
		t.Fatalf("blockers %v", a.Blockers)
	}
	rseq := b.Publish(events.Resume{PhaseHeader: b.Header("c1", 10*time.Second, names...)})
	for _, m := range names {
		if c := membertest.Code(b.Ack(rseq, events.PhaseResume, m)); c != "" {
			t.Fatalf("%s: resume %s", m, c)
		}
	}
	if err := hs[2].Stop(); err != nil {
		t.Fatal(err)
	}
	if err := hs[2].Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}
