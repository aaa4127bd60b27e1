package vmctl

import (
	"bytes"
	"errors"
	"testing"
	"time"
)

func TestRequestRoundTrip(t *testing.T) {
	in := Request{ID: 7, Op: OpReidentify, Sandbox: "s2", Run: "r1", NATSURL: "nats://10.0.2.101:4222",
		Entropy: bytes.Repeat([]byte{1}, EntropyBytes), Wall: time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC), SetClock: true,
		Files: []File{{Path: "work/a", Mode: 0o600, Data: []byte("x")}}, Args: []string{"--mode", "freeze"}, LeaseMS: 60000, Epoch: 3}
	line, err := Encode(in)
	if err != nil {
		t.Fatal(err)
	}
	if line[len(line)-1] != '\n' || bytes.Count(line, []byte("\n")) != 1 {
		t.Fatalf("not one line: %q", line)
	}
	out, err := DecodeRequest(line)
	if err != nil {
		t.Fatal(err)
	}
	if out.Epoch != 3 || out.Sandbox != "s2" || !out.Wall.Equal(in.Wall) || string(out.Files[0].Data) != "x" || out.Files[0].Mode != 0o600 {
		t.Fatalf("round trip: %+v", out)
	}
	if bytes.Contains(line, []byte(`"argv"`)) || bytes.Contains(line, []byte(`"until_ms"`)) {
		t.Fatalf("fields of other ops are on the line: %s", line)
	}
}

func TestRequestValidate(t *testing.T) {
	ent := bytes.Repeat([]byte{1}, EntropyBytes)
	for _, tc := range []struct {
		name string
		line string
		ok   bool
	}{
		{"hello", `{"id":1,"op":"hello"}`, true},
		{"no id", `{"op":"hello"}`, false},
		{"unknown op", `{"id":1,"op":"fly"}`, false},
		{"no op", `{"id":1}`, false},
		{"lease", `{"id":1,"op":"lease","until_ms":1000}`, true},
		{"lease zero", `{"id":1,"op":"lease"}`, false},
		{"exec", `{"id":1,"op":"exec","argv":["true"]}`, true},
		{"exec no argv", `{"id":1,"op":"exec"}`, false},
		{"clock", `{"id":1,"op":"clock","wall":"2026-12-01T11:00:00Z"}`, true},
		{"clock no wall", `{"id":1,"op":"clock"}`, false},
		{"not json", `{"id":1,`, false},
	} {
		_, err := DecodeRequest([]byte(tc.line))
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrProtocol)) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	id := Request{ID: 1, Op: OpIdentify, Sandbox: "s", Run: "r", NATSURL: "nats://x:1", Entropy: ent}
	if err := id.Validate(); err != nil {
		t.Fatal(err)
	}
	// Epoch 0: a branch in the run's first epoch, whose sandboxd takes the
	// epoch from the phases.
	re := id
	re.Op = OpReidentify
	if err := re.Validate(); err != nil {
		t.Fatalf("reidentify in epoch 0: %v", err)
	}
	initOnly := Request{ID: 1, Op: OpIdentify, Sandbox: "s", Init: []string{"sh", "-c", "true"}, Entropy: ent}
	if err := initOnly.Validate(); err != nil {
		t.Fatalf("identify with init: %v", err)
	}
	initOnly.Op = OpReidentify
	initOnly.Init = nil
	if err := initOnly.Validate(); err != nil {
		t.Fatalf("reidentify without run: %v", err)
	}
	both := id
	both.Init = []string{"true"}
	if err := both.Validate(); !errors.Is(err, ErrProtocol) {
		t.Fatalf("run and init: %v", err)
	}
	short := id
	short.Entropy = ent[:8]
	if err := short.Validate(); !errors.Is(err, ErrProtocol) {
		t.Fatalf("short entropy: %v", err)
	}
}

func TestDecodeGuestLine(t *testing.T) {
	r, n, err := DecodeGuestLine([]byte(`{"event":"ready","state":"template"}`))
	if err != nil || r != nil || n.Event != EventReady || n.State != StateTemplate {
		t.Fatalf("event: %v %v %v", r, n, err)
	}
	line, _ := Encode(Response{ID: 4, OK: true, ExecResult: &ExecResult{Exit: 2, Stdout: []byte("hi")}})
	r, n, err = DecodeGuestLine(line)
	if err != nil || n != nil || r.ID != 4 || r.ExecResult == nil || r.Exit != 2 || string(r.Stdout) != "hi" {
		t.Fatalf("response: %+v %v %v", r, n, err)
	}
	line, _ = Encode(Response{ID: 5, OK: true, Hello: &Hello{State: StateIdentified, Member: "sandbox.s", Identity: Identity{PID: 1, Start: 9}, Epoch: 2}})
	r, _, err = DecodeGuestLine(line)
	if err != nil || r.Hello == nil || r.Member != "sandbox.s" || r.Identity.Start != 9 || r.Epoch != 2 {
		t.Fatalf("hello: %+v %v", r, err)
	}
	if _, _, err := DecodeGuestLine([]byte(`{"ok":true}`)); !errors.Is(err, ErrProtocol) {
		t.Fatalf("no id: %v", err)
	}
	if r, _, err := DecodeGuestLine([]byte(`{"id":0,"ok":false,"error":"bad line"}`)); err != nil || r.Error != "bad line" {
		t.Fatalf("refusal of an unreadable line: %+v %v", r, err)
	}
}
