package invariant

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
)

// calls builds a trajectory's calls: each name is "<episode>/<n>", its
// request and response told by key.
func calls(specs ...string) []tcall {
	out := make([]tcall, len(specs))
	for i, s := range specs {
		ep, n, _ := strings.Cut(s, "/")
		out[i] = tcall{id: strings.ReplaceAll(ep, ".", ":") + ".l1." + n, episode: ep, key: "k-" + s, tokens: "t-" + s}
	}
	return out
}

// Invariant 10's trajectory checks: two branches of r1 forked after its
// two calls, each the parent's two then its own, pass; each kind of
// violation is named.
func TestCheckBranches(t *testing.T) {
	parent := calls("r1/1", "r1/2", "r1/3")
	b1 := branchTraj{rollout: "r1.b1", h: branchHeader{Parent: "r1", ParentEpisode: "r1", K: 1, Seed: 11, Source: "c1", At: 2},
		calls: calls("r1/1", "r1/2", "r1.b1-a1/1", "r1.b1-a1/2")}
	b2 := branchTraj{rollout: "r1.b2", h: branchHeader{Parent: "r1", ParentEpisode: "r1", K: 2, Seed: 12, Source: "c1", At: 2},
		calls: calls("r1/1", "r1/2", "r1.b2-a1/1")}
	labels := map[string][]label{}
	for _, c := range parent {
		labels[c.tokens] = []label{{}}
	}
	for _, b := range []branchTraj{b1, b2} {
		for _, c := range b.calls[b.h.At:] {
			labels[c.tokens] = []label{{"b" + string(rune('0'+b.h.K)), b.h.Seed}}
		}
	}
	if bad := checkBranches([]branchTraj{b1, b2}, map[string][]tcall{"r1": parent}, labels); len(bad) != 0 {
		t.Fatalf("two clean branches: %v", bad)
	}
	if bad := checkBranches([]branchTraj{b1, b2}, map[string][]tcall{"r1": parent}, nil); len(bad) != 0 {
		t.Fatalf("two clean branches, no labels: %v", bad)
	}
	// A fork that continued in place: its harness's calls keep the
	// parent's episode; the relay's label and seed make them its own.
	b3 := branchTraj{rollout: "r1.b3", h: branchHeader{Parent: "r1", ParentEpisode: "r1", K: 3, Seed: 13, Source: "c1", At: 2},
		calls: calls("r1/1", "r1/2", "r1/x3", "r1/x4")}
	for i := range b3.calls[2:] {
		b3.calls[2+i].branch, b3.calls[2+i].seed = "b3", 13
		labels[b3.calls[2+i].tokens] = []label{{"b3", 13}}
	}
	if bad := checkBranches([]branchTraj{b1, b2, b3}, map[string][]tcall{"r1": parent}, labels); len(bad) != 0 {
		t.Fatalf("a branch that continued in place: %v", bad)
	}
	b3.calls[3].seed = 12
	if bad := checkBranches([]branchTraj{b3}, map[string][]tcall{"r1": parent}, nil); len(bad) != 1 || !strings.Contains(bad[0], "after the branch point, is not the branch's own") {
		t.Fatalf("an in-place call with another seed: %v", bad)
	}

	for _, tc := range []struct {
		name   string
		mutate func(b1, b2 *branchTraj, parent *[]tcall, labels map[string][]label)
		want   string
	}{
		{"prefix not the parent's", func(b1, _ *branchTraj, _ *[]tcall, _ map[string][]label) {
			b1.calls[1].key = "other"
		}, "r1.b1: call 2 (r1.l1.2) is not its parent's call 2 (r1.l1.2)"},
		{"an own call of the parent's episode", func(b1, _ *branchTraj, _ *[]tcall, _ map[string][]label) {
			b1.h.At = 1
		}, "r1.b1: call 2 (r1.l1.2), after the branch point, is not the branch's own"},
		{"a branch point past its calls", func(_, b2 *branchTraj, _ *[]tcall, _ map[string][]label) {
			b2.h.At = 4
		}, "r1.b2: branch point at 4 of its 3 calls"},
		{"a call in two branches", func(b1, b2 *branchTraj, _ *[]tcall, _ map[string][]label) {
			b2.calls = append(b2.calls, b1.calls[3])
		}, "r1.b1: its call r1:b1-a1.l1.2 is also in r1.b2's trajectory"},
		{"a sibling's request and response", func(b1, b2 *branchTraj, _ *[]tcall, _ map[string][]label) {
			b2.calls[2].key = b1.calls[2].key
		}, "r1.b2: its call r1:b2-a1.l1.1 is also in r1.b1's trajectory"},
		{"the parent holds a branch's call", func(b1, _ *branchTraj, parent *[]tcall, _ map[string][]label) {
			*parent = append(*parent, b1.calls[2])
		}, "r1: its call r1:b1-a1.l1.1 is its branch r1.b1's"},
		{"the parent's call labelled", func(_, _ *branchTraj, parent *[]tcall, labels map[string][]label) {
			labels[(*parent)[2].tokens] = []label{{"b1", 11}}
		}, "r1: its call r1.l1.3 reached the model server labelled [{b1 11}], never unlabelled"},
		{"a branch's call with another's seed", func(_, b2 *branchTraj, _ *[]tcall, labels map[string][]label) {
			labels[b2.calls[2].tokens] = []label{{"b2", 11}}
		}, `r1.b2: its call r1:b2-a1.l1.1 reached the model server labelled [{b2 11}], none b2 seed 12`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c1, c2 := b1, b2
			c1.calls, c2.calls = append([]tcall(nil), b1.calls...), append([]tcall(nil), b2.calls...)
			p := append([]tcall(nil), parent...)
			l := map[string][]label{}
			for k, v := range labels {
				l[k] = v
			}
			tc.mutate(&c1, &c2, &p, l)
			bad := checkBranches([]branchTraj{c1, c2}, map[string][]tcall{"r1": p}, l)
			found := false
			for _, b := range bad {
				found = found || b == tc.want
			}
			if !found {
				t.Fatalf("got %q, want %q among them", bad, tc.want)
			}
		})
	}
}

