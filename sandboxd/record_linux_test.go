package sandboxd

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// TestTornRecordLosesNothingElse: the next supervisor finds a record torn
// by a crash beside one whose launch its dead predecessor left. It says
// which record it cannot read and why, leaves that file as it was, and
// still ends the other launch as lost.
func TestTornRecordLosesNothingElse(t *testing.T) {
	state := t.TempDir()
	torn, lost := launchID(t, "torn"), launchID(t, "lost")
	dead := sandboxapi.Identity{PID: 1 << 22, Start: 1} // above pid_max: no such process
	now := time.Now().UTC()
	for _, id := range []string{torn, lost} {
		rec := sandboxapi.Record{V: recordVersion, ID: id, Argv: []string{"true"}, Created: now, Supervisor: dead,
			State: sandboxapi.StateRunning, Mode: sandboxapi.ModeStop, Output: filepath.Join(LaunchDir(state, id), OutputFile)}
		if err := os.MkdirAll(LaunchDir(state, id), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := writeRecord(LaunchDir(state, id), &rec, true); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(LaunchDir(state, torn), RecordFile)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b = b[:len(b)/2]
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}

	s := startSupervisor(t, Config{StateDir: state, NoCgroup: true})
	rc, err := s.Wait(ctxT(t), lost)
	if err != nil || rc.Outcome != sandboxapi.OutcomeFailed || !strings.Contains(rc.Error, ErrSupervisorRestarted.Error()) {
		t.Fatalf("the launch beside a torn record: %+v, %v", rc, err)
	}
	_, err = ReadRecord(state, torn)
	if !errors.Is(err, ErrBadRecord) || !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "torn or not JSON") {
		t.Errorf("reading the torn record: %v", err)
	}
	if after, _ := os.ReadFile(path); string(after) != string(b) {
		t.Errorf("the torn record was changed to %q", after)
	}
}

// TestRecordErrors: each way a record is unusable is named.
func TestRecordErrors(t *testing.T) {
	good, _ := json.Marshal(sandboxapi.Record{V: recordVersion, ID: "l1", Argv: []string{"true"}})
	for _, c := range []struct{ name, body, want string }{
		{"good", string(good), ""},
		{"torn", string(good[:len(good)-5]), "torn or not JSON"},
		{"empty", "", "empty"},
		{"no version", `{"id":"l1"}`, `no version field "v"`},
		{"unknown version", `{"v":2,"id":"l1"}`, "version 2, this build reads version 1"},
		{"another launch's", `{"v":1,"id":"l2"}`, `record of launch "l2", not "l1"`},
		{"wrong type", `{"v":1,"id":"l1","argv":"true"}`, "does not decode"},
	} {
		_, err := decodeRecord([]byte(c.body), "l1")
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
	}
}

// FuzzDecodeRecord: a launch record of any bytes never panics the reader,
// and what it accepts is a record of this version and launch that
// survives a rewrite.
func FuzzDecodeRecord(f *testing.F) {
	good, _ := json.Marshal(sandboxapi.Record{V: recordVersion, ID: "l1", Argv: []string{"true"}, State: sandboxapi.StateRunning})
	f.Add(good)
	f.Add(good[:len(good)/2])
	f.Add([]byte(`{"v":2,"id":"l1"}`))
	f.Add([]byte(`{"v":1,"id":"l1","receipt":{"exit_code":-1}}`))
	f.Add([]byte(""))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := decodeRecord(b, "l1")
		if err != nil {
			return
		}
		if r.V != recordVersion || r.ID != "l1" {
			t.Fatalf("accepted a record of version %d, id %q", r.V, r.ID)
		}
		again, err := json.Marshal(r)
		if err != nil {
			t.Fatalf("an accepted record does not re-encode: %v", err)
		}
		if _, err := decodeRecord(again, "l1"); err != nil {
			t.Fatalf("an accepted record re-encoded is refused: %v", err)
		}
	})
}
