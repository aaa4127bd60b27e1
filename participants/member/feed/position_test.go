package feed

import (
	"path/filepath"
	"testing"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
)

// The core feed writes its position when the first phase is handled, then
// at most once every positionEvery, except past a prepare (now), when it
// writes at once; flush writes what waits. A process started afterwards
// reads the last position written.
func TestPhaseFloorWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "feed", "state.json")
	m := events.Member("sandbox.s1")
	f := newPhaseFloor(path, "r", m, position{}, zerolog.Nop())
	defer f.flush()
	read := func() uint64 {
		t.Helper()
		p, other, err := loadPosition(path, "r", m)
		if err != nil || other != "" {
			t.Fatalf("position: %v %q", err, other)
		}
		return p.PhaseSeq
	}
	handle := func(q uint64, now bool) {
		t.Helper()
		f.delivered(q, 0)
		if err := f.done(q, now); err != nil {
			t.Fatal(err)
		}
	}
	handle(1, false)
	if got := read(); got != 1 {
		t.Fatalf("after the first phase: position %d, want 1 (written at once)", got)
	}
	handle(2, false)
	if got := read(); got != 1 {
		t.Fatalf("a phase within positionEvery: position %d, want 1 (the write waits)", got)
	}
	handle(3, true)
	if got := read(); got != 3 {
		t.Fatalf("past a prepare: position %d, want 3 (written at once)", got)
	}
	if f.synced {
		t.Fatal("the write past a prepare was synced; it waits for the timer")
	}
	handle(4, false)
	if err := f.flush(); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != 4 || !f.synced {
		t.Fatalf("after flush: position %d, synced %v; want 4, synced", got, f.synced)
	}
}

// Writes in place keep the state file one whole position: a shorter
// position than the last leaves no tail of the longer (the padding is
// trimmed on reading), and a write in place after a durable replace goes
// into the new file, not the one the replace unlinked.
func TestPositionFileInPlace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "feed", "state.json")
	m := events.Member("sandbox.s1")
	read := func() position {
		t.Helper()
		p, other, err := loadPosition(path, "r", m)
		if err != nil || other != "" {
			t.Fatalf("position: %v %q", err, other)
		}
		return p
	}
	w := positionFile{path: path}
	defer w.close()
	at := func(q, seq uint64) position {
		return position{V: positionVersion, Run: "r", Member: string(m), PhaseSeq: q, StreamSeq: seq}
	}
	steps := []struct {
		p       position
		durable bool
	}{
		{at(1, 1), false},                 // creates the file by a replace, then opens it
		{at(123456789, 987654321), false}, // in place, longer
		{at(2, 3), false},                 // in place, shorter: padded
		{at(40, 41), true},                // a durable replace
		{at(5, 6), false},                 // replaces again, then in place from here
		{at(7, 8), false},                 // in place
	}
	for i, s := range steps {
		if err := w.write(s.p, s.durable); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		if got := read(); got != s.p {
			t.Fatalf("after write %d (durable %v): read %+v, want %+v", i, s.durable, got, s.p)
		}
	}
	if w.f == nil {
		t.Fatal("the last writes did not go in place: the file is not open")
	}
}
