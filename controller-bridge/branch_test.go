package bridge_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"net/http/httptest"

	"github.com/nats-io/nats.go"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/client"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// outcomeOf reads the last outcome of type typ of the run from the stream.
func outcomeOf(t *testing.T, env *jstest.Env, typ events.Type) events.Data {
	t.Helper()
	raw, err := env.Bus.Stream.GetLastMsgForSubject(t.Context(), events.OutcomeSubject(run, typ))
	if err != nil {
		t.Fatalf("the last %s: %v", typ, err)
	}
	_, d, err := events.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// branchFleet runs two agents with two episodes each and commits c1.
func branchFleet(t *testing.T) (*jstest.Env, *bridge.Bridge, []*membertest.Handle) {
	t.Helper()
	env := jstest.Start(t)
	hs := fleet(t, env, 2, 2)
	b := newBridge(t, env, bridge.Config{})
	if r, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1"}); err != nil || r.Status != bridgeapi.StatusCommitted {
		t.Fatalf("checkpoint: %+v, %v", r, err)
	}
	return env, b, hs
}

// PROTOCOL §5, Branch: a branch of held rollouts goes to their holders,
// which install the branches; branch.completed names the agent of each.
func TestBranchCompletes(t *testing.T) {
	env, b, hs := branchFleet(t)
	r0, r1 := hs[0].Participant.Live()[0], hs[1].Participant.Live()[0]
	p0, _ := events.ParseEpisode(r0)
	p1, _ := events.ParseEpisode(r1)
	res, err := b.Branch(ctx(t), bridgeapi.BranchRequest{Rollouts: []string{p0.Rollout, p1.Rollout}, N: 2, Seed: 42})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != bridgeapi.StatusCompleted || res.Source != "c1" || len(res.Branches) != 4 {
		t.Fatalf("result %+v, want completed from c1 with 4 branches", res)
	}
	for _, s := range res.Branches {
		want := hs[0].Name
		if s.Parent == p1 {
			want = hs[1].Name
		}
		if res.Agents[s.Episode.Rollout] != want {
			t.Fatalf("agent of %s: %s, want %s", s.Episode.Rollout, res.Agents[s.Episode.Rollout], want)
		}
		if s.Seed != bridgeapi.BranchSeed(42, s.Parent.Rollout, s.K) {
			t.Fatalf("seed of %s: %d, want BranchSeed(42, %s, %d)", s.Episode.Rollout, s.Seed, s.Parent.Rollout, s.K)
		}
		if !slices.Contains(hs[0].Participant.Live(), s.Episode.String()) && !slices.Contains(hs[1].Participant.Live(), s.Episode.String()) {
			t.Fatalf("no participant runs %s", s.Episode)
		}
	}
	if !slices.Equal(res.Members, []events.Member{hs[0].Name, hs[1].Name}) {
		t.Fatalf("addressed %v, want both holders", res.Members)
	}
	out := outcomeOf(t, env, events.TypeBranchCompleted).(events.BranchCompleted)
	if out.CheckpointID != res.OpID || len(out.Branches) != 4 || len(out.Agents) != 4 {
		t.Fatalf("outcome %+v", out)
	}
	// One holder only: the other is not addressed.
	res, err = b.Branch(ctx(t), bridgeapi.BranchRequest{Rollouts: []string{p0.Rollout}, N: 1, First: 3})
	if err != nil || res.Status != bridgeapi.StatusCompleted || !slices.Equal(res.Members, []events.Member{hs[0].Name}) {
		t.Fatalf("branch of one rollout: %+v, %v", res, err)
	}
	if res.Branches[0].Episode.Rollout != events.BranchRollout(p0.Rollout, 3) || res.Seed == 0 {
		t.Fatalf("branch %+v (seed %d), want %s with a drawn seed", res.Branches[0], res.Seed, events.BranchRollout(p0.Rollout, 3))
	}
	// The fleet checkpoints on, branches and all.
	if r, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c2"}); err != nil || r.Status != bridgeapi.StatusCommitted {
		t.Fatalf("checkpoint after the branch: %+v, %v", r, err)
	}
	if !slices.Contains(manifestOf(t, env, "c2").Continued, res.Branches[0].Episode.String()) {
		t.Fatalf("c2 continues %v, want the branch %s among them", manifestOf(t, env, "c2").Continued, res.Branches[0].Episode)
	}
}

