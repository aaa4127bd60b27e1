package events

import (
	"bytes"
	"context"
	"strings"
	"testing"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/nats-io/nats.go"
)

// fuzzHeaders packs headers as "name: value" lines, the shape the fuzzer
// mutates.
func fuzzHeaders(h nats.Header) string {
	var b strings.Builder
	for k, vs := range h {
		for _, v := range vs {
			b.WriteString(k + ": " + v + "\n")
		}
	}
	return b.String()
}

// FuzzUnmarshal feeds arbitrary headers and data to the decoder. It must
// never panic, and whatever it accepts must survive a re-encode unchanged.
func FuzzUnmarshal(f *testing.F) {
	for _, s := range samples() {
		m, err := Marshal(s.src, s.data, WithID("seed"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(m.Subject, fuzzHeaders(m.Header), m.Data)
	}
	f.Add("sp.run1.phase.prepare", "Content-Type: application/cloudevents+json\n", []byte(`{"specversion":"1.0"}`))
	f.Add("", "ce-specversion: 1.0\nce-id: %\n", []byte(`{}`))
	// As other writers write them (PROTOCOL-HISTORY §29): sdk-go's raw values, a %
	// that starts no escape, quoted values with backslash escapes, a URI's
	// own escapes in ce-source.
	for _, s := range samples() {
		e, err := New(s.src, s.data, WithID("raw"))
		if err != nil {
			f.Fatal(err)
		}
		e.SetExtension("spnote", `résumé 100% "done" %zz \`)
		var body bytes.Buffer
		hdr, err := cejs.WriteMsg(context.Background(), binding.ToMessage(&e), &body)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(Subject(s.data), fuzzHeaders(hdr), body.Bytes())
	}
	for _, s := range samples() {
		m, err := Marshal(s.src, s.data, WithID("schema"))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(m.Subject, fuzzHeaders(m.Header)+"ce-dataschema: #\n", m.Data)
	}
	f.Add("sp.x", "ce-specversion: 1.0\nce-id: 50%off\nce-type: t\nce-source: /fleet/%C3%A4/50%25off\nce-note: \"a\\\"b%20c\"\n", []byte(`{}`))
	f.Add("sp.x", "ce-specversion: \"1.0\"\nce-id: \"\\\"\nce-type: \"t\"b\"\nce-source: \"/x\"\nce-subject: %%41%4\n", []byte(`{}`))
	f.Fuzz(func(t *testing.T, subject, headers string, data []byte) {
		m := nats.NewMsg(subject)
		for _, line := range strings.Split(headers, "\n") {
			k, v, ok := strings.Cut(line, ": ")
			if ok {
				m.Header.Add(k, v)
			}
		}
		m.Data = data
		e, d, err := Unmarshal(m)
		if err != nil {
			if e.ID() != "" || d != nil {
				t.Fatalf("error %v with a result", err)
			}
			return
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("accepted an event that the CloudEvents model refuses: %v", err) // parseBinary skips Validate where it finds nothing
		}
		again, err := Encode(Subject(d), e)
		if err != nil {
			t.Fatalf("accepted event does not re-encode: %v", err)
		}
		e2, d2, err := Unmarshal(again)
		if err != nil {
			t.Fatalf("re-encoded event does not decode: %v", err)
		}
		if e2.ID() != e.ID() || e2.Type() != e.Type() || !bytes.Equal(e2.Data(), e.Data()) || d2.Type() != d.Type() {
			t.Fatalf("round trip changed the event:\n%v\n%v", e, e2)
		}
	})
}
