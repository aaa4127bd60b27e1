package bridge_test

import (
	"errors"
	"slices"
	"testing"

	natsjs "github.com/nats-io/nats.go/jetstream"

	bridge "github.com/stillpoint/stillpoint/controller-bridge"
	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// TestDeadMembersRolloutsAreCarried: PROTOCOL §5, Progress only moves
// forward. A member that is gone does not block the next checkpoint, and
// its rollouts are not dropped: the checkpoint carries them from the last
// one that held them, a release keeps that one, and a restore of the new
// checkpoint continues them from it, into a fresh member of the name.
func TestDeadMembersRolloutsAreCarried(t *testing.T) {
	env, old, b := heldByTwo(t)
	_ = old[1].Stop() // agent.t1 is gone, holding t1-r0 and t1-r1

	res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c2"})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c2 without agent.t1: %+v %v", res, err)
	}
	want := []events.Carry{{From: "c1", FromCommitSeq: manifestOf(t, env, "c1").CommitSeq, Episodes: []string{"t1-r0", "t1-r1"},
		Members: []events.Member{"agent.t1"}}}
	if !slices.EqualFunc(res.Carried, want, carryEqual) || !slices.Equal(res.Continued, []string{"t0-r0", "t0-r1"}) {
		t.Fatalf("c2 continues %v and carries %+v, want t0's and %+v", res.Continued, res.Carried, want)
	}
	if m := manifestOf(t, env, "c2"); !slices.EqualFunc(m.Carried, want, carryEqual) {
		t.Fatalf("c2's manifest carries %+v, want %+v", m.Carried, want)
	}
	// A checkpoint after it carries the same, from c1, not from c2.
	if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c3"}); err != nil || !slices.EqualFunc(res.Carried, want, carryEqual) {
		t.Fatalf("c3: %+v %v, want it to carry %+v", res, err, want)
	}

	// Keeping the newest keeps c1, which it carries from; c2 goes.
	rel, err := b.Release(ctx(t), bridgeapi.ReleaseRequest{KeepLatest: 1})
	if err != nil || rel.Status != bridgeapi.StatusCompleted || !slices.Equal(rel.Keep, []string{"c1", "c3"}) {
		t.Fatalf("release: %+v %v, want c1 and c3 kept", rel, err)
	}
	if _, err := env.Bus.Manifests.Get(ctx(t), events.ManifestKey(run, "c2")); !errors.Is(err, natsjs.ErrKeyNotFound) {
		t.Fatalf("c2 after the release: %v, want it deleted", err)
	}

	// The whole fleet restarts: the restore of c3 continues t1's rollouts
	// from c1's records.
	_ = old[0].Stop()
	fresh := membertest.StartMembers(t, env, run, 2, membertest.Options{})
	rr, err := b.Restore(ctx(t), bridgeapi.RestoreRequest{ID: "restore-1"})
	if err != nil || rr.Status != bridgeapi.StatusCompleted || rr.Source != "c3" {
		t.Fatalf("restore: %+v %v", rr, err)
	}
	if want := []string{"t0-r0-a1", "t0-r1-a1", "t1-r0-a1", "t1-r1-a1"}; !slices.Equal(rr.Restored, want) {
		t.Errorf("restored %v, want %v", rr.Restored, want)
	}
	if live := fresh[1].Participant.Live(); !slices.Equal(live, []string{"t1-r0-a1", "t1-r1-a1"}) {
		t.Errorf("the fresh agent.t1 holds %v, want its carried rollouts' next attempts", live)
	}
	// The next checkpoint holds them as its own again: nothing is carried.
	res, err = b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c4"})
	if err != nil || res.Status != bridgeapi.StatusCommitted || len(res.Carried) != 0 || len(res.Continued) != 4 {
		t.Fatalf("c4 after the restore: %+v %v, want 4 continued and nothing carried", res, err)
	}
	// The final release deletes c1 with the rest.
	if rel, err := b.Release(ctx(t), bridgeapi.ReleaseRequest{}); err != nil || rel.Status != bridgeapi.StatusCompleted {
		t.Fatalf("final release: %+v %v", rel, err)
	}
	if _, err := env.Bus.Manifests.Get(ctx(t), events.ManifestKey(run, "c1")); !errors.Is(err, natsjs.ErrKeyNotFound) {
		t.Fatalf("c1 after the final release: %v, want it deleted", err)
	}
}

