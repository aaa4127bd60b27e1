package machine

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

// The outcome of a checkpoint of the largest fleet stays under the payload
// limit: the exports that do not fit are cut and counted, and the event
// encodes. A small fleet's outcome carries every export.
func TestCommittedOutcomeFitsThePayloadLimit(t *testing.T) {
	for _, n := range []int{3, events.MaxMembers} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			man := events.CheckpointManifest{Schema: events.CheckpointSchema, Run: "run1", CheckpointID: "c1", Epoch: 4,
				Created: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), PrepareSeq: 7, CommitSeq: 8}
			var members []events.Member
			instances := map[events.Member]string{}
			sha := strings.Repeat("cd", 32)
			for i := range n {
				m := events.Member(fmt.Sprintf("sandbox.sb-%s-%05d", strings.Repeat("x", 30), i))
				members = append(members, m)
				instances[m] = fmt.Sprintf("instance%014d", i)
				man.Members = append(man.Members, events.MemberManifest{Schema: events.ManifestSchema, Run: "run1", CheckpointID: "c1",
					Member: m, Object: events.RecordsObject("run1", "c1", m, sha), SHA256: sha, Size: 4096, Count: 8, Episodes: []string{"r1"}})
			}
			out := committedOutcome("run1", man, members, instances)
			if len(out.Exports)+out.ExportsCut != n || (n == 3) != (out.ExportsCut == 0) {
				t.Fatalf("%d members: %d exports, %d cut", n, len(out.Exports), out.ExportsCut)
			}
			e := out.Exports[len(out.Exports)-1]
			if e.Epoch != 4 || e.Kind != events.KindSandbox || e.Instance != instances[e.Member] || e.Size != 4096 || e.Episodes != 1 {
				t.Fatalf("export %+v", e)
			}
			if out.PrepareSeq != 7 || out.CommitSeq != 8 || !out.Created.Equal(man.Created) {
				t.Fatalf("outcome %+v", out)
			}
			if _, err := events.Marshal("bridge.main", out); err != nil {
				t.Fatalf("the outcome does not encode: %v", err)
			}
		})
	}
}
