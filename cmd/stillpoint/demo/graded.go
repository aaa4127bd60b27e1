package demo

import (
	"encoding/json"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/controller-bridge/collect/tasks"
	"github.com/stillpoint/stillpoint/participants/owner/commandkind"
	"github.com/stillpoint/stillpoint/participants/owner/swekind"
	"github.com/stillpoint/stillpoint/participants/scripted"
)

// Graded tells whether a result has the reward its task expects: 1 from
// the scripted set's check; from a repository task's own tests, 1 after
// the scripted fix and 0 for the control task, which fixes nothing; from
// an SWE task's grading, resolved.
func (d *Fleet) Graded(r collect.Result) bool {
	if !r.OK || r.Result == nil {
		return false
	}
	if d.f.tasks == tasksSWE {
		var v swekind.Verdict
		return json.Unmarshal(r.Result.Verdict, &v) == nil && v.Resolved && v.Reward == 1
	}
	if d.realHarness() {
		var v commandkind.Verdict
		want := 1.0
		if r.RolloutID == tasks.ControlID {
			want = 0
		}
		return json.Unmarshal(r.Result.Verdict, &v) == nil && v.Reward == want && v.Output != ""
	}
	var v scripted.Verdict
	return json.Unmarshal(r.Result.Verdict, &v) == nil && v.Reward == 1
}
