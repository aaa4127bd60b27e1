package daemon

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/sandboxd"
)

// TestEpisodesFileErrors: an episodes.json that is torn, empty or names
// what is not a launch or an episode is refused, saying which.
func TestEpisodesFileErrors(t *testing.T) {
	for _, c := range []struct{ name, body, want string }{
		{"good", `{"l1":"r1-a2","l2":"r2"}`, ""},
		{"none yet", `{}`, ""},
		{"torn", `{"l1":"r1-a2","l2":"r`, "torn or not JSON"},
		{"empty", ``, "empty"},
		{"null", `null`, "null"},
		{"two objects", `{} {}`, "trailing data"},
		{"bad launch id", `{"../x":"r1"}`, `launch "../x"`},
		{"bad episode", `{"l1":"r1-a0"}`, "launch l1"},
	} {
		_, err := decodeEpisodes([]byte(c.body))
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// FuzzDecodeEpisodes: episodes.json of any bytes never panics the reader,
// and what it accepts holds only launch ids and episodes.
func FuzzDecodeEpisodes(f *testing.F) {
	f.Add([]byte(`{"l1":"r1-a2","l2":"r2"}`))
	f.Add([]byte(`{"l1":"r1-a2","l2":"r`))
	f.Add([]byte(`{"../x":"r1"}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		eps, err := decodeEpisodes(b)
		if err != nil {
			return
		}
		for id, key := range eps {
			if sandboxd.ValidateID(id) != nil {
				t.Fatalf("accepted launch id %q", id)
			}
			if _, err := events.ParseEpisode(key); err != nil {
				t.Fatalf("accepted episode %q: %v", key, err)
			}
		}
		again, _ := json.Marshal(eps)
		if _, err := decodeEpisodes(again); err != nil {
			t.Fatalf("accepted episodes rewritten are refused: %v", err)
		}
	})
}
