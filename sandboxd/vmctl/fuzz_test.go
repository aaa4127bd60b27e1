package vmctl

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzDecodeRequest: any host line decodes to a valid request or an error
// wrapping ErrProtocol, never a panic; a valid one encodes and decodes to
// the same op and id.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"id":1,"op":"hello"}`,
		`{"id":2,"op":"identify","sandbox":"s","run":"r","nats_url":"nats://10.0.2.100:4222","entropy":"` + string(bytes.Repeat([]byte("A"), 88)) + `"}`,
		`{"id":3,"op":"exec","argv":["sh","-c","true"],"timeout_ms":5,"stdin":"aGk="}`,
		`{"id":4,"op":"lease","until_ms":60000}`,
		`{"id":5,"op":"clock","wall":"2026-12-01T11:00:00Z"}`,
		`{"id":6,"op":"reidentify","sandbox":"s","epoch":3,"entropy":"` + string(bytes.Repeat([]byte("A"), 88)) + `"}`,
		`{"id":0}`, `[]`, `null`, `{"id":-1,"op":"sync"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		r, err := DecodeRequest(line)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error not wrapping ErrProtocol: %v", err)
			}
			return
		}
		b, err := Encode(r)
		if err != nil {
			t.Fatalf("encode a valid request: %v", err)
		}
		again, err := DecodeRequest(b)
		if err != nil || again.ID != r.ID || again.Op != r.Op {
			t.Fatalf("round trip of %q: %+v %v", b, again, err)
		}
	})
}

// FuzzDecodeGuestLine: any guest line decodes to one response or one
// notice, or an error wrapping ErrProtocol.
func FuzzDecodeGuestLine(f *testing.F) {
	for _, s := range []string{
		`{"event":"ready","state":"template"}`,
		`{"id":4,"ok":true,"exit":2,"stdout":"aGk=","stderr":""}`,
		`{"id":5,"ok":true,"state":"identified","member":"sandbox.s","identity":{"pid":1,"start":9}}`,
		`{"id":0,"ok":false,"error":"bad line"}`,
		`{"event":null}`, `{"ok":true}`, `7`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		r, n, err := DecodeGuestLine(line)
		switch {
		case err != nil:
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("error not wrapping ErrProtocol: %v", err)
			}
		case (r == nil) == (n == nil):
			t.Fatalf("%q: want exactly one of a response and a notice: %v %v", line, r, n)
		case r != nil && r.ID == 0 && r.OK:
			t.Fatalf("%q: an ok response without id", line)
		}
	})
}