// TestUnfinishedRetiresTheRest: with the controller's unfinished
// episodes, a dead member's episode that is not among them is retired,
// not carried.
func TestUnfinishedRetiresTheRest(t *testing.T) {
	_, old, b := heldByTwo(t)
	_ = old[1].Stop()
	res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c2", Unfinished: []string{"t0-r0", "t0-r1", "t1-r1"}})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c2: %+v %v", res, err)
	}
	if got := events.CarriedEpisodes(res.Carried); !slices.Equal(got, []string{"t1-r1"}) || !slices.Equal(res.Retired, []string{"t1-r0"}) {
		t.Fatalf("c2 carries %v and retires %v, want t1-r1 carried and t1-r0 retired", got, res.Retired)
	}
}

func carryEqual(a, b events.Carry) bool {
	return a.From == b.From && a.FromCommitSeq == b.FromCommitSeq && slices.Equal(a.Episodes, b.Episodes) && slices.Equal(a.Members, b.Members)
}

// TestRejoinContinuesTheReturnedMembersRollouts: PROTOCOL §5, Rejoin. A
// member gone while the rest checkpointed comes back as a fresh process
// of its name: a rejoin restores into it alone what LATEST carries for
// it, in the run's epoch, and the member that served goes on, not
// superseded. The next checkpoint holds both as their own again.
func TestRejoinContinuesTheReturnedMembersRollouts(t *testing.T) {
	env, old, b := heldByTwo(t)
	_ = old[1].Stop()
	if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c2"}); err != nil || len(res.Carried) != 1 {
		t.Fatalf("c2 without agent.t1: %+v %v, want t1's rollouts carried", res, err)
	}
	st, err := b.Status(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	epoch := st.Epoch

	// A rejoin with nothing fresh to go into is refused before any phase.
	if _, err := b.Restore(ctx(t), bridgeapi.RestoreRequest{Rejoin: true}); !errors.Is(err, bridgeapi.ErrNoFreshMember) {
		t.Fatalf("rejoin with no fresh member: %v, want ErrNoFreshMember", err)
	}
	back := membertest.NewParticipant("t1")
	membertest.StartMember(t, env, run, old[1].Name, back, membertest.Options{})
	rr, err := b.Restore(ctx(t), bridgeapi.RestoreRequest{Rejoin: true})
	if err != nil || rr.Status != bridgeapi.StatusCompleted || !rr.Rejoin || rr.Source != "c2" {
		t.Fatalf("rejoin: %+v %v", rr, err)
	}
	if want := []string{"t1-r0-a1", "t1-r1-a1"}; !slices.Equal(rr.Restored, want) || !slices.Equal(back.Live(), want) {
		t.Errorf("rejoin restored %v, the member holds %v, want %v", rr.Restored, back.Live(), want)
	}
	if rr.Epoch != epoch || !slices.Equal(rr.Members, []events.Member{old[1].Name}) {
		t.Errorf("rejoin in epoch %d into %v, want epoch %d into %s alone", rr.Epoch, rr.Members, epoch, old[1].Name)
	}
	select {
	case <-old[0].Done():
		t.Fatalf("agent.t0, which served, stopped: %v", old[0].Err())
	default:
	}
	if live := old[0].Participant.Live(); !slices.Equal(live, []string{"t0-r0", "t0-r1"}) {
		t.Errorf("agent.t0 holds %v after the rejoin, want its rollouts untouched", live)
	}

	res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c3"})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c3 after the rejoin: %+v %v", res, err)
	}
	if want := []string{"t0-r0", "t0-r1", "t1-r0-a1", "t1-r1-a1"}; len(res.Carried) != 0 || !slices.Equal(res.Continued, want) {
		t.Fatalf("c3 continues %v and carries %+v, want %v continued, nothing carried", res.Continued, res.Carried, want)
	}
}

