package invariant

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/controller-bridge/timeline"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// branchHeader is the branch header of a branch's trajectory, as its
// results line carries it (result.trajectory.branch): the parent's
// rollout and capture key, the branch's number and seed, the checkpoint it
// was forked from, and At, the calls at the head of the file it inherited.
type branchHeader = agentapi.TrajectoryBranch

// resultLine is a results line with its trajectory's branch header.
type resultLine struct {
	collect.Result
	header *branchHeader
}

// readResultLines reads the results file's lines, by rollout.
func readResultLines(path string) (map[string][]resultLine, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string][]resultLine{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var l resultLine
		if json.Unmarshal(sc.Bytes(), &l.Result) != nil {
			continue
		}
		if l.Result.Result != nil && l.Result.Result.Trajectory != nil {
			l.header = l.Result.Result.Trajectory.Branch
		}
		out[l.RolloutID] = append(out[l.RolloutID], l)
	}
	return out, sc.Err()
}

// branchRollouts returns the branches the run's BranchCompleted outcomes
// made, by rollout.
func branchRollouts(tl []timeline.Entry) map[string]events.BranchSpec {
	out := map[string]events.BranchSpec{}
	for _, e := range tl {
		if o, ok := e.Data.(events.BranchCompleted); ok {
			for _, b := range o.Branches {
				out[b.Episode.Rollout] = b
			}
		}
	}
	return out
}

// tcall is a call as invariant 10 compares it: its id and episode, its
// request and response (key), and its token ids (tokens), which find the
// model server's ledger entry that answered it.
type tcall struct {
	id, episode, key, tokens string
	// branch and seed are the label the relay sent the call with.
	branch string
	seed   uint64
}

// callsOf returns a trajectory's calls, in the order recorded.
func callsOf(ws []trajectory.Whole) []tcall {
	out := make([]tcall, len(ws))
	for i, w := range ws {
		b, _ := json.Marshal(struct {
			M []json.RawMessage
			P json.RawMessage
			R json.RawMessage
		}{w.AllMessages, w.AllParams, w.Reply})
		sum := sha256.Sum256(b)
		out[i] = tcall{id: w.ID, episode: w.Episode, key: hex.EncodeToString(sum[:]) + tokenKey(w.AllPromptIDs, w.CompletionIDs),
			tokens: tokenKey(w.AllPromptIDs, w.CompletionIDs), branch: w.Branch, seed: w.Seed}
	}
	return out
}

