package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// A checkpoint of the largest fleet still fits in one event: CapExports
// keeps what fits and counts the rest.
func TestCapExportsKeepsTheOutcomeUnderTheLimit(t *testing.T) {
	out := CheckpointCommitted{OutcomeHeader: OutcomeHeader{Run: "run1", CheckpointID: "ckpt-7", Epoch: 2}}
	var exports []MemberExport
	for i := range MaxMembers {
		m := Member(fmt.Sprintf("owner.%s-%05d", strings.Repeat("o", 40), i))
		out.Members = append(out.Members, m)
		exports = append(exports, ExportOf(MemberManifest{Schema: ManifestSchema, Run: "run1", CheckpointID: "ckpt-7", Member: m,
			Object: RecordsObject("run1", "ckpt-7", m, strings.Repeat("ab", 32)), SHA256: strings.Repeat("ab", 32), Count: 3, Size: 999,
			Episodes: []string{"r1", "r2"}}, 2, "instance-0123456789"))
	}
	base, err := json.Marshal(out)
	if err != nil {
		t.Fatal(err)
	}
	budget := MaxDataSize - len(base) - 4096
	out.Exports, out.ExportsCut = CapExports(exports, budget)
	if len(out.Exports) == 0 || out.ExportsCut == 0 || len(out.Exports)+out.ExportsCut != MaxMembers {
		t.Fatalf("kept %d, cut %d of %d", len(out.Exports), out.ExportsCut, MaxMembers)
	}
	if _, err := Marshal(testBridge, out); err != nil {
		t.Fatalf("capped outcome does not encode: %v", err)
	}
	if e := out.Exports[0]; e.Kind != KindOwner || e.Episodes != 2 || e.Instance != "instance-0123456789" || e.Size != 999 {
		t.Fatalf("export %+v", e)
	}

	all, cut := CapExports(exports[:10], budget)
	if len(all) != 10 || cut != 0 {
		t.Fatalf("a small list was cut: kept %d, cut %d", len(all), cut)
	}
	if none, cut := CapExports(exports[:10], -1); len(none) != 0 || cut != 10 {
		t.Fatalf("negative budget kept %d, cut %d", len(none), cut)
	}
}

func TestExportsAreValidated(t *testing.T) {
	out := CheckpointCommitted{OutcomeHeader: testOutcome(), Members: []Member{"agent.a0"},
		Exports: []MemberExport{{Member: "agent.a0", Kind: KindOwner}}}
	if err := out.Validate(); !errors.Is(err, ErrMismatch) {
		t.Fatalf("kind that is not the member's: %v", err)
	}
	out.Exports[0].Kind, out.Exports[0].Size = KindAgent, -1
	if err := out.Validate(); !errors.Is(err, ErrInvalid) {
		t.Fatalf("negative size: %v", err)
	}
}