// Invariant 10 counts every branch the stream's outcomes made, and each
// one's results lines: one passes; none, or two, fails naming the branch.
func TestBranchesWrittenOnce(t *testing.T) {
	specs := []events.BranchSpec{events.NewBranchSpec(events.Episode{Rollout: "r1"}, 1, 1), events.NewBranchSpec(events.Episode{Rollout: "r1"}, 2, 2)}
	tl := []timeline.Entry{{Type: events.TypeBranchCompleted, Data: events.BranchCompleted{
		OutcomeHeader: events.OutcomeHeader{Run: "run1", CheckpointID: "b-1"}, Source: "c1", Branches: specs}}}
	results := filepath.Join(t.TempDir(), "results.jsonl")
	write := func(ids ...string) {
		var b []byte
		for _, id := range ids {
			l := map[string]any{"rollout_id": id, "ok": true, "result": map[string]any{}}
			if p, k, ok := events.ParseBranchRollout(id); ok {
				l["branch_of"], l["branch"] = p, k
			}
			line, _ := json.Marshal(l)
			b = append(append(b, line...), '\n')
		}
		if err := os.WriteFile(results, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	r := Run{Run: "run1", Results: results, NoTrajectories: true}
	write("r1", "r1.b1", "r1.b2")
	if res := Branches(t.Context(), r, tl); !res.OK || !strings.HasPrefix(res.Detail, "2 branches of 1 parents") {
		t.Fatalf("each branch once: %+v", res)
	}
	write("r1", "r1.b1", "r1.b1")
	res := Branches(t.Context(), r, tl)
	if res.OK || !strings.Contains(res.Detail, "r1.b1: 2 results lines") || !strings.Contains(res.Detail, "r1.b2: 0 results lines") {
		t.Fatalf("a branch twice, one missing: %+v", res)
	}
	// A line that names a parent is a branch, whatever the stream says.
	write("r1", "r1.b1", "r1.b2", "r1.b3")
	if res := Branches(t.Context(), r, tl); !res.OK || !strings.HasPrefix(res.Detail, "3 branches") {
		t.Fatalf("a branch the results name: %+v", res)
	}
}
