package machine

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/stillpoint/stillpoint/events"
)

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
	var prevHeld map[string]events.Holding
	if prev != nil {
		prevHeld = prev.Holdings()
	}
	for _, k := range slices.Sorted(maps.Keys(prevHeld)) {
		h := prevHeld[k]
		if restarted[k] || !slices.ContainsFunc(h.Members, func(m events.Member) bool { return !here[m] }) {
			continue // every holder is here: continued or ended on them
		}
		drop[k] = true
		if unfinished != nil && !unfinished[k] {
			man.Retired = append(man.Retired, k)
			continue
		}
		members := slices.Clone(h.Members)
		slices.Sort(members)
		kk := key{h.From, h.FromCommitSeq, fmt.Sprint(members)}
		c := carried[kk]
		if c == nil {
			c = &events.Carry{From: h.From, FromCommitSeq: h.FromCommitSeq, Members: members}
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

// AwaitingRejoin returns the fresh agents and owners a checkpoint leaves
// out (PROTOCOL §5, Rejoin): those whose names hold, in prev (LATEST), an
// episode the controller still has unfinished. Such a member is a new
// process of a name that held progress; prepared, it would commit
// without that progress (which would then have ended on it) and could no
// longer be restored into. Left out, the checkpoint carries the episode
// and the member stays fresh for the rejoin. Without the controller's
// unfinished episodes (nil) nobody is left out.
func AwaitingRejoin(prev *events.CheckpointManifest, infos []events.MemberInfo, unfinished []string) map[events.Member]bool {
	if prev == nil || unfinished == nil {
		return nil
	}
	fresh := map[events.Member]bool{}
	for _, info := range infos {
		if k := info.Member.Kind(); !info.Served && (k == events.KindAgent || k == events.KindOwner) {
			fresh[info.Member] = true
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	want := map[string]bool{}
	for _, k := range unfinished {
		want[k] = true
	}
	out := map[events.Member]bool{}
	for k, h := range prev.Holdings() {
		if !want[k] {
			continue
		}
		for _, m := range h.Members {
			if fresh[m] {
				out[m] = true
			}
		}
	}
	return out
}