// PROTOCOL §5, Branch: a holder that fails makes the operation fail; every
// branch episode is retired on every member of the epoch.
func TestBranchFailureRetires(t *testing.T) {
	env, b, hs := branchFleet(t)
	p0, _ := events.ParseEpisode(hs[0].Participant.Live()[0])
	p1, _ := events.ParseEpisode(hs[1].Participant.Live()[0])
	hs[1].Participant.FailBranch(membertest.ErrInjected)
	res, err := b.Branch(ctx(t), bridgeapi.BranchRequest{Rollouts: []string{p0.Rollout, p1.Rollout}, N: 2})
	if err != nil {
		t.Fatal(err)
	}
	if res.Status != bridgeapi.StatusFailed || res.Failure == nil || len(res.Failure.Errors) != 1 || res.Failure.Errors[0].Member != hs[1].Name {
		t.Fatalf("result %+v, want failed naming %s", res, hs[1].Name)
	}
	var want []string
	for _, s := range res.Branches {
		want = append(want, s.Episode.String())
	}
	if !slices.Equal(res.Retired, want) {
		t.Fatalf("retired %v, want %v", res.Retired, want)
	}
	ret := phaseOf(t, env, events.PhaseRetire).(events.Retire)
	if ret.CheckpointID != res.OpID || len(ret.Episodes) != 4 || !slices.Equal(ret.Members, []events.Member{hs[0].Name, hs[1].Name}) {
		t.Fatalf("retire %+v, want the 4 branches to both members", ret)
	}
	for _, h := range hs {
		for _, k := range h.Participant.Live() {
			if strings.Contains(k, ".b") {
				t.Fatalf("%s still runs the branch %s", h.Name, k)
			}
		}
	}
	out := outcomeOf(t, env, events.TypeBranchFailed).(events.BranchFailed)
	if out.CheckpointID != res.OpID || !slices.Equal(out.Retired, want) || len(out.Errors) != 1 {
		t.Fatalf("outcome %+v", out)
	}
}

// Bad branch requests are refused, naming what is wrong, before anything
// is published.
func TestBranchRefusesBadRequests(t *testing.T) {
	env, b, hs := branchFleet(t)
	p0, _ := events.ParseEpisode(hs[0].Participant.Live()[0])
	too := make([]string, 0, 3)
	for i := range 3 {
		too = append(too, p0.Rollout[:len(p0.Rollout)-1]+string(rune('0'+i)))
	}
	rows := []struct {
		name string
		req  bridgeapi.BranchRequest
		err  error
		says string
	}{
		{"unknown rollout", bridgeapi.BranchRequest{Rollouts: []string{"nope"}, N: 1}, bridgeapi.ErrBadRequest, "nope"},
		{"unknown checkpoint", bridgeapi.BranchRequest{Source: "c9", Rollouts: []string{p0.Rollout}, N: 1}, bridgeapi.ErrNotFound, "c9"},
		{"n 0", bridgeapi.BranchRequest{Rollouts: []string{p0.Rollout}}, bridgeapi.ErrBadRequest, "n:"},
		{"too many", bridgeapi.BranchRequest{Rollouts: too, N: events.MaxBranches/3 + 1}, bridgeapi.ErrBadRequest, "over the limit"},
		{"no rollouts", bridgeapi.BranchRequest{N: 1}, bridgeapi.ErrBadRequest, "rollouts"},
	}
	for _, row := range rows {
		_, err := b.Branch(ctx(t), row.req)
		if !errors.Is(err, row.err) || !strings.Contains(err.Error(), row.says) {
			t.Fatalf("%s: %v, want %v saying %q", row.name, err, row.err, row.says)
		}
	}
	// A holder that is gone.
	if err := hs[1].Stop(); err != nil {
		t.Fatal(err)
	}
	p1, _ := events.ParseEpisode(hs[1].Participant.Live()[0])
	_, err := b.Branch(ctx(t), bridgeapi.BranchRequest{Rollouts: []string{p1.Rollout}, N: 1})
	if !errors.Is(err, bridgeapi.ErrBadRequest) || !strings.Contains(err.Error(), string(hs[1].Name)) {
		t.Fatalf("a gone holder: %v, want ErrBadRequest naming %s", err, hs[1].Name)
	}
	if _, err := env.Bus.Stream.GetLastMsgForSubject(t.Context(), events.PhaseSubject(run, events.PhaseBranch)); err == nil {
		t.Fatal("a refused branch published a phase")
	}
}

