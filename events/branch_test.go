package events

import (
	"errors"
	"strings"
	"testing"
)

func TestBranchRolloutRoundTrip(t *testing.T) {
	for _, c := range []struct {
		rollout string
		k       int
	}{{"r1", 1}, {"task-003", 12}, {"r1.b2", 3}} {
		id := BranchRollout(c.rollout, c.k)
		p, k, ok := ParseBranchRollout(id)
		if !ok || p != c.rollout || k != c.k {
			t.Errorf("ParseBranchRollout(%q) = %q, %d, %v; want %q, %d", id, p, k, ok, c.rollout, c.k)
		}
	}
	for _, id := range []string{"r1", "r1.b", "r1.b0", "r1.b01", "r1.bx", ".b1", "r1.b-1"} {
		if _, _, ok := ParseBranchRollout(id); ok {
			t.Errorf("ParseBranchRollout(%q): a branch; want none", id)
		}
	}
}

// A branch phase names each branch's episode as its parent's makes it: one
// that does not, a duplicate, too many, or a carried episode that is no
// parent is refused, naming the field.
func TestBranchValidateRefusesWhatItCannotMean(t *testing.T) {
	ep := func(s string) Episode { e, _ := ParseEpisode(s); return e }
	good := Branch{PhaseHeader: testPhase(9), Source: "ckpt-6", Branches: []BranchSpec{NewBranchSpec(ep("r1-a1"), 1, 7)}}
	if err := good.Validate(); err != nil {
		t.Fatalf("a good branch: %v", err)
	}
	wrongEp := good
	wrongEp.Branches = []BranchSpec{{Parent: ep("r1-a1"), K: 1, Episode: ep("r2.b1-a2")}}
	dup := good
	dup.Branches = []BranchSpec{NewBranchSpec(ep("r1-a1"), 1, 7), NewBranchSpec(ep("r1-a1"), 1, 8)}
	many := good
	many.Branches = nil
	for k := 1; k <= MaxBranches+1; k++ {
		many.Branches = append(many.Branches, NewBranchSpec(ep("r1-a1"), k, 0))
	}
	none := good
	none.Branches = nil
	carried := good
	carried.Carried = []CarriedSource{{Source: "ckpt-5", Episodes: []Episode{ep("r9-a1")}}}
	long := good
	long.Branches = []BranchSpec{NewBranchSpec(Episode{Rollout: strings.Repeat("r", 127)}, 1, 0)}
	for name, c := range map[string]struct {
		b     Branch
		field string
	}{
		"episode not the parent's": {wrongEp, "data.branches[0].episode"},
		"twice":                    {dup, "data.branches[1].episode"},
		"too many":                 {many, "data.branches"},
		"none":                     {none, "data.branches"},
		"carried no parent":        {carried, "data.carried[0].episodes"},
		"id too long":              {long, "data.branches[0].episode"},
	} {
		err := c.b.Validate()
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %v; want an error naming %s", name, err, c.field)
		}
		if err != nil && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrTooLarge) {
			t.Errorf("%s: %v is neither ErrInvalid nor ErrTooLarge", name, err)
		}
	}
}
