package machine

import (
	"reflect"
	"slices"
	"testing"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
)

// prevCheckpoint is c2: agent a1 and owner o1 hold r1 and r2, agent a2 and
// owner o2 hold r3; it carries r0 from c1, held there by a1 and o1.
func prevCheckpoint() *events.CheckpointManifest {
	mm := func(m events.Member, eps ...string) events.MemberManifest {
		return events.MemberManifest{Member: m, Episodes: eps}
	}
	return &events.CheckpointManifest{CheckpointID: "c2", CommitSeq: 20,
		Continued: []string{"r1", "r2", "r3"},
		Members: []events.MemberManifest{mm("agent.a1", "r1", "r2"), mm("owner.o1", "r1", "r2"),
			mm("agent.a2", "r3"), mm("owner.o2", "r3")},
		Carried: []events.Carry{{From: "c1", FromCommitSeq: 10, Episodes: []string{"r0"}, Members: []events.Member{"agent.a1", "owner.o1"}}},
	}
}

// TestCarryForward: PROTOCOL §5, Progress only moves forward: what a new
// checkpoint keeps of the one before, for each way its members can be
// gone, and the controller's say.
func TestCarryForward(t *testing.T) {
	all := []events.Member{"agent.a1", "agent.a2", "owner.o1", "owner.o2"}
	node2 := []events.Member{"agent.a2", "owner.o2"}
	for _, c := range []struct {
		name       string
		committed  []events.Member
		continued  []string // what the members exported
		restarted  []string
		unfinished []string // nil: the controller did not say
		want       []events.Carry
		wantCont   []string
		retired    []string
	}{
		{name: "every member here: nothing carried, what ended is gone",
			committed: all, continued: []string{"r1", "r3"}, wantCont: []string{"r1", "r3"}},
		{name: "a node gone: its episodes carried from where they are held whole",
			committed: node2, continued: []string{"r3"}, wantCont: []string{"r3"},
			want: []events.Carry{
				{From: "c1", FromCommitSeq: 10, Episodes: []string{"r0"}, Members: []events.Member{"agent.a1", "owner.o1"}},
				{From: "c2", FromCommitSeq: 20, Episodes: []string{"r1", "r2"}, Members: []events.Member{"agent.a1", "owner.o1"}},
			}},
		{name: "only the owner gone: the agent's new export of its episodes is left out, never mixed",
			committed: []events.Member{"agent.a1", "agent.a2", "owner.o2"}, continued: []string{"r1", "r2", "r3"},
			wantCont: []string{"r3"},
			want: []events.Carry{
				{From: "c1", FromCommitSeq: 10, Episodes: []string{"r0"}, Members: []events.Member{"agent.a1", "owner.o1"}},
				{From: "c2", FromCommitSeq: 20, Episodes: []string{"r1", "r2"}, Members: []events.Member{"agent.a1", "owner.o1"}},
			}},
		{name: "the controller's list: what it no longer has unfinished is retired, not carried",
			committed: node2, continued: []string{"r3"}, unfinished: []string{"r1", "r3", "r2-a1"},
			wantCont: []string{"r3"}, retired: []string{"r0", "r2"},
			want: []events.Carry{{From: "c2", FromCommitSeq: 20, Episodes: []string{"r1"}, Members: []events.Member{"agent.a1", "owner.o1"}}}},
		{name: "an empty list says none is unfinished",
			committed: node2, unfinished: []string{}, retired: []string{"r0", "r1", "r2"}},
		{name: "a restart a member reports is never carried",
			committed: node2, continued: []string{"r3"}, restarted: []string{"r1"}, wantCont: []string{"r3"},
			want: []events.Carry{
				{From: "c1", FromCommitSeq: 10, Episodes: []string{"r0"}, Members: []events.Member{"agent.a1", "owner.o1"}},
				{From: "c2", FromCommitSeq: 20, Episodes: []string{"r2"}, Members: []events.Member{"agent.a1", "owner.o1"}},
			}},
	} {
		t.Run(c.name, func(t *testing.T) {
			man := &events.CheckpointManifest{CheckpointID: "c3", Continued: slices.Clone(c.continued), Restarted: c.restarted}
			var unf map[string]bool
			if c.unfinished != nil {
				unf = map[string]bool{}
				for _, k := range c.unfinished {
					unf[k] = true
				}
			}
			carryForward(man, prevCheckpoint(), c.committed, unf)
			if !reflect.DeepEqual(man.Carried, c.want) {
				t.Errorf("carried %+v\nwant    %+v", man.Carried, c.want)
			}
			if !slices.Equal(man.Continued, c.wantCont) && len(man.Continued)+len(c.wantCont) > 0 {
				t.Errorf("continued %v, want %v", man.Continued, c.wantCont)
			}
			if !slices.Equal(man.Retired, c.retired) && len(man.Retired)+len(c.retired) > 0 {
				t.Errorf("retired %v, want %v", man.Retired, c.retired)
			}
			// Nothing of c2 is lost: each of its episodes is held, retired
			// or restarted, or ended on members that are all here.
			held := map[string]bool{}
			for _, k := range man.Held() {
				held[k] = true
			}
			here := map[events.Member]bool{}
			for _, m := range c.committed {
				here[m] = true
			}
			for k, h := range prevCheckpoint().Holdings() {
				gone := slices.ContainsFunc(h.Members, func(m events.Member) bool { return !here[m] })
				if gone && !held[k] && !slices.Contains(man.Retired, k) && !slices.Contains(c.restarted, k) {
					t.Errorf("%s lost: its members are gone and it is neither carried nor retired", k)
				}
			}
		})
	}
}

// TestCarryForwardChains: a checkpoint that carries what its predecessor
// carried names the first source, never the predecessor.
func TestCarryForwardChains(t *testing.T) {
	c3 := &events.CheckpointManifest{CheckpointID: "c3", CommitSeq: 30, Continued: []string{"r3"},
		Members: []events.MemberManifest{{Member: "agent.a2", Episodes: []string{"r3"}}}}
	carryForward(c3, prevCheckpoint(), []events.Member{"agent.a2", "owner.o2"}, nil)
	c4 := &events.CheckpointManifest{CheckpointID: "c4", Continued: []string{"r3"}}
	carryForward(c4, c3, []events.Member{"agent.a2", "owner.o2"}, nil)
	if !reflect.DeepEqual(c4.Carried, c3.Carried) {
		t.Fatalf("c4 carries %+v, c3 %+v: not from the same sources", c4.Carried, c3.Carried)
	}
	for _, cr := range c4.Carried {
		if cr.From == "c3" {
			t.Fatalf("c4 carries from c3, which only carried: %+v", cr)
		}
	}
}

// TestReleaseKeepsCarrySources: a release keeps every checkpoint a kept
// one carries from, and lets it go once none does.
func TestReleaseKeepsCarrySources(t *testing.T) {
	all := []events.CheckpointManifest{{CheckpointID: "c1"}, {CheckpointID: "c2"},
		{CheckpointID: "c3", Carried: []events.Carry{{From: "c1", Episodes: []string{"r0"}}}}}
	keep, err := keepSet(all, bridgeapi.ReleaseRequest{KeepLatest: 1})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"c1", "c3"}; !slices.Equal(keep, want) {
		t.Fatalf("keep %v, want %v", keep, want)
	}
	all = append(all, events.CheckpointManifest{CheckpointID: "c4"})
	if keep, _ = keepSet(all, bridgeapi.ReleaseRequest{KeepLatest: 1}); !slices.Equal(keep, []string{"c4"}) {
		t.Fatalf("keep %v once nothing kept carries from c1, want [c4]", keep)
	}
}
