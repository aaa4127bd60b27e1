package ownerapi

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestDecodeIndexEntry: an index entry that is torn, empty, under the
// wrong key or naming an invalid id is refused, saying which.
func TestDecodeIndexEntry(t *testing.T) {
	for _, c := range []struct{ name, body, want string }{
		{"good", `{"run":"run1","snapshot":"s1","checkpoints":["c1","c2"]}`, ""},
		{"no checkpoints", `{"run":"run1","snapshot":"s1","checkpoints":[]}`, ""},
		{"torn", `{"run":"run1","snapshot":"s1","checkp`, "torn or not JSON"},
		{"empty", ``, "empty"},
		{"two objects", `{} {}`, "trailing data"},
		{"another key's", `{"run":"run1","snapshot":"s2"}`, `snapshot "s2" under the key of "s1"`},
		{"bad run", `{"run":"a.b","snapshot":"s1"}`, "run"},
		{"bad checkpoint", `{"run":"run1","snapshot":"s1","checkpoints":["LATEST"]}`, "checkpoints[0]"},
	} {
		_, err := DecodeIndexEntry([]byte(c.body), "s1")
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// FuzzDecodeIndexEntry: an index entry of any bytes never panics the
// decoder, and what it accepts is an entry of its key that survives a
// re-encode.
func FuzzDecodeIndexEntry(f *testing.F) {
	f.Add([]byte(`{"run":"run1","snapshot":"s1","checkpoints":["c1","c2"]}`))
	f.Add([]byte(`{"run":"run1","snapshot":"s1","checkp`))
	f.Add([]byte(`{"run":"run1","snapshot":"s2"}`))
	f.Add([]byte(``))
	f.Fuzz(func(t *testing.T, b []byte) {
		e, err := DecodeIndexEntry(b, "s1")
		if err != nil {
			return
		}
		if e.Snapshot != "s1" {
			t.Fatalf("accepted the entry of %q under s1", e.Snapshot)
		}
		again, _ := json.Marshal(e)
		if _, err := DecodeIndexEntry(again, "s1"); err != nil {
			t.Fatalf("an accepted entry re-encoded is refused: %v", err)
		}
	})
}
