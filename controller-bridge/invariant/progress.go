package invariant

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"os"
	"slices"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
)

// progress checks invariant 9 on the checkpoints verified at their commit
// (Manifests): each committed checkpoint holds every episode the one
// committed before it held (continued, carried, or a later attempt of its
// rollout), unless it names it retired or restarted, or the episode ended
// on members that all committed it: its rollout has a result, or the
// controller retired it before the commit. An episode whose members are
// gone and that is none of these is progress lost.
func progress(tl []timeline.Entry, committed []string, v *Manifests, results string) Result {
	res := Result{N: 9, Name: "no checkpoint loses a rollout the one before held"}
	if v == nil {
		res.Detail = "no manifest verified at commit"
		res.OK = len(committed) == 0
		return res
	}
	// The controller's retires, by rollout: the highest attempt retired
	// before each phase sequence is what the check needs.
	type retire struct {
		seq     uint64
		attempt int
	}
	retires := map[string][]retire{}
	for _, e := range tl {
		if r, ok := e.Data.(events.Retire); ok {
			for _, ep := range r.Episodes {
				retires[ep.Rollout] = append(retires[ep.Rollout], retire{seq: r.Seq, attempt: ep.Attempt})
			}
		}
	}
	retiredBefore := func(ep events.Episode, seq uint64) bool {
		return slices.ContainsFunc(retires[ep.Rollout], func(r retire) bool { return r.seq < seq && r.attempt >= ep.Attempt })
	}
	written := resultRollouts(results)

	var mans []events.CheckpointManifest
	unread := 0
	for _, id := range committed {
		if m, ok := v.manifest(id); ok {
			mans = append(mans, m)
		} else {
			unread++
		}
	}
	slices.SortFunc(mans, func(a, b events.CheckpointManifest) int { return cmp.Compare(a.CommitSeq, b.CommitSeq) })
	var lost []string
	pairs, carried, retired := 0, 0, 0
	for i := 1; i < len(mans); i++ {
		p, n := mans[i-1], mans[i]
		pairs++
		carried += len(events.CarriedEpisodes(n.Carried))
		retired += len(n.Retired)
		held := n.Holdings()
		later := map[string]int{} // the highest attempt n holds of each rollout
		for k := range held {
			if ep, err := events.ParseEpisode(k); err == nil {
				later[ep.Rollout] = max(later[ep.Rollout], ep.Attempt+1)
			}
		}
		here := map[events.Member]bool{}
		for _, m := range n.CommittedMembers() {
			here[m] = true
		}
		for k, h := range p.Holdings() {
			ep, err := events.ParseEpisode(k)
			if err != nil {
				lost = append(lost, fmt.Sprintf("%s holds %q, no episode", p.CheckpointID, k))
				continue
			}
			if _, ok := held[k]; ok || later[ep.Rollout] > ep.Attempt || slices.Contains(n.Retired, k) || slices.Contains(n.Restarted, k) {
				continue
			}
			var gone []events.Member
			for _, m := range h.Members {
				if !here[m] {
					gone = append(gone, m)
				}
			}
			switch {
			case len(gone) > 0:
				lost = append(lost, fmt.Sprintf("%s: %s, held by %s, lost: %v gone, and it is neither carried nor retired",
					n.CheckpointID, k, p.CheckpointID, gone))
			case !written[ep.Rollout] && !retiredBefore(ep, n.CommitSeq):
				lost = append(lost, fmt.Sprintf("%s: %s, held by %s, ended on its members with no result and no retire before",
					n.CheckpointID, k, p.CheckpointID))
			}
		}
	}
	slices.Sort(lost)
	res.OK = len(lost) == 0
	res.Detail = fmt.Sprintf("%d committed checkpoints compared with the one before (%d pairs; %d not verified at commit); %d episodes carried, %d retired by the controller%s",
		len(mans), pairs, unread, carried, retired, list(lost))
	return res
}

// resultRollouts returns the rollouts with a line in the results file.
func resultRollouts(path string) map[string]bool {
	out := map[string]bool{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var r collect.Result
		if json.Unmarshal(sc.Bytes(), &r) == nil {
			out[r.RolloutID] = true
		}
	}
	return out
}
