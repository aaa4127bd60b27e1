package invariant

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/agent/agentapi"
	"github.com/stillpoint/stillpoint/participants/scripted/modelserver"
	"github.com/stillpoint/stillpoint/sandboxd/trajectory"
)

// Trajectories checks invariant 8 alone (Check checks it with the rest):
// every result's trajectory is in the store as its result names it (sha256, bytes, calls), its lineage has no
// dangling parent, branch, duplicate or ambiguous call, and its final
// chain is, call for call and token for token, the chain the model
// server answered: the ledger's entries from the one that answered the
// rollout's last call back through each one's parent (the latest entry of
// the task whose prompt and completion begin the next one's prompt).
// Token breaks are counted, not refused.
func Trajectories(ctx context.Context, r Run) Result {
	res := Result{N: 8, Name: "every trajectory is its rollout's surviving chain"}
	if r.NoTrajectories {
		res.OK, res.Detail = true, "not checked: the owner ran no relay (--direct-model), so no rollout has a trajectory"
		return res
	}
	f, err := os.Open(r.Results)
	if err != nil {
		res.Detail = err.Error()
		return res
	}
	defer f.Close()
	var ledger []modelserver.Entry
	if r.Model != nil {
		ledger = r.Model.Ledger()
	}
	var bad []string
	n, calls, breaks, resent := 0, 0, 0, 0
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var cr collect.Result
		if json.Unmarshal(sc.Bytes(), &cr) != nil || !cr.OK || cr.Result == nil {
			continue
		}
		ref := cr.Result.Trajectory
		if ref == nil {
			bad = append(bad, fmt.Sprintf("%s: no trajectory (%s)", cr.RolloutID, cr.Result.NoTrajectory))
			continue
		}
		n++
		why, st := checkTrajectory(ctx, r, ref, ledger)
		calls, breaks, resent = calls+st.calls, breaks+st.breaks, resent+st.resent
		if why != "" {
			bad = append(bad, cr.RolloutID+": "+why)
		}
	}
	if err := sc.Err(); err != nil {
		bad = append(bad, err.Error())
	}
	res.OK = len(bad) == 0
	res.Detail = fmt.Sprintf("%d trajectories, %d calls, each the surviving chain the model server answered; 0 dangling, 0 branches, 0 duplicates, 0 masked wanted; %d token breaks; %d sent again (cut by a snapshot, or their upstream dialed again), each recorded once%s",
		n, calls, breaks, resent, list(bad))
	return res
}

// Trajectory checks one result's trajectory as invariant 8 does: stored
// as ref names it, its lineage clean, its last chain what the model
// servers answered, in turn (a run whose model server was replaced gives
// both, the first first; none: not held against a ledger). It returns the
// trajectory's calls and token breaks, and an error that says what is
// wrong.
func Trajectory(ctx context.Context, bus *jetstream.Bus, ref *agentapi.TrajectoryRef, models ...*modelserver.Server) (calls, breaks int, err error) {
	if ref == nil {
		return 0, 0, errors.New("the result names no trajectory")
	}
	var ledger []modelserver.Entry
	r := Run{Bus: bus}
	for _, m := range models {
		ledger = append(ledger, m.Ledger()...)
		r.Model = m
	}
	why, st := checkTrajectory(ctx, r, ref, ledger)
	if why != "" {
		return st.calls, st.breaks, errors.New(why)
	}
	return st.calls, st.breaks, nil
}

// trajectoryStats is what checkTrajectory counts of one trajectory: its
// calls, its token breaks, and its calls the relay sent again (a call a
// snapshot cut, re-sent by the fork's relay, or one whose upstream could
// not be reached, dialed again).
type trajectoryStats struct{ calls, breaks, resent int }

// checkTrajectory checks one stored trajectory and returns what is wrong
// with it ("" if nothing) and what it counts.
func checkTrajectory(ctx context.Context, r Run, ref *agentapi.TrajectoryRef, ledger []modelserver.Entry) (string, trajectoryStats) {
	// Without a model server (r.Model nil) there is no ledger to hold the
	// chain against; with one, an empty ledger answered nothing.
	data, err := ref.Read(ctx, r.Bus)
	if err != nil {
		return err.Error(), trajectoryStats{}
	}
	x, err := trajectory.Read(bytes.NewReader(data))
	if err != nil {
		return err.Error(), trajectoryStats{}
	}
	all := x.Calls()
	rep := trajectory.Check(all)
	st := trajectoryStats{calls: len(all), breaks: rep.TokenBreaks}
	for _, c := range all {
		if c.Resends > 0 {
			st.resent++
		}
	}
	if len(all) != ref.Calls {
		return fmt.Sprintf("%d calls; the result names %d", len(all), ref.Calls), st
	}
	if !rep.OK() {
		return fmt.Sprintf("%s: %v", rep, rep.Problems), st
	}
	seqs := trajectory.Chains(all)
	if len(seqs) == 0 {
		return "no chain of calls with token ids", st
	}
	if r.Model == nil {
		return "", st
	}
	byID := map[string]trajectory.Whole{}
	for _, c := range all {
		byID[c.ID] = c
	}
	chain := seqs[len(seqs)-1].Calls
	want := ledgerChain(ledger, byID[chain[len(chain)-1]])
	if len(want) != len(chain) {
		return fmt.Sprintf("its last chain has %d calls; the model server answered %d on that chain", len(chain), len(want)), st
	}
	for i, id := range chain {
		c, e := byID[id], want[i]
		if !slices.Equal(c.AllPromptIDs, e.PromptTokenIDs) || !slices.Equal(c.CompletionIDs, e.TokenIDs) {
			return fmt.Sprintf("call %s (%d of the chain) is not what the model server answered there", id, i+1), st
		}
	}
	return "", st
}

// ledgerChain returns the model server's chain that ends with the entry
// that answered last: that entry, and back from each the latest earlier
// entry of its task, delivered whole, whose prompt and completion begin
// its prompt.
func ledgerChain(ledger []modelserver.Entry, last trajectory.Whole) []modelserver.Entry {
	at := -1
	for i := len(ledger) - 1; i >= 0; i-- {
		e := ledger[i]
		if slices.Equal(e.PromptTokenIDs, last.AllPromptIDs) && slices.Equal(e.TokenIDs, last.CompletionIDs) && e.Sent == len(e.TokenIDs) {
			at = i
			break
		}
	}
	if at < 0 {
		return nil
	}
	chain := []modelserver.Entry{ledger[at]}
	for {
		cur := chain[0]
		found := false
		for i := at - 1; i >= 0; i-- {
			p := ledger[i]
			n := len(p.PromptTokenIDs) + len(p.TokenIDs)
			if p.Task != cur.Task || p.Sent != len(p.TokenIDs) || p.Delivered.IsZero() || n > len(cur.PromptTokenIDs) {
				continue
			}
			if slices.Equal(cur.PromptTokenIDs[:len(p.PromptTokenIDs)], p.PromptTokenIDs) && slices.Equal(cur.PromptTokenIDs[len(p.PromptTokenIDs):n], p.TokenIDs) {
				chain, at, found = append([]modelserver.Entry{p}, chain...), i, true
				break
			}
		}
		if !found {
			return chain
		}
	}
}
