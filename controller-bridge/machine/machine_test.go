package machine

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
)

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// prep drives a machine through a checkpoint's prepare publish to its
// gathering, for the edge cases of ack gathering.
type prep struct {
	t   *testing.T
	m   *Machine
	now time.Time
	ev  events.Prepare
	out []Effect // the effects of the last step
}

func newPrep(t *testing.T, epoch uint64, members ...events.Member) *prep {
	t.Helper()
	p := &prep{t: t, m: New(Config{Run: "run1", PhaseTimeout: 10 * time.Second, ResumeTimeout: 5 * time.Second}), now: t0}
	effs := p.step(CheckpointAsked{Request: bridgeapi.CheckpointRequest{ID: "c1"},
		View: View{Seq: 4, StreamSeq: 40, Epoch: epoch, Members: members}})
	p.ev = effs[0].(PublishPhase).Event.(events.Prepare)
	p.step(PhasePublished{Event: p.ev, StreamSeq: 41, ID: "x", At: p.now})
	return p
}

func (p *prep) step(in Input) []Effect {
	p.t.Helper()
	effs, err := p.m.Step(p.now, in)
	if err != nil {
		p.t.Fatalf("step %T: %v", in, err)
	}
	p.out = effs
	return effs
}

func (p *prep) ack(m events.Member, stream uint64, edit func(*events.PrepareAck)) {
	a := events.PrepareAck{AckHeader: events.AckHeader{Run: "run1", Member: m, Seq: p.ev.Seq, CheckpointID: "c1", Epoch: p.ev.Epoch, OK: true}, Ready: true}
	if edit != nil {
		edit(&a)
	}
	p.step(AckSeen{Ack: a, StreamSeq: stream})
}

// verdict says what the machine decided: "commit" (all ready), "abort",
// or "waiting".
func (p *prep) verdict() string {
	switch p.m.State() {
	case StateCommitting:
		return "commit"
	case StateAborting:
		return "abort"
	case StatePreparing:
		return "waiting"
	}
	return p.m.State().String()
}

func (p *prep) noted() bool {
	for _, e := range p.out {
		if _, ok := e.(Note); ok {
			return true
		}
	}
	return false
}

