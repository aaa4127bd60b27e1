package member

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"testing"

	"github.com/stillpoint/stillpoint/events"
)

// FuzzScanRecords: a records object of any bytes never panics the reader;
// the size and digest cover every byte; when no line is bad, every line
// is a record and each one kept re-encodes to a record with its key.
func FuzzScanRecords(f *testing.F) {
	var ok bytes.Buffer
	for _, r := range []events.Record{{Key: "r1", Data: json.RawMessage(`{"stage":"launch"}`)}, {Key: "r2-a1", Data: json.RawMessage(`null`)}} {
		b, _ := json.Marshal(r)
		ok.Write(append(b, '\n'))
	}
	f.Add(ok.Bytes())
	f.Add(ok.Bytes()[:ok.Len()-3])
	f.Add([]byte("{\"key\":\"\"}\n"))
	f.Add([]byte("not json\n{\"key\":\"r1\"}\n"))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		sc := scanRecords(bytes.NewReader(b), nil)
		if sc.err != nil {
			t.Fatalf("a read error from memory: %v", sc.err)
		}
		sum := sha256.Sum256(b)
		if sc.size != int64(len(b)) || sc.sha256 != hex.EncodeToString(sum[:]) {
			t.Fatalf("size %d sha256 %s for %d bytes", sc.size, sc.sha256, len(b))
		}
		if lines := bytes.Count(b, []byte("\n")); sc.count != lines {
			t.Fatalf("count %d for %d lines", sc.count, lines)
		}
		if sc.bad != "" {
			return
		}
		if len(sc.kept) != sc.count {
			t.Fatalf("no bad line, but %d of %d lines kept", len(sc.kept), sc.count)
		}
		for _, r := range sc.kept {
			if r.Key == "" {
				t.Fatal("a record without a key was kept")
			}
			enc, err := json.Marshal(r)
			if err != nil {
				t.Fatalf("kept record %q does not re-encode: %v", r.Key, err)
			}
			var back events.Record
			if err := json.Unmarshal(enc, &back); err != nil || back.Key != r.Key {
				t.Fatalf("kept record %q re-encoded reads %q, %v", r.Key, back.Key, err)
			}
		}
	})
}
