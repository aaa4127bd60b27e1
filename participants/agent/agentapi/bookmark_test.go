package agentapi

import (
	"errors"
	"strings"
	"testing"
)

func TestDecodeBookmark(t *testing.T) {
	ok := []string{
		`{"v":1,"next":"seed","rollout":"r1","attempt":0,"task":{}}`,
		`{"v":1,"next":"harness","rollout":"r1","attempt":2,"task":{},"session":"r1","state":{"data_dir":"/d"},"resume":true,"future_field":1}`,
		`{"v":1,"next":"verify","rollout":"r1","attempt":0,"task":{},"session":"r1"}`,
		`{"v":1,"next":"verify","rollout":"r1","attempt":0,"task":{},"session":"r1","trajectory":{"object":"run-1/r1.jsonl","sha256":"abababababababababababababababababababababababababababababababab","bytes":10,"calls":1}}`,
		`{"v":1,"next":"verify","rollout":"r1","attempt":0,"task":{},"session":"r1","trajectory":{"object":"run-1/r1.jsonl","bucket":"sp_trajectories_run-1_agent_a1","sha256":"abababababababababababababababababababababababababababababababab","bytes":10,"calls":1}}`,
		`{"v":1,"next":"return","rollout":"r1","attempt":0,"task":{},"result":{"rollout_id":"r1","attempt":0,"episode":"r1","adapter":"scripted","launches":[]}}`,
		`{"v":1,"next":"harness","rollout":"r1.b2","attempt":1,"task":{},"session":"r1.b2","state":{},"branch":{"parent":"r1","k":2,"seed":7,"source_checkpoint_id":"c1","label":"b2"}}`,
		`{"v":1,"next":"verify","rollout":"r1.b2","attempt":1,"task":{},"session":"r1.b2","trajectory":{"object":"run-1/r1.b2.jsonl","sha256":"abababababababababababababababababababababababababababababababab","bytes":10,"calls":3,"branch":{"parent":"r1","parent_episode":"r1","k":2,"seed":7,"source_checkpoint_id":"c1","at":2}}}`,
	}
	for _, s := range ok {
		if _, err := DecodeBookmark([]byte(s)); err != nil {
			t.Errorf("DecodeBookmark(%s): %v", s, err)
		}
	}
	bad := []struct{ in, want string }{
		{``, "not a JSON object"},
		{`[1]`, "not a JSON object"},
		{`{"next":"seed","rollout":"r1"}`, `no version field "v"`},
		{`{"v":2,"next":"seed","rollout":"r1"}`, "version 2"},
		{`{"v":"1","next":"seed","rollout":"r1"}`, "cannot unmarshal"},
		{`{"v":1,"next":"launch","rollout":"r1"}`, `unknown stage "launch"`},
		{`{"v":1,"next":"harness","rollout":"r1"}`, "bookmark.session: required at stage harness"},
		{`{"v":1,"next":"harness","rollout":"r1","session":"r1"}`, "bookmark.state: required"},
		{`{"v":1,"next":"return","rollout":"r1"}`, "bookmark.result: required"},
		{`{"v":1,"next":"seed","rollout":"../etc"}`, "bookmark.rollout"},
		{`{"v":1,"next":"verify","rollout":"r1","session":"a b"}`, "bookmark.session"},
		{`{"v":1,"next":"seed","rollout":"r1","attempt":-1}`, "bookmark.attempt"},
		{`{"v":1,"next":"seed","rollout":"r1"`, "unexpected end"},
		{`{"v":1,"next":"verify","rollout":"r1","session":"r1","trajectory":{"object":"run/../r1.jsonl","sha256":"abababababababababababababababababababababababababababababababab"}}`, "bookmark.trajectory: object"},
		{`{"v":1,"next":"verify","rollout":"r1","session":"r1","trajectory":{"object":"run/r2.jsonl","sha256":"abababababababababababababababababababababababababababababababab"}}`, "bookmark.trajectory: object"},
		{`{"v":1,"next":"verify","rollout":"r1","session":"r1","trajectory":{"object":"run/r1.jsonl","sha256":"../x"}}`, "bookmark.trajectory: sha256"},
		{`{"v":1,"next":"verify","rollout":"r1","session":"r1","trajectory":{"object":"run/r1.jsonl","bucket":"sp_records_run_agent_a1","sha256":"abababababababababababababababababababababababababababababababab"}}`, "bookmark.trajectory: bucket"},
		{`{"v":1,"next":"verify","rollout":"r1","session":"r1","trajectory":{"object":"run/r1.jsonl","bucket":"sp_trajectories_other_agent_a1","sha256":"abababababababababababababababababababababababababababababababab"}}`, "bookmark.trajectory: bucket"},
		{`{"v":1,"next":"verify","rollout":"r1","session":"r1","trajectory":{"object":"run/r1.jsonl","bucket":"sp_trajectories_run_owner_o1","sha256":"abababababababababababababababababababababababababababababababab"}}`, "bookmark.trajectory: bucket"},
		{`{"v":1,"next":"verify","rollout":"r1","session":"r1","trajectory":{"object":"run/r1.jsonl","bucket":"sp_trajectories_run_agent_","sha256":"abababababababababababababababababababababababababababababababab"}}`, "bookmark.trajectory: bucket"},
		{`{"v":1,"next":"verify","rollout":"r1","session":"r1","trajectory":{"object":"run/r1.jsonl","sha256":"abababababababababababababababababababababababababababababababab","bytes":-1}}`, "negative"},
		{`{"v":1,"next":"seed","rollout":"r1.b2","attempt":1,"branch":{"parent":"r1","k":2,"source_checkpoint_id":"c1","label":"b3"}}`, "bookmark.branch: label"},
		{`{"v":1,"next":"seed","rollout":"r1.b2","attempt":1,"branch":{"parent":"r1","k":0,"source_checkpoint_id":"c1","label":"b0"}}`, "bookmark.branch: k"},
		{`{"v":1,"next":"seed","rollout":"r1.b2","attempt":1,"branch":{"parent":"r2","k":2,"source_checkpoint_id":"c1","label":"b2"}}`, "bookmark.branch: parent r2"},
		{`{"v":1,"next":"seed","rollout":"r1.b2","attempt":1,"branch":{"parent":"r1-a","k":2,"source_checkpoint_id":"c1","label":"b2"}}`, "bookmark.branch: parent"},
		{`{"v":1,"next":"seed","rollout":"r1.b2","attempt":1,"branch":{"parent":"r1","k":2,"source_checkpoint_id":"../c","label":"b2"}}`, "source_checkpoint_id"},
		{`{"v":1,"next":"verify","rollout":"r1.b2","session":"r1.b2","trajectory":{"object":"run/r1.b2.jsonl","sha256":"abababababababababababababababababababababababababababababababab","calls":1,"branch":{"parent":"r1","parent_episode":"r1","k":2,"at":2}}}`, "branch: at 2"},
		{`{"v":1,"next":"verify","rollout":"r1.b2","session":"r1.b2","trajectory":{"object":"run/r1.b2.jsonl","sha256":"abababababababababababababababababababababababababababababababab","calls":1,"branch":{"parent":"r1","parent_episode":"r9","k":2}}}`, "branch: parent_episode"},
	}
	for _, c := range bad {
		_, err := DecodeBookmark([]byte(c.in))
		if !errors.Is(err, ErrBadBookmark) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("DecodeBookmark(%s) = %v, want ErrBadBookmark naming %q", c.in, err, c.want)
		}
	}
}