// TestGatherEdges: the edge cases of gathering a phase's acks (PROTOCOL
// §5, Bridge rules and Epochs fence zombies).
func TestGatherEdges(t *testing.T) {
	a, b, s := events.Member("agent.a"), events.Member("owner.b"), events.Member("sandbox.s")
	cases := []struct {
		name    string
		members []events.Member
		epoch   uint64
		run     func(p *prep)
		want    string
		check   func(t *testing.T, p *prep)
	}{
		{"an ack of an older epoch is ignored, and noted", []events.Member{a}, 2, func(p *prep) {
			p.step(GatherStarted{Seq: p.ev.Seq})
			p.ack(a, 42, func(x *events.PrepareAck) { x.Epoch = 1 })
			if !p.noted() {
				p.t.Error("a stale ack was not noted")
			}
		}, "waiting", nil},
		{"the same member's ack of the right epoch counts", []events.Member{a}, 2, func(p *prep) {
			p.step(GatherStarted{Seq: p.ev.Seq})
			p.ack(a, 42, func(x *events.PrepareAck) { x.Epoch = 1 })
			p.ack(a, 43, nil)
		}, "commit", nil},
		{"foreign acks count for nothing", []events.Member{a}, 0, func(p *prep) {
			p.step(GatherStarted{Seq: p.ev.Seq})
			p.ack(a, 42, func(x *events.PrepareAck) { x.Seq = 3 })
			p.ack(a, 43, func(x *events.PrepareAck) { x.CheckpointID = "c0" })
			p.ack("agent.stranger", 44, nil)
			p.step(AckSeen{Ack: events.CommitAck{AckHeader: events.AckHeader{Run: "run1", Member: a, Seq: p.ev.Seq, CheckpointID: "c1", OK: true}}, StreamSeq: 45})
			p.step(AckSeen{StreamSeq: 46}) // did not decode
		}, "waiting", nil},
		{"a sandbox daemon that left is excused", []events.Member{a, s}, 0, func(p *prep) {
			p.step(GatherStarted{Seq: p.ev.Seq})
			p.step(MemberGone{Member: s, Why: GoneLeft})
			p.ack(a, 42, nil)
		}, "commit", func(t *testing.T, p *prep) {
			c := p.out[len(p.out)-1].(PublishPhase).Event.(events.Commit)
			if len(c.Members) != 1 || c.Members[0] != a {
				t.Errorf("the commit asks %v, want only %s", c.Members, a)
			}
		}},
		{"a sandbox daemon not alive at the start is excused", []events.Member{a, s}, 0, func(p *prep) {
			p.step(GatherStarted{Seq: p.ev.Seq})
			p.ack(a, 42, nil)
			p.step(MemberGone{Member: s, Why: GoneNotAlive})
		}, "commit", nil},
		{"a sandbox daemon alive and not ready still blocks", []events.Member{a, s}, 0, func(p *prep) {
			p.step(GatherStarted{Seq: p.ev.Seq})
			p.ack(a, 42, nil)
			p.ack(s, 43, func(x *events.PrepareAck) { x.Ready = false; x.SetBlockers([]string{"launch-1"}) })
		}, "abort", nil},
		{"an agent that dies fails the phase at once", []events.Member{a, b}, 0, func(p *prep) {
			p.step(GatherStarted{Seq: p.ev.Seq})
			p.step(MemberGone{Member: b, Why: GoneLeft})
		}, "abort", func(t *testing.T, p *prep) {
			// The other member had not answered yet: it is named too.
			if !strings.Contains(show(p.out[len(p.out)-1]), `reason="2 of 2 members`) {
				t.Errorf("abort %s", show(p.out[len(p.out)-1]))
			}
		}},
		{"a member replaced by a new process is gone", []events.Member{a, b}, 0, func(p *prep) {
			p.step(GatherStarted{Seq: p.ev.Seq})
			p.ack(a, 42, nil)
			p.step(MemberGone{Member: b, Why: GoneReplaced})
		}, "abort", nil},
		{"a member that answered and then died is not dead", []events.Member{a, b}, 0, func(p *prep) {
			p.step(GatherStarted{Seq: p.ev.Seq})
			p.ack(b, 42, nil)
			p.step(MemberGone{Member: b, Why: GoneLeft})
			p.ack(a, 43, nil)
		}, "commit", nil},
		{"past the deadline with a backlog, the recorded acks are read first", []events.Member{a, b}, 0, func(p *prep) {
			p.step(GatherStarted{Seq: p.ev.Seq, Backlog: 50})
			p.now = p.now.Add(time.Minute)
			p.step(Tick{})
			if len(p.out) != 1 || p.out[0] != (SetTimer{After: BacklogPoll}) {
				p.t.Errorf("a tick past the deadline with a backlog: %v", p.out)
			}
			p.ack(a, 47, nil)
			p.ack(b, 50, nil)
		}, "commit", nil},
		{"past the deadline once the backlog is read, a missing ack fails", []events.Member{a, b}, 0, func(p *prep) {
			p.step(GatherStarted{Seq: p.ev.Seq, Backlog: 50})
			p.now = p.now.Add(time.Minute)
			p.ack(a, 47, nil)
			p.step(AckSeen{StreamSeq: 50}) // the last recorded message, undecodable
		}, "abort", func(t *testing.T, p *prep) {
			if !strings.Contains(show(p.out[len(p.out)-1]), `reason="1 of 2 members`) {
				t.Errorf("abort %s", show(p.out[len(p.out)-1]))
			}
		}},
		{"a tick before the deadline waits on", []events.Member{a}, 0, func(p *prep) {
			p.step(GatherStarted{Seq: p.ev.Seq})
			p.now = p.now.Add(3 * time.Second)
			p.step(Tick{})
			if len(p.out) != 1 || p.out[0] != (SetTimer{After: 8 * time.Second}) {
				p.t.Errorf("an early tick: %v", p.out)
			}
		}, "waiting", nil},
		{"no member: complete at once", nil, 0, func(p *prep) {
			p.step(GatherStarted{Seq: p.ev.Seq})
		}, "commit", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := newPrep(t, c.epoch, c.members...)
			c.run(p)
			if got := p.verdict(); got != c.want {
				t.Fatalf("verdict %s, want %s (last effects %v)", got, c.want, p.out)
			}
			if c.check != nil {
				c.check(t, p)
			}
		})
	}
}

