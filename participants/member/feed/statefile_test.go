package feed

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStateFileErrors: a state file that is torn, truncated, empty or of
// an unknown version is refused with an error that says which and names
// the file, and the file is left as it was; one written before versions
// is read.
func TestStateFileErrors(t *testing.T) {
	good, _ := json.Marshal(position{V: positionVersion, Run: "run1", Member: "sandbox.sb1", StreamSeq: 41})
	for _, c := range []struct {
		name, body string
		seq        uint64
		want       string // "" for accepted
	}{
		{"current", string(good), 41, ""},
		{"before versions", `{"run":"run1","member":"sandbox.sb1","stream_seq":7}`, 7, ""},
		{"torn", string(good[:len(good)-9]), 0, "torn or not JSON"},
		{"empty", "", 0, "empty"},
		{"blank", "  \n", 0, "empty"},
		{"not an object", "41", 0, "torn or not JSON"},
		{"two objects", string(good) + string(good), 0, "trailing data"},
		{"unknown version", `{"v":2,"run":"run1","member":"sandbox.sb1","stream_seq":7}`, 0, "version 2, this build reads version 1"},
		{"negative position", `{"v":1,"stream_seq":-1}`, 0, "torn or not JSON"},
		{"another member's", `{"v":1,"run":"run1","member":"sandbox.parent","stream_seq":7}`, 0, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "position.json")
			if err := os.WriteFile(path, []byte(c.body), 0o644); err != nil {
				t.Fatal(err)
			}
			pos, _, err := loadPosition(path, "run1", "sandbox.sb1")
			seq := pos.StreamSeq
			switch {
			case c.want == "" && (err != nil || seq != c.seq):
				t.Fatalf("position %d, %v; want %d", seq, err, c.seq)
			case c.want != "" && (!errors.Is(err, ErrStateFile) || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path)):
				t.Fatalf("error %v, want ErrStateFile naming %s and %q", err, path, c.want)
			}
			if b, _ := os.ReadFile(path); string(b) != c.body {
				t.Errorf("the state file was changed to %q", b)
			}
		})
	}
	if pos, _, err := loadPosition(filepath.Join(t.TempDir(), "none.json"), "run1", "sandbox.sb1"); pos != (position{}) || err != nil {
		t.Errorf("a missing state file: %+v, %v; want position 0", pos, err)
	}
	// The core feed's phase sequence is kept beside the stream sequence.
	path := filepath.Join(t.TempDir(), "position.json")
	if err := os.WriteFile(path, []byte(`{"v":1,"run":"run1","member":"sandbox.sb1","stream_seq":7,"phase_seq":3}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if pos, _, err := loadPosition(path, "run1", "sandbox.sb1"); err != nil || pos.StreamSeq != 7 || pos.PhaseSeq != 3 {
		t.Errorf("a core feed's state file: %+v, %v; want stream 7, phase 3", pos, err)
	}
}

// FuzzDecodePosition: a state file's bytes never panic the reader, and
// whatever it accepts is the position a rewrite of it keeps.
func FuzzDecodePosition(f *testing.F) {
	good, _ := json.Marshal(position{V: positionVersion, Run: "run1", Member: "sandbox.sb1", StreamSeq: 41})
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte(`{"run":"run1","member":"sandbox.sb1","stream_seq":7}`))
	f.Add([]byte(`{"v":9,"stream_seq":1}`))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := decodePosition(b)
		if err != nil {
			if p != (position{}) {
				t.Fatalf("error %v with position %+v", err, p)
			}
			return
		}
		again, _ := json.Marshal(position{V: positionVersion, Run: p.Run, Member: p.Member, StreamSeq: p.StreamSeq, PhaseSeq: p.PhaseSeq})
		if p2, err := decodePosition(again); err != nil || p2.StreamSeq != p.StreamSeq || p2.PhaseSeq != p.PhaseSeq || p2.Run != p.Run || p2.Member != p.Member {
			t.Fatalf("position %+v rewritten reads %+v, %v", p, p2, err)
		}
	})
}
