package agentapi

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzDecodeBookmark: a bookmark of any bytes (a record read back at a
// restore) never panics the decoder; it is accepted valid or refused with
// ErrBadBookmark, and what it accepts survives a re-encode unchanged.
func FuzzDecodeBookmark(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"next":"seed","rollout":"r1","attempt":0,"task":{}}`,
		`{"v":1,"next":"harness","rollout":"r1","attempt":2,"task":{},"session":"r1","state":{"data_dir":"/d"},"resume":true}`,
		`{"v":1,"next":"verify","rollout":"r1","attempt":0,"task":{},"session":"r1"}`,
		`{"v":1,"next":"return","rollout":"r1","attempt":0,"task":{},"result":{"rollout_id":"r1","attempt":0,"episode":"r1","adapter":"scripted","launches":[]}}`,
		`{"v":1,"next":"harness","rollout":"r1.b2","attempt":1,"task":{},"session":"r1.b2","state":{},"branch":{"parent":"r1","k":2,"seed":7,"source_checkpoint_id":"c1","label":"b2"}}`,
		`{"v":2,"next":"seed","rollout":"r1"}`,
		`{"v":1,"next":"seed","rollout":"r1"`,
		``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		b, err := DecodeBookmark(raw)
		if err != nil {
			if !errors.Is(err, ErrBadBookmark) {
				t.Fatalf("refused with %v, which is not ErrBadBookmark", err)
			}
			return
		}
		if err := b.Validate(); err != nil {
			t.Fatalf("accepted an invalid bookmark: %v", err)
		}
		again, err := json.Marshal(b)
		if err != nil {
			t.Fatalf("an accepted bookmark does not re-encode: %v", err)
		}
		b2, err := DecodeBookmark(again)
		if err != nil {
			t.Fatalf("an accepted bookmark re-encoded is refused: %v\n%s", err, again)
		}
		if again2, _ := json.Marshal(b2); string(again2) != string(again) {
			t.Fatalf("a round trip changed the bookmark:\n%s\n%s", again, again2)
		}
	})
}
