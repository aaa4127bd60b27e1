package agent

import (
	"context"
	"fmt"
	"iter"
	"maps"
	"slices"
	"sync"
	"testing"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// subject is the agent as the conformance suite drives it: its work is
// rollouts queued at their seed bookmark (the one slot is taken), which a
// checkpoint exports there; a restore installs bookmarks the next attempt
// continues from. A held run is one the subject reports busy: a blocker at
// prepare, and not at a boundary for an export.
type subject struct {
	*Agent
	prefix string

	membertest.Pacer

	mu   sync.Mutex
	n    int
	held map[*run]int // holds on each run
}

// Prepare is the agent's, with every held run a blocker.
func (s *subject) Prepare(ctx context.Context, cp member.Checkpoint) (member.Report, error) {
	rep, err := s.Agent.Prepare(ctx, cp)
	if err != nil {
		return rep, err
	}
	for _, r := range s.busy() {
		rep.Blockers = append(rep.Blockers, r.key)
		rep.Counts["parked"]--
	}
	slices.Sort(rep.Blockers)
	rep.Ready = len(rep.Blockers) == 0
	return rep, nil
}

// Export paces the participant's export for the suite (PaceWrites); a
// held run fails it as a run between boundaries does.
func (s *subject) Export(ctx context.Context, c events.Commit) iter.Seq2[events.Record, error] {
	if busy := s.busy(); len(busy) > 0 {
		return member.Records(nil, fmt.Errorf("agent: %s is not at a boundary for %s", busy[0].key, c.CheckpointID))
	}
	return s.Pace(ctx, s.Agent.Export(ctx, c))
}

// busy returns the held runs that are still the agent's, restarts aside
// (they never block).
func (s *subject) busy() []*run {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Agent.mu.Lock()
	defer s.Agent.mu.Unlock()
	var out []*run
	for r, n := range s.held {
		if n > 0 && s.runs[r.ep.Rollout] == r && !r.bm.Restart {
			out = append(out, r)
		}
	}
	return out
}

func (s *subject) Bind(m *member.Member) { s.member = m }

func (s *subject) AddWork(t testing.TB, n int) []events.Episode {
	t.Helper()
	var eps []events.Episode
	for range n {
		s.mu.Lock()
		s.n++
		id := fmt.Sprintf("%s-w%d", s.prefix, s.n)
		s.mu.Unlock()
		if _, err := s.start(t.Context(), agentapi.Request{RolloutID: id, Task: task}); err != nil {
			t.Fatalf("start %s: %v", id, err)
		}
		eps = append(eps, events.Episode{Rollout: id})
	}
	return eps
}

func (s *subject) Hold(ep events.Episode) func() {
	s.Agent.mu.Lock()
	r := s.runs[ep.Rollout]
	s.Agent.mu.Unlock()
	if r != nil {
		s.mu.Lock()
		s.held[r]++
		s.mu.Unlock()
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			if r != nil {
				s.mu.Lock()
				s.held[r]--
				s.mu.Unlock()
			}
			s.member.Notify()
		})
	}
}

func (s *subject) Live() []string {
	s.Agent.mu.Lock()
	defer s.Agent.mu.Unlock()
	keys := map[string]bool{}
	for _, r := range s.runs {
		keys[r.key] = true
	}
	for _, bm := range s.installed {
		keys[events.Episode{Rollout: bm.Rollout, Attempt: bm.Attempt}.String()] = true
	}
	return slices.Sorted(maps.Keys(keys))
}

// TestConformance runs the member conformance suite against the agent.
func TestConformance(t *testing.T) {
	membertest.Run(t, membertest.Suite{
		Kind: events.KindAgent,
		New: func(t *testing.T, env *jstest.Env, name events.Member) membertest.Subject {
			a, err := newAgent(Config{Run: "run1", Name: name.Name(), JS: env.JS, Bus: env.Bus, Owner: "o1", Concurrency: 1,
				Adapter: testAdapter{}, Logger: testLogger(t)})
			if err != nil {
				t.Fatal(err)
			}
			a.slots <- struct{}{} // the one slot is taken: every run waits at seed
			a.running = true      // its member runs; the suite runs it
			t.Cleanup(a.shutdown)
			return &subject{Agent: a, prefix: name.Name(), held: map[*run]int{}}
		},
	})
}