// TestSecondBridgeFences: a second bridge that publishes in between fences
// this one (PROTOCOL §5, Epochs fence zombies; the bridge's fenced
// publish): the publish refused ends the operation, a held checkpoint is
// no longer committed, and the machine is idle for the next ask.
func TestSecondBridgeFences(t *testing.T) {
	fenced := EffectFailed{Err: fmt.Errorf("%w: publishing: wrong last sequence", bridgeapi.ErrFenced)}
	t.Run("a publish refused", func(t *testing.T) {
		p := newPrep(t, 0, "agent.a")
		p.step(GatherStarted{Seq: p.ev.Seq})
		p.ack("agent.a", 42, nil)
		effs := p.step(fenced)
		f, ok := effs[0].(Finish)
		if !ok || !errors.Is(f.Err, bridgeapi.ErrFenced) || p.m.State() != StateIdle {
			t.Fatalf("after a fenced commit publish: %v, state %s", effs, p.m.State())
		}
	})
	t.Run("a held checkpoint taken over", func(t *testing.T) {
		m := New(Config{Run: "run1", PhaseTimeout: time.Second, ResumeTimeout: time.Second})
		step := func(in Input) []Effect {
			effs, err := m.Step(t0, in)
			if err != nil {
				t.Fatalf("%T: %v", in, err)
			}
			return effs
		}
		ev := step(CheckpointAsked{Request: bridgeapi.CheckpointRequest{ID: "c1", Hold: true}, View: View{Members: []events.Member{"agent.a"}}})[0].(PublishPhase).Event
		step(PhasePublished{Event: ev, StreamSeq: 1, ID: "mine", At: t0})
		step(GatherStarted{Seq: 1})
		step(AckSeen{Ack: events.PrepareAck{AckHeader: events.AckHeader{Run: "run1", Member: "agent.a", Seq: 1, CheckpointID: "c1", OK: true}, Ready: true}, StreamSeq: 2})
		if m.Held() != "c1" {
			t.Fatalf("held %q, state %s", m.Held(), m.State())
		}
		effs := step(CommitAsked{ID: "c1", View: View{Seq: 2, StreamSeq: 3, LastID: "the other bridge's"}})
		if f, ok := effs[0].(Finish); !ok || !errors.Is(f.Err, bridgeapi.ErrFenced) || m.State() != StateIdle {
			t.Fatalf("a commit after a takeover: %v, state %s", effs, m.State())
		}
	})
}

// TestTransitions: a transition that successors does not list is refused
// with an error naming both states; every state has a name.
func TestTransitions(t *testing.T) {
	if err := CheckTransition(StateIdle, StatePreparing); err != nil {
		t.Errorf("idle → preparing: %v", err)
	}
	err := CheckTransition(StateCommitted, StatePreparing)
	if !errors.Is(err, ErrTransition) || !strings.Contains(err.Error(), "committed") || !strings.Contains(err.Error(), "preparing") {
		t.Errorf("committed → preparing: %v", err)
	}
	for s := StateIdle; s <= StateReleasing; s++ {
		if strings.HasPrefix(s.String(), "State(") {
			t.Errorf("state %d has no name", s)
		}
		if _, ok := successors[s]; !ok {
			t.Errorf("state %s lists no successors", s)
		}
	}
	if _, err := New(Config{}).Step(t0, LatestMoved{}); !errors.Is(err, ErrUnexpected) {
		t.Errorf("an answer to nothing asked: %v", err)
	}
}