// A clone shares nothing a caller could change under the original.
func TestBookmarkCloneSharesNoSlice(t *testing.T) {
	b := Bookmark{V: 1, Next: StageReturn, Rollout: "r1", Task: []byte(`{}`), State: []byte(`{"d":1}`),
		Launches: []LaunchRecord{{ID: "r1.l1"}}, Result: &Result{Launches: []LaunchRecord{{ID: "r1.l1"}}},
		Trajectory: &TrajectoryRef{Object: "run/r1.jsonl", Branch: &TrajectoryBranch{At: 1}}, Branch: &BranchRef{K: 1}}
	b.Trajectory.Check.Problems = []string{"p"}
	c := b.Clone()
	c.Branch.K, c.Trajectory.Branch.At = 9, 9
	if b.Branch.K != 1 || b.Trajectory.Branch.At != 1 {
		t.Fatalf("the clone shares its branch with the original: %+v %+v", b.Branch, b.Trajectory.Branch)
	}
	c.Task[0], c.State[0], c.Launches[0].ID, c.Result.Launches[0].ID = 'x', 'x', "x", "x"
	c.Result.Episode = "x"
	c.Trajectory.Object, c.Trajectory.Check.Problems[0] = "x", "x"
	if string(b.Task) != `{}` || string(b.State) != `{"d":1}` || b.Launches[0].ID != "r1.l1" ||
		b.Result.Launches[0].ID != "r1.l1" || b.Result.Episode != "" || b.Trajectory.Object != "run/r1.jsonl" || b.Trajectory.Check.Problems[0] != "p" {
		t.Fatalf("the clone changed the original: %+v", b)
	}
}