// tokenKey is a call's prompt and completion token ids, as one string.
func tokenKey(prompt, completion []int) string {
	if len(prompt) == 0 && len(completion) == 0 {
		return ""
	}
	b, _ := json.Marshal([2][]int{prompt, completion})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// branchTraj is a branch's trajectory: its rollout, header and calls.
type branchTraj struct {
	rollout string
	h       branchHeader
	calls   []tcall
}

// label is the branch label and seed the model server recorded for a call.
type label struct {
	branch string
	seed   uint64
}

// ledgerLabels returns, by token key, the branch labels and seeds the
// model server's ledger recorded for the calls it answered with those
// tokens (its entries' Branch and Seed): branches that continue alike
// (a script with no continuation of their own) make calls of the same
// tokens, told apart by their labels alone.
func ledgerLabels(ledger []modelserver.Entry) map[string][]label {
	out := map[string][]label{}
	for _, e := range ledger {
		if k := tokenKey(e.PromptTokenIDs, e.TokenIDs); k != "" {
			if l := (label{e.Branch, e.Seed}); !slices.Contains(out[k], l) {
				out[k] = append(out[k], l)
			}
		}
	}
	return out
}

// checkBranches checks branches against their parents' trajectories
// (parents: by rollout; nil for a parent without one) and the labels the
// model server recorded (nil: none), and returns what is wrong.
func checkBranches(branches []branchTraj, parents map[string][]tcall, labels map[string][]label) []string {
	var bad []string
	// Every trajectory's calls by id and by request and response: a
	// branch's own call must be in its trajectory alone.
	where := map[string][]string{}
	note := func(name string, cs []tcall) {
		for _, c := range cs {
			where["id:"+c.id] = append(where["id:"+c.id], name)
			where["key:"+c.key] = append(where["key:"+c.key], name)
		}
	}
	for p, cs := range parents {
		note(p, cs)
	}
	for _, b := range branches {
		note(b.rollout, b.calls)
	}
	isBranchOf := map[string]string{}
	for _, b := range branches {
		isBranchOf[b.rollout] = b.h.Parent
	}
	for _, b := range branches {
		h := b.h
		if h.At < 0 || h.At > len(b.calls) {
			bad = append(bad, fmt.Sprintf("%s: branch point at %d of its %d calls", b.rollout, h.At, len(b.calls)))
			continue
		}
		if events.BranchRollout(h.Parent, h.K) != b.rollout {
			bad = append(bad, fmt.Sprintf("%s: its header names branch %d of %s", b.rollout, h.K, h.Parent))
		}
		// (a) The parent's calls up to the branch point, then its own: of
		// its own episode, or (a fork that continued in place, whose
		// harness keeps the parent's episode) sent with its label.
		own := func(c tcall) bool {
			ep, err := events.ParseEpisode(c.episode)
			return err == nil && ep.Rollout == b.rollout || c.branch == "b"+strconv.Itoa(h.K) && c.seed == h.Seed
		}
		for i, c := range b.calls {
			switch {
			case i < h.At && own(c):
				bad = append(bad, fmt.Sprintf("%s: call %d (%s), before the branch point, is the branch's own", b.rollout, i+1, c.id))
			case i >= h.At && !own(c):
				bad = append(bad, fmt.Sprintf("%s: call %d (%s), after the branch point, is not the branch's own", b.rollout, i+1, c.id))
			}
		}
		if pc, ok := parents[h.Parent]; ok && pc != nil {
			if len(pc) < h.At {
				bad = append(bad, fmt.Sprintf("%s: inherits %d calls; its parent's trajectory has %d", b.rollout, h.At, len(pc)))
			} else {
				for i := range h.At {
					if pc[i].id != b.calls[i].id || pc[i].key != b.calls[i].key {
						bad = append(bad, fmt.Sprintf("%s: call %d (%s) is not its parent's call %d (%s)", b.rollout, i+1, b.calls[i].id, i+1, pc[i].id))
						break
					}
				}
			}
		}
		// (b) None of its own calls in another trajectory.
		for _, c := range b.calls[h.At:] {
			for _, k := range []string{"id:" + c.id, "key:" + c.key} {
				for _, other := range where[k] {
					if other != b.rollout {
						bad = append(bad, fmt.Sprintf("%s: its call %s is also in %s's trajectory", b.rollout, c.id, other))
					}
				}
			}
			if ls := labels[c.tokens]; labels != nil && c.tokens != "" && !slices.Contains(ls, label{"b" + strconv.Itoa(h.K), h.Seed}) {
				bad = append(bad, fmt.Sprintf("%s: its call %s reached the model server labelled %v, none b%d seed %d", b.rollout, c.id, ls, h.K, h.Seed))
			}
		}
	}
	// (d) The parents carry no branch's call.
	for p, cs := range parents {
		for _, c := range cs {
			ep, err := events.ParseEpisode(c.episode)
			if err == nil && isBranchOf[ep.Rollout] == p {
				bad = append(bad, fmt.Sprintf("%s: its call %s is its branch %s's", p, c.id, ep.Rollout))
			}
			if ls, ok := labels[c.tokens]; ok && !slices.Contains(ls, label{}) {
				bad = append(bad, fmt.Sprintf("%s: its call %s reached the model server labelled %v, never unlabelled", p, c.id, ls))
			}
		}
	}
	slices.Sort(bad)
	return slices.Compact(bad)
}

// Branches checks invariant 10 alone (Check checks it with the rest):
// each branch the run made (its BranchCompleted outcomes, and the results
// lines naming a parent) has exactly one results line; each graded
// branch's trajectory is its parent's calls up to its branch point (its
// header's at), the same calls as the parent's trajectory holds, then
// calls of its own, none of which is in another branch's trajectory or in
// its parent's; and the parent's trajectory holds no call of its
// branches. With a model server whose ledger records the branch label of
// each call, a branch's own calls carry its label and seed, a parent's
// none.
func Branches(ctx context.Context, r Run, tl []timeline.Entry) Result {
	res := Result{N: 10, Name: "branches continue their parent's calls, each alone"}
	lines, err := readResultLines(r.Results)
	if err != nil {
		res.Detail = err.Error()
		return res
	}
	made := branchRollouts(tl)
	want := map[string]string{} // branch rollout -> parent
	for id, b := range made {
		want[id] = b.Parent.Rollout
	}
	for id, ls := range lines {
		if ls[0].BranchOf != "" {
			want[id] = ls[0].BranchOf
		}
	}
	var bad []string
	var branches []branchTraj
	parents := map[string][]tcall{}
	read := func(l resultLine) ([]tcall, string) {
		if l.Result.Result == nil || l.Result.Result.Trajectory == nil {
			return nil, "no trajectory"
		}
		data, err := l.Result.Result.Trajectory.Read(ctx, r.Bus)
		if err != nil {
			return nil, err.Error()
		}
		x, err := trajectory.Read(bytes.NewReader(data))
		if err != nil {
			return nil, err.Error()
		}
		return callsOf(x.Calls()), ""
	}
	graded := 0
	of := map[string]bool{}
	for _, id := range sortedKeys(want) {
		of[want[id]] = true
		ls := lines[id]
		if len(ls) != 1 {
			bad = append(bad, fmt.Sprintf("%s: %d results lines", id, len(ls)))
			continue
		}
		l := ls[0]
		if !l.OK || r.NoTrajectories {
			continue
		}
		graded++
		if l.header == nil {
			bad = append(bad, id+": its trajectory has no branch header")
			continue
		}
		cs, why := read(l)
		if why != "" {
			bad = append(bad, id+": "+why)
			continue
		}
		branches = append(branches, branchTraj{rollout: id, h: *l.header, calls: cs})
		p := want[id]
		if _, done := parents[p]; done {
			continue
		}
		parents[p] = nil
		if pl := lines[p]; len(pl) == 1 && pl[0].OK {
			if cs, why := read(pl[0]); why == "" {
				parents[p] = cs
			} else {
				bad = append(bad, p+" (a parent): "+why)
			}
		}
	}
	var labels map[string][]label
	labelled := "no model ledger: the calls' labels not checked"
	if r.Model != nil {
		labels = ledgerLabels(r.Model.Ledger())
		labelled = "each call's label and seed the model server recorded checked"
	}
	bad = append(bad, checkBranches(branches, parents, labels)...)
	res.OK = len(bad) == 0
	res.Detail = fmt.Sprintf("%d branches of %d parents, each written once; %d trajectories of graded branches, each its parent's calls up to its branch point then its own, no call in two, no parent with a branch's call; %s%s",
		len(want), len(of), graded, labelled, list(bad))
	return res
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