// TestRejoinLeavesOutWhatAServedMemberHolds: an episode one of whose
// holders served on (the owner of an agent that came back) is no
// rejoin's: its progress is not the fresh member's alone. A rejoin whose
// scope is empty is refused; one narrowed to named episodes restores
// those only.
func TestRejoinLeavesOutWhatAServedMemberHolds(t *testing.T) {
	env, old, b := heldByTwo(t)
	// Both members hold t1-r0; agent.t1 alone holds t1-r1.
	old[0].Participant.Add(events.Episode{Rollout: "t1-r0"})
	if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c2"}); err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c2: %+v %v", res, err)
	}
	_ = old[1].Stop()
	membertest.StartMember(t, env, run, old[1].Name, membertest.NewParticipant("t1"), membertest.Options{})
	if _, err := b.Restore(ctx(t), bridgeapi.RestoreRequest{Rejoin: true, Episodes: []string{"t1-r0"}}); !errors.Is(err, bridgeapi.ErrNoFreshMember) {
		t.Fatalf("rejoin of t1-r0, held by agent.t0 too: %v, want ErrNoFreshMember", err)
	}
	rr, err := b.Restore(ctx(t), bridgeapi.RestoreRequest{Rejoin: true})
	if err != nil || rr.Status != bridgeapi.StatusCompleted || !slices.Equal(rr.Restored, []string{"t1-r1-a1"}) {
		t.Fatalf("rejoin: %+v %v, want t1-r1 alone restored", rr, err)
	}
}

// TestFreshMemberWaitsForItsRejoin: a new process of a name that holds
// unfinished progress in LATEST is left out of the checkpoints the
// controller asks with its unfinished episodes: prepared, it would commit
// without that progress and could no longer be rejoined. It stays fresh,
// the checkpoint carries its episodes, and the rejoin goes into it. A
// checkpoint asked without the controller's unfinished episodes leaves
// nobody out.
func TestFreshMemberWaitsForItsRejoin(t *testing.T) {
	env, old, b := heldByTwo(t)
	_ = old[1].Stop()
	back := membertest.NewParticipant("t1")
	membertest.StartMember(t, env, run, old[1].Name, back, membertest.Options{})
	unfinished := []string{"t0-r0", "t0-r1", "t1-r0", "t1-r1"}
	res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c2", Unfinished: unfinished})
	if err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c2: %+v %v", res, err)
	}
	if got := events.CarriedEpisodes(res.Carried); !slices.Equal(got, []string{"t1-r0", "t1-r1"}) {
		t.Fatalf("c2 carries %v, want t1's rollouts: the new agent.t1 waits for its rejoin", got)
	}
	if n := back.Count("prepare"); n != 0 {
		t.Fatalf("the new agent.t1 was prepared %d times, want 0", n)
	}
	rr, err := b.Restore(ctx(t), bridgeapi.RestoreRequest{Rejoin: true})
	if err != nil || rr.Status != bridgeapi.StatusCompleted || !slices.Equal(rr.Restored, []string{"t1-r0-a1", "t1-r1-a1"}) {
		t.Fatalf("rejoin after c2: %+v %v", rr, err)
	}

	// Without the controller's word, a fresh member is prepared as ever.
	_ = old[0].Stop()
	membertest.StartMember(t, env, run, old[0].Name, membertest.NewParticipant("t0"), membertest.Options{})
	res, err = b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c3"})
	if err != nil || res.Status != bridgeapi.StatusCommitted || len(res.Carried) != 0 {
		t.Fatalf("c3 without unfinished: %+v %v, want the fresh agent.t0 in it and nothing carried", res, err)
	}
}

// heldByTwo starts agents t0 and t1, two rollouts each, and a bridge, and
// commits c1, which holds all four rollouts.
func heldByTwo(t *testing.T) (*jstest.Env, []*membertest.Handle, *bridge.Bridge) {
	t.Helper()
	env := jstest.Start(t)
	old := fleet(t, env, 2, 2)
	b := startBridge(t, env, bridge.Config{})
	if res, err := b.Checkpoint(ctx(t), bridgeapi.CheckpointRequest{ID: "c1"}); err != nil || res.Status != bridgeapi.StatusCommitted {
		t.Fatalf("c1: %+v %v", res, err)
	}
	return env, old, b
}
