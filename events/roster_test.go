package events

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestAddressPutsSandboxDaemonsInARoster(t *testing.T) {
	h := PhaseHeader{Run: "run1", CheckpointID: "c1", Seq: 3, Deadline: testDeadline}.
		Address([]Member{"sandbox.s2", "agent.a", "sandbox.s1", "owner.o"})
	if !slices.Equal(h.Members, []Member{"agent.a", "owner.o"}) {
		t.Fatalf("Members %v, want the agent and the owner only", h.Members)
	}
	if h.Sandboxes == nil || h.Sandboxes.Count != 2 {
		t.Fatalf("Sandboxes %+v, want a roster of 2", h.Sandboxes)
	}
	names, ok := h.Sandboxes.Names()
	if !ok || !slices.Equal(names, []Member{"sandbox.s1", "sandbox.s2"}) {
		t.Fatalf("roster names %v (%v), want both daemons sorted", names, ok)
	}
	all, ok := h.Expected()
	if !ok || !slices.Equal(all, []Member{"agent.a", "owner.o", "sandbox.s1", "sandbox.s2"}) {
		t.Fatalf("Expected %v (%v)", all, ok)
	}
	for _, m := range []Member{"agent.a", "sandbox.s1", "sandbox.other"} {
		if !h.Names(m) {
			t.Errorf("the phase does not address %s", m)
		}
	}
	if h.Names("agent.other") {
		t.Error("the phase addresses an agent it does not name")
	}

	none := PhaseHeader{Run: "run1", CheckpointID: "c1", Seq: 3, Deadline: testDeadline}.Address([]Member{"agent.a"})
	if none.Sandboxes != nil || none.Names("sandbox.s1") {
		t.Fatalf("a phase of no sandbox daemon addresses them: %+v", none.Sandboxes)
	}
}

func TestRosterRoundTripsAndExpands(t *testing.T) {
	roster := Roster{Run: "run1", CheckpointID: "c1", Seq: 3, Epoch: 1, Members: []Member{"sandbox.s1", "sandbox.s2"}}
	msg, err := Marshal(testBridge, roster)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Subject != "sp.run1.roster.3" {
		t.Fatalf("subject %s", msg.Subject)
	}
	_, d, err := Unmarshal(msg)
	if err != nil {
		t.Fatal(err)
	}
	got := d.(Roster)
	ref := roster.Ref(41)
	wire := RosterRef{Seq: ref.Seq, StreamSeq: ref.StreamSeq, Count: ref.Count, SHA256: ref.SHA256}
	if _, ok := wire.Names(); ok {
		t.Fatal("a reference read from an event knows its names")
	}
	full, err := wire.Expand(got)
	if err != nil {
		t.Fatal(err)
	}
	if names, ok := full.Names(); !ok || !slices.Equal(names, roster.Members) {
		t.Fatalf("expanded names %v", names)
	}

	other := got
	other.Members = []Member{"sandbox.s1", "sandbox.s3"}
	if _, err := wire.Expand(other); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "sandboxes.sha256") {
		t.Fatalf("a roster of other names expands: %v", err)
	}
	other.Members = []Member{"sandbox.s1"}
	if _, err := wire.Expand(other); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "sandboxes.count") {
		t.Fatalf("a roster of fewer names expands: %v", err)
	}
	other = got
	other.Seq = 4
	if _, err := wire.Expand(other); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "sandboxes.seq") {
		t.Fatalf("the roster of another phase expands: %v", err)
	}
}

func TestRosterAndRosterRefRefuseBadInput(t *testing.T) {
	good := Roster{Run: "run1", CheckpointID: "c1", Seq: 3, Members: []Member{"sandbox.s1", "sandbox.s2"}}
	for _, tc := range []struct {
		name  string
		edit  func(*Roster)
		field string
	}{
		{"agent in a roster", func(r *Roster) { r.Members = []Member{"agent.a", "sandbox.s1"} }, "data.members[0]"},
		{"unsorted", func(r *Roster) { r.Members = []Member{"sandbox.s2", "sandbox.s1"} }, "data.members[1]"},
		{"twice", func(r *Roster) { r.Members = []Member{"sandbox.s1", "sandbox.s1"} }, "data.members[1]"},
		{"empty", func(r *Roster) { r.Members = nil }, "data.members"},
		{"path-like", func(r *Roster) { r.Members = []Member{"sandbox.../x"} }, "data.members[0]"},
		{"seq 0", func(r *Roster) { r.Seq = 0 }, "data.seq"},
	} {
		r := good
		tc.edit(&r)
		err := r.Validate()
		var fe *FieldError
		if !errors.As(err, &fe) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v, want an error naming %s", tc.name, err, tc.field)
		}
	}

	ref := RosterRef{Seq: 2, StreamSeq: 9, Count: 2, SHA256: RosterDigest(good.Members)}
	base := PhaseHeader{Run: "run1", CheckpointID: "c1", Seq: 3, Deadline: testDeadline, Members: []Member{"agent.a"}, Sandboxes: &ref}
	if err := base.validate(); err != nil {
		t.Fatalf("a valid header: %v", err)
	}
	for _, tc := range []struct {
		name  string
		edit  func(*PhaseHeader, *RosterRef)
		field string
	}{
		{"a sandbox named too", func(h *PhaseHeader, _ *RosterRef) { h.Members = []Member{"sandbox.s1"} }, "data.members[0]"},
		{"a later phase's roster", func(_ *PhaseHeader, r *RosterRef) { r.Seq = 4 }, "data.sandboxes.seq"},
		{"no stream sequence", func(_ *PhaseHeader, r *RosterRef) { r.StreamSeq = 0 }, "data.sandboxes.stream_seq"},
		{"no count", func(_ *PhaseHeader, r *RosterRef) { r.Count = 0 }, "data.sandboxes.count"},
		{"too many", func(_ *PhaseHeader, r *RosterRef) { r.Count = MaxMembers }, "data.sandboxes"},
		{"bad digest", func(_ *PhaseHeader, r *RosterRef) { r.SHA256 = "../../etc" }, "data.sandboxes.sha256"},
	} {
		h, r := base, ref
		h.Sandboxes = &r
		tc.edit(&h, &r)
		err := Prepare{h}.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: %v, want an error naming %s", tc.name, err, tc.field)
		}
	}
}
