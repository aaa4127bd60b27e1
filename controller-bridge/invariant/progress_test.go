package invariant

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
)

// TestProgress: invariant 9 passes a checkpoint that carries what the
// members it lost held, or retires it, and fails one that drops it; an
// episode that ended on members still there needs a result or a retire
// before the commit.
func TestProgress(t *testing.T) {
	mm := func(m events.Member, eps ...string) events.MemberManifest {
		return events.MemberManifest{Member: m, Episodes: eps}
	}
	c1 := events.CheckpointManifest{CheckpointID: "c1", CommitSeq: 3, Continued: []string{"r1", "r2"},
		Members:   []events.MemberManifest{mm("agent.a1", "r1"), mm("owner.o1", "r1"), mm("agent.a2", "r2")},
		Committed: []events.Member{"agent.a1", "agent.a2", "owner.o1"}}
	node2 := []events.Member{"agent.a2"}
	results := filepath.Join(t.TempDir(), "results.jsonl")
	if err := os.WriteFile(results, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(c2 events.CheckpointManifest, tl ...timeline.Entry) Result {
		v := &Manifests{read: map[string]events.CheckpointManifest{"c1": c1, "c2": c2}}
		return progress(tl, []string{"c1", "c2"}, v, results)
	}

	carried := events.CheckpointManifest{CheckpointID: "c2", CommitSeq: 7, Continued: []string{"r2"}, Committed: node2,
		Members: []events.MemberManifest{mm("agent.a2", "r2")},
		Carried: []events.Carry{{From: "c1", FromCommitSeq: 3, Episodes: []string{"r1"}, Members: []events.Member{"agent.a1", "owner.o1"}}}}
	if r := run(carried); !r.OK || !strings.Contains(r.Detail, "1 episodes carried") {
		t.Errorf("a checkpoint that carries what its lost members held: %+v", r)
	}
	retired := carried
	retired.Carried, retired.Retired = nil, []string{"r1"}
	if r := run(retired); !r.OK {
		t.Errorf("a checkpoint that names it retired: %+v", r)
	}
	dropped := carried
	dropped.Carried = nil
	if r := run(dropped); r.OK || !strings.Contains(r.Detail, "r1, held by c1, lost") {
		t.Errorf("a checkpoint that drops what its lost members held: %+v, want r1.a0 named lost", r)
	}

	// r2 ended on agent a2, which committed c2: a result or a retire
	// before c2 accounts for it.
	ended := events.CheckpointManifest{CheckpointID: "c2", CommitSeq: 7, Committed: []events.Member{"agent.a1", "agent.a2", "owner.o1"},
		Continued: []string{"r1"}, Members: []events.MemberManifest{mm("agent.a1", "r1"), mm("owner.o1", "r1")}}
	if r := run(ended); r.OK || !strings.Contains(r.Detail, "r2, held by c1, ended on its members with no result") {
		t.Errorf("an episode gone with no result: %+v", r)
	}
	retire := timeline.Entry{Data: events.Retire{PhaseHeader: events.PhaseHeader{Seq: 5}, Episodes: []events.Episode{{Rollout: "r2", Attempt: 0}}}}
	if r := run(ended, retire); !r.OK {
		t.Errorf("an episode the controller retired before the commit: %+v", r)
	}
	if err := os.WriteFile(results, []byte(`{"rollout_id":"r2","ok":true}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := run(ended); !r.OK {
		t.Errorf("an episode whose rollout has its result: %+v", r)
	}
	// A later attempt held counts as the episode held.
	later := ended
	later.Continued = []string{"r1", "r2-a1"}
	if err := os.WriteFile(results, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := run(later); !r.OK {
		t.Errorf("a later attempt of the rollout held: %+v", r)
	}
}
