package owner

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
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
	"github.com/stillpoint/stillpoint/participants/owner/provider"
	"github.com/stillpoint/stillpoint/participants/owner/provider/dir"
)

// subject is the owner as the conformance suite drives it: work is a
// session per episode on a dir provider shared by the suite's members.
type subject struct {
	*Owner
	prefix string

	membertest.Pacer

	mu sync.Mutex
	n  int
}

// Export paces the participant's export for the suite (PaceWrites).
func (s *subject) Export(ctx context.Context, c events.Commit) iter.Seq2[events.Record, error] {
	return s.Pace(ctx, s.Owner.Export(ctx, c))
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
		e := events.Episode{Rollout: id}
		if _, err := s.StartSession(t.Context(), id, e, provider.Spec{}); err != nil {
			t.Fatalf("StartSession: %v", err)
		}
		eps = append(eps, e)
	}
	return eps
}

// Hold keeps a request of ep's session in flight.
func (s *subject) Hold(ep events.Episode) func() {
	req, err := s.enter(context.Background(), ep.Rollout)
	if err != nil {
		panic(err) // a background ctx never ends
	}
	var once sync.Once
	return func() { once.Do(func() { s.leave(req) }) }
}

func (s *subject) Live() []string {
	s.Owner.mu.Lock()
	defer s.Owner.mu.Unlock()
	keys := map[string]bool{}
	for _, ss := range s.sessions {
		keys[ss.Episode.String()] = true
	}
	return slices.Sorted(maps.Keys(keys))
}

// TestConformance runs the member conformance suite against the owner.
func TestConformance(t *testing.T) {
	var (
		mu    sync.Mutex
		provs = map[*jstest.Env]*dir.Provider{}
	)
	membertest.Run(t, membertest.Suite{
		Kind: events.KindOwner,
		New: func(t *testing.T, env *jstest.Env, name events.Member) membertest.Subject {
			mu.Lock()
			d, ok := provs[env]
			if !ok {
				var err error
				if d, err = dir.New(t.TempDir()); err != nil {
					t.Fatal(err)
				}
				provs[env] = d
				t.Cleanup(func() {
					// The suite leaves its work running; stop it.
					for _, id := range d.Sandboxes() {
						if err := d.Stop(context.Background(), id); err != nil {
							t.Errorf("stop %s: %v", id, err)
						}
					}
					snaps, _ := d.Snapshots()
					for _, id := range snaps {
						if err := d.DeleteSnapshot(context.Background(), id); err != nil {
							t.Errorf("delete snapshot %s: %v", id, err)
						}
					}
				})
			}
			mu.Unlock()
			cfg := baseConfig(t, env, d, name.Name())
			return &subject{Owner: newOwner(t, cfg), prefix: name.Name()}
		},
	})
}
