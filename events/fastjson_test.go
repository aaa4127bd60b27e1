package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"
)

// fastTypes are the payloads with a fast decode, each with a sample as a
// sandbox daemon or the bridge sends it.
func fastTypes() []Data {
	wall := time.Date(2026, 11, 29, 8, 0, 1, 250_000_000, time.UTC)
	report := &PauseReport{Mode: "freeze", PauseSeq: 3, Identity: "412:98231", Wall: wall, Uptime: 1234.56,
		PIDCount: 2, PIDs: []int{412, 413}, Pending: []string{"414:D"}, Fallback: "l1: gone", Frozen: true, TookMS: 0.75, HeldCalls: 1}
	pa := PrepareAck{AckHeader: testAck(3), Ready: true, BlockerCount: 2, Blockers: []string{"r1", "r2"}, Restarts: []string{"r3"}, Counts: map[string]int{"launches": 2, "x": -1}, Pause: report}
	ra := ResumeAck{AckHeader: testAck(4), Pause: report}
	ra.State = StateIdle
	return []Data{
		Prepare{PhaseHeader: testRosterPhase(3)},
		Prepare{PhaseHeader: testPhase(3)},
		Resume{PhaseHeader: testRosterPhase(4), Aborted: true},
		pa, PrepareAck{AckHeader: testAck(1)}, PrepareAck{AckHeader: testAck(1), Ready: true, Counts: map[string]int{}},
		ra, ResumeAck{AckHeader: testAck(2)},
	}
}

// fastDecode runs the fast decode of d's type on b.
func fastDecode(d Data, b []byte) (Data, bool) {
	v := reflect.New(reflect.TypeOf(d))
	ok := v.Interface().(fastDecoder).decodeFast(b)
	return v.Elem().Interface().(Data), ok
}

// refDecode decodes b as d's type with encoding/json.
func refDecode(d Data, b []byte) (Data, error) {
	v := reflect.New(reflect.TypeOf(d))
	err := json.Unmarshal(b, v.Interface())
	return v.Elem().Interface().(Data), err
}

// TestFastDecodeTakesMarshal: what Marshal writes for every payload with a
// fast decode takes it, to the value encoding/json makes of it; otherwise
// the fast decode would be dead code that every member pays a try of.
func TestFastDecodeTakesMarshal(t *testing.T) {
	for _, d := range fastTypes() {
		b, err := json.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := fastDecode(d, b)
		if !ok {
			t.Errorf("%T %s: not taken by the fast decode", d, b)
			continue
		}
		want, err := refDecode(d, b)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%T %s: fast %+v, encoding/json %+v (%v)", d, b, got, want, err)
		}
	}
}

// TestFastDecodeGivesUp: what the fast decode does not read the same way
// encoding/json does, it leaves to encoding/json.
func TestFastDecodeGivesUp(t *testing.T) {
	for _, b := range []string{
		`{"run":"run1","run":"run2"}`, // a key twice: encoding/json keeps the last
		`{"Run":"run1"}`,              // another case: encoding/json matches it
		`{"run":"r\u0075n1"}`,         // an escape
		`{"seq":1.0}`, `{"seq":1e2}`,  // not an integer's form
		`{"seq":-1}`, `{"seq":01}`, // not a uint64
		`{"seq":18446744073709551616}`,           // past uint64
		`{"members":null}`, `{"sandboxes":null}`, // null
		`{"extra":1}`,                        // a key it does not know
		`{"run":"run1"} x`, `[]`, `null`, ``, // not one object
		"{\"run\":\"a\xffb\"}", // not UTF-8
	} {
		if _, ok := fastDecode(Prepare{}, []byte(b)); ok {
			t.Errorf("Prepare %s: taken by the fast decode", b)
		}
	}
}

// TestFastDecodeLeavesLargeObjects: an object with more keys than any
// payload's (a counts of 100,000 entries in a ~1 MB ack) is left to
// encoding/json once it passes maxFastKeys, not checked for repeated keys
// one by one against all before it (seconds of work); Validate then
// refuses it.
func TestFastDecodeLeavesLargeObjects(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"run":"run1","member":"agent.a0","seq":1,"checkpoint_id":"ckpt-7","epoch":2,"ok":true,"phase":"prepared","took_ms":1,"ready":true,"counts":{`)
	for i := range 100_000 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"%d":1`, i)
	}
	b.WriteString(`}}`)
	if _, ok := fastDecode(PrepareAck{}, []byte(b.String())); ok {
		t.Fatal("a counts of 100,000 keys taken by the fast decode")
	}
	if _, err := decodeData[PrepareAck]([]byte(b.String())); !errors.Is(err, ErrTooLarge) {
		t.Errorf("decoded: %v, want %v", err, ErrTooLarge)
	}
}

// FuzzFastDecode holds the fast decode to encoding/json: whatever it takes,
// encoding/json takes too, to the same value.
func FuzzFastDecode(f *testing.F) {
	for _, d := range fastTypes() {
		b, err := json.Marshal(d)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte(` { "seq" : 0 , "epoch":-0, "took_ms":-9223372036854775808, "pause":{"uptime":-0.5e-3,"pids":[]} } `))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, d := range fastTypes() {
			got, ok := fastDecode(d, b)
			if !ok {
				continue
			}
			want, err := refDecode(d, b)
			if err != nil {
				t.Fatalf("%T %q: taken by the fast decode, refused by encoding/json: %v", d, b, err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%T %q: fast %+v, encoding/json %+v", d, b, got, want)
			}
		}
	})
}