// The HTTP route: POST /v1/branch answers the BranchResult, and a bad
// request 400 bad_request.
func TestBranchHTTP(t *testing.T) {
	_, b, _ := branchFleet(t)
	srv := httptest.NewServer(b.Handler(testToken))
	t.Cleanup(srv.Close)
	c, err := client.New(srv.URL, testToken)
	if err != nil {
		t.Fatal(err)
	}
	res, err := c.Branch(ctx(t), bridgeapi.BranchRequest{Source: "c1", Rollouts: []string{"t1-r1"}, N: 3, Seed: 5})
	if err != nil || res.Status != bridgeapi.StatusCompleted || len(res.Agents) != 3 || res.Agents["t1-r1.b3"] != "agent.t1" {
		t.Fatalf("branch over HTTP: %+v, %v", res, err)
	}
	var ce *client.Error
	if _, err := c.Branch(ctx(t), bridgeapi.BranchRequest{Rollouts: []string{"t9-r0"}, N: 1}); !errors.As(err, &ce) || ce.Status != 400 ||
		ce.Code != "bad_request" || !strings.Contains(ce.Detail, "t9-r0") {
		t.Fatalf("a branch of an unknown rollout over HTTP: %v, want 400 bad_request naming t9-r0", err)
	}
}

// A branch rollout is made once: a second operation that would make it
// again (the same first, no checkpoint since holding it) is refused
// naming it, before anything is published, so that its failure can never
// retire the first operation's branches; so is an operation id used
// before. A later first, or the same branch at a later attempt (a
// controller making a lost branch again), completes.
func TestBranchRolloutsAndIDsAreMadeOnce(t *testing.T) {
	_, b, hs := branchFleet(t)
	p0, _ := events.ParseEpisode(hs[0].Participant.Live()[0])
	first, err := b.Branch(ctx(t), bridgeapi.BranchRequest{ID: "branch-one", Rollouts: []string{p0.Rollout}, N: 2, Seed: 5})
	if err != nil || first.Status != bridgeapi.StatusCompleted {
		t.Fatalf("first branch: %+v, %v", first, err)
	}
	for name, c := range map[string]struct {
		req  bridgeapi.BranchRequest
		name string
	}{
		"the same branches": {bridgeapi.BranchRequest{Rollouts: []string{p0.Rollout}, N: 2}, events.BranchRollout(p0.Rollout, 1)},
		"one of them":       {bridgeapi.BranchRequest{Rollouts: []string{p0.Rollout}, N: 1, First: 2}, events.BranchRollout(p0.Rollout, 2)},
		"the same id":       {bridgeapi.BranchRequest{ID: "branch-one", Rollouts: []string{p0.Rollout}, N: 1, First: 5}, "branch-one"},
	} {
		_, err := b.Branch(ctx(t), c.req)
		if !errors.Is(err, bridgeapi.ErrBadRequest) || !strings.Contains(err.Error(), c.name) {
			t.Errorf("%s: %v, want ErrBadRequest naming %s", name, err, c.name)
		}
	}
	for _, e := range first.Branches {
		if !slices.Contains(hs[0].Participant.Live(), e.Episode.String()) {
			t.Fatalf("the first operation's %s is gone after the refusals", e.Episode)
		}
	}
	later, err := b.Branch(ctx(t), bridgeapi.BranchRequest{Rollouts: []string{p0.Rollout}, N: 1, First: 3})
	if err != nil || later.Status != bridgeapi.StatusCompleted {
		t.Fatalf("a later first: %+v, %v", later, err)
	}
	remade, err := b.Branch(ctx(t), bridgeapi.BranchRequest{Rollouts: []string{p0.Rollout}, N: 1, First: 2, Attempt: first.Branches[1].Episode.Attempt + 1})
	if err != nil || remade.Status != bridgeapi.StatusCompleted || remade.Branches[0].Episode.Attempt != first.Branches[1].Episode.Attempt+1 {
		t.Fatalf("branch 2 made again at a later attempt: %+v, %v", remade, err)
	}
}
