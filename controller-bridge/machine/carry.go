package machine

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/stillpoint/stillpoint/events"
)

// holding is where a checkpoint holds one episode: the checkpoint whose
// records have every part of it, and the members whose records those are.
type holding struct {
	from    string
	seq     uint64
	members []events.Member
}

// holdings returns every episode man holds, with where: its own records
// for a continued episode, the carry's source for a carried one. man's
// members must be loaded.
func holdings(man *events.CheckpointManifest) map[string]holding {
	out := map[string]holding{}
	if man == nil {
		return out
	}
	for _, k := range man.Continued {
		out[k] = holding{from: man.CheckpointID, seq: man.CommitSeq}
	}
	for _, mm := range man.Members {
		for _, k := range mm.Episodes {
			if h, ok := out[k]; ok && h.from == man.CheckpointID {
				h.members = append(h.members, mm.Member)
				out[k] = h
			}
		}
	}
	for _, c := range man.Carried {
		for _, k := range c.Episodes {
			out[k] = holding{from: c.From, seq: c.FromCommitSeq, members: c.Members}
		}
	}
	return out
}

// carryForward decides what the checkpoint being built (man, its
// members' manifests and Continued filled in, committed by committed)
// keeps of prev, the committed checkpoint before it (PROTOCOL §5,
// Progress only moves forward). Each episode prev held is, in man:
//   - continued, when every member that held it committed man and one
//     exported it again;
//   - ended, when every member that held it committed man and none did
//     (the rollout finished, or a member restarted it);
//   - otherwise, with a member gone: carried whole from where prev held
//     it (an export of it by a member still there is left out: never
//     mixed), or, when the controller named its unfinished episodes and
//     this is not among them, retired.
//
// An episode a member reports as restarting is never carried.
// unfinished nil means the controller did not say.
func carryForward(man *events.CheckpointManifest, prev *events.CheckpointManifest, committed []events.Member,
	unfinished map[string]bool) {
	here := map[events.Member]bool{}
	for _, m := range committed {
		here[m] = true
	}
	restarted := map[string]bool{}
	for _, k := range man.Restarted {
		restarted[k] = true
	}
	type key struct {
		from    string
		seq     uint64
		members string
	}
	carried := map[key]*events.Carry{}
	drop := map[string]bool{}
	prevHeld := holdings(prev)
	for _, k := range slices.Sorted(maps.Keys(prevHeld)) {
		h := prevHeld[k]
		if restarted[k] || !slices.ContainsFunc(h.members, func(m events.Member) bool { return !here[m] }) {
			continue // every holder is here: continued or ended on them
		}
		drop[k] = true
		if unfinished != nil && !unfinished[k] {
			man.Retired = append(man.Retired, k)
			continue
		}
		members := slices.Clone(h.members)
		slices.Sort(members)
		kk := key{h.from, h.seq, fmt.Sprint(members)}
		c := carried[kk]
		if c == nil {
			c = &events.Carry{From: h.from, FromCommitSeq: h.seq, Members: members}
			carried[kk] = c
		}
		c.Episodes = append(c.Episodes, k)
	}
	man.Continued = slices.DeleteFunc(man.Continued, func(k string) bool { return drop[k] })
	man.Carried = nil
	for _, c := range carried {
		man.Carried = append(man.Carried, *c)
	}
	slices.SortFunc(man.Carried, func(a, b events.Carry) int {
		return cmp.Or(cmp.Compare(a.FromCommitSeq, b.FromCommitSeq), strings.Compare(a.From, b.From),
			slices.Compare(a.Members, b.Members))
	})
}
