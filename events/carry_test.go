package events

import (
	"errors"
	"strings"
	"testing"
)

// TestCarriedIsChecked: a restore's carried sources and a manifest's
// carries are checked like every other field: each bad one is refused,
// naming the field.
func TestCarriedIsChecked(t *testing.T) {
	e := func(s string) Episode {
		ep, err := ParseEpisode(s)
		if err != nil {
			t.Fatal(err)
		}
		return ep
	}
	restore := func(carried ...CarriedSource) Restore {
		return Restore{PhaseHeader: testPhase(5), Source: "ckpt-6", Scope: []Episode{e("r1"), e("r2")}, Carried: carried}
	}
	if err := restore(CarriedSource{Source: "ckpt-2", Episodes: []Episode{e("r2")}}).Validate(); err != nil {
		t.Fatalf("a valid carried source refused: %v", err)
	}
	for _, c := range []struct {
		name  string
		r     Restore
		field string
	}{
		{"path-like source", restore(CarriedSource{Source: "../c", Episodes: []Episode{e("r2")}}), "data.carried[0].source_checkpoint_id"},
		{"the restore's own source", restore(CarriedSource{Source: "ckpt-6", Episodes: []Episode{e("r2")}}), "data.carried[0].source_checkpoint_id"},
		{"an episode not in the scope", restore(CarriedSource{Source: "ckpt-2", Episodes: []Episode{e("r3")}}), "data.carried[0].episodes"},
		{"an episode carried twice", restore(CarriedSource{Source: "ckpt-2", Episodes: []Episode{e("r2")}},
			CarriedSource{Source: "ckpt-3", Episodes: []Episode{e("r2")}}), "data.carried[1].episodes"},
	} {
		err := c.r.Validate()
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %v, want ErrInvalid naming %s", c.name, err, c.field)
		}
	}

	man := func(carried ...Carry) CheckpointManifest {
		return CheckpointManifest{Schema: CheckpointSchemaInline, Run: "run1", CheckpointID: "ckpt-7", Continued: []string{"r1"}, Carried: carried}
	}
	good := Carry{From: "ckpt-2", FromCommitSeq: 4, Episodes: []string{"r2"}, Members: []Member{"agent.a0", "owner.o0"}}
	if err := man(good).Validate(); err != nil {
		t.Fatalf("a valid carry refused: %v", err)
	}
	for _, c := range []struct {
		name  string
		c     Carry
		field string
	}{
		{"reserved source", Carry{From: "LATEST", Episodes: []string{"r2"}}, "checkpoint.carried[0].checkpoint_id"},
		{"carried from itself", Carry{From: "ckpt-7", Episodes: []string{"r2"}}, "checkpoint.carried[0].from"},
		{"no episodes", Carry{From: "ckpt-2"}, "checkpoint.carried[0].episodes"},
		{"a bad episode", Carry{From: "ckpt-2", Episodes: []string{"r2/a0"}}, "checkpoint.carried[0].episodes[0]"},
		{"a wildcard member", Carry{From: "ckpt-2", Episodes: []string{"r2"}, Members: []Member{"agent.*"}}, "checkpoint.carried[0].members[0]"},
	} {
		err := man(c.c).Validate()
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s: %v, want an error naming %s", c.name, err, c.field)
		}
	}
	if got := man(good).Held(); strings.Join(got, ",") != "r1,r2" {
		t.Errorf("Held %v, want the continued and the carried", got)
	}
}
