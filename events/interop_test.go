package events

import (
	"bytes"
	"context"
	"reflect"
	"testing"
	"time"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/nats-io/nats.go"
)

// TestInteropSDKWritesWeRead: an event written by sdk-go's NATS binding
// (WriteMsg, binary mode) decodes with our codec, for every type.
func TestInteropSDKWritesWeRead(t *testing.T) {
	for typ, s := range samples() {
		t.Run(typ.Noun(), func(t *testing.T) {
			e, err := New(s.src, s.data, WithTime(time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)))
			if err != nil {
				t.Fatal(err)
			}
			var body bytes.Buffer
			hdr, err := cejs.WriteMsg(context.Background(), binding.ToMessage(&e), &body)
			if err != nil {
				t.Fatalf("sdk-go WriteMsg: %v", err)
			}
			m := &nats.Msg{Subject: Subject(s.data), Header: hdr, Data: body.Bytes()}
			got, d, err := Unmarshal(m)
			if err != nil {
				t.Fatalf("our Unmarshal of sdk-go's message: %v", err)
			}
			if !reflect.DeepEqual(d, s.data) {
				t.Errorf("data:\n got %#v\nwant %#v", d, s.data)
			}
			if got.ID() != e.ID() || !got.Time().Equal(e.Time()) || got.Source() != e.Source() {
				t.Errorf("attributes differ: %v vs %v", got, e)
			}
		})
	}
}

// TestInteropWeWriteSDKReads: our binary-mode message decodes with sdk-go's
// NewMessage + binding.ToEvent, attribute for attribute.
func TestInteropWeWriteSDKReads(t *testing.T) {
	for typ, s := range samples() {
		t.Run(typ.Noun(), func(t *testing.T) {
			m, err := Marshal(s.src, s.data)
			if err != nil {
				t.Fatal(err)
			}
			ours, err := Parse(m)
			if err != nil {
				t.Fatal(err)
			}
			theirs, err := binding.ToEvent(context.Background(), cejs.NewMessage(m))
			if err != nil {
				t.Fatalf("sdk-go ToEvent: %v", err)
			}
			if err := theirs.Validate(); err != nil {
				t.Fatalf("sdk-go's event does not validate: %v", err)
			}
			if theirs.ID() != ours.ID() || theirs.Type() != ours.Type() || theirs.Source() != ours.Source() ||
				theirs.Subject() != ours.Subject() || !theirs.Time().Equal(ours.Time()) ||
				theirs.DataContentType() != ours.DataContentType() || !bytes.Equal(theirs.Data(), ours.Data()) {
				t.Errorf("sdk-go read\n%v\nwe read\n%v", theirs, ours)
			}
			for _, ext := range []string{ExtRun, ExtSeq, ExtEpoch} {
				if a, b := theirs.Extensions()[ext], ours.Extensions()[ext]; a != b {
					t.Errorf("extension %s: sdk-go %v, ours %v", ext, a, b)
				}
			}
			d, err := DecodeAny(*theirs)
			if err != nil {
				t.Fatalf("DecodeAny of sdk-go's event: %v", err)
			}
			if !reflect.DeepEqual(d, s.data) {
				t.Errorf("data:\n got %#v\nwant %#v", d, s.data)
			}
		})
	}
}
