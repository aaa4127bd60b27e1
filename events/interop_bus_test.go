package events_test

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/leak"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

func TestMain(m *testing.M) { leak.VerifyTestMain(m, jstest.LeakOptions()...) }

// Values as others write them: non-ASCII, a % that starts no escape, one
// that does (%zz does not, %41 would), double quotes. sdk-go keeps a
// source in its URI form: ä as %C3%A4, a percent sign as %25.
const (
	interopNote   = `résumé 100% done, 50%off "quoted" %zz`
	interopSource = "/fleet/%C3%A4/50%25off"
)

// interopPrepare is a Stillpoint phase event carrying interopNote in an
// extension of its own.
func interopPrepare(t *testing.T) (event.Event, events.Prepare) {
	t.Helper()
	p := events.Prepare{PhaseHeader: events.PhaseHeader{Run: "run1", CheckpointID: "ckpt-7", Seq: 1, Epoch: 2,
		Deadline: time.Date(2026, 11, 29, 8, 0, 30, 0, time.UTC), Members: []events.Member{"agent.a0", "owner.o0"}}}
	e, err := events.New("bridge.main", p)
	if err != nil {
		t.Fatal(err)
	}
	e.SetExtension("spnote", interopNote)
	return e, p
}

// interopForeign is a CloudEvent of another system's, with interopSource
// and interopNote.
func interopForeign(t *testing.T) event.Event {
	t.Helper()
	e := event.New()
	e.SetID("foreign-1")
	e.SetType("com.example.fleet.moved.v1")
	e.SetSource(interopSource)
	e.SetSubject("ä%")
	e.SetExtension("note", interopNote)
	if err := e.SetData(event.ApplicationJSON, map[string]string{"to": "ä"}); err != nil {
		t.Fatal(err)
	}
	if err := e.Validate(); err != nil {
		t.Fatal(err)
	}
	return e
}

// lastOnStream reads the message stored last on subject, as our readers
// get it from the server.
func lastOnStream(t *testing.T, env *jstest.Env, subject string) *nats.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	s, err := env.JS.Stream(ctx, jetstream.StreamName)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		t.Fatalf("reading %s back: %v", subject, err)
	}
	return &nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}
}

// TestInteropJetStreamSDKWritesWeRead: events sent by sdk-go's JetStream
// binding (its Sender, which writes header values raw) through a real
// server decode with our codec: a Stillpoint event with a non-ASCII, %
// and quote-bearing extension, and another system's event with such a
// ce-source and ce-subject.
func TestInteropJetStreamSDKWritesWeRead(t *testing.T) {
	env := jstest.Start(t)
	nc, _ := env.Connect(t)
	send := func(subject string, e event.Event) {
		t.Helper()
		s, err := cejs.NewSenderFromConn(nc, jetstream.StreamName, subject, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(t.Context(), binding.ToMessage(&e)); err != nil {
			t.Fatalf("sdk-go Send: %v", err)
		}
	}

	ours, p := interopPrepare(t)
	send(events.Subject(p), ours)
	m := lastOnStream(t, env, events.Subject(p))
	if got := m.Header.Get("ce-spnote"); got != interopNote {
		t.Fatalf("sdk-go wrote ce-spnote %q, want it raw (%q): the test no longer tests a raw writer", got, interopNote)
	}
	e, d, err := events.Unmarshal(m)
	if err != nil {
		t.Fatalf("our Unmarshal of sdk-go's message: %v", err)
	}
	if got, ok := d.(events.Prepare); !ok || got.CheckpointID != p.CheckpointID || got.Seq != p.Seq {
		t.Errorf("data: %#v, want %#v", d, p)
	}
	if got := e.Extensions()["spnote"]; got != interopNote {
		t.Errorf("ce-spnote read as %q, want %q", got, interopNote)
	}

	foreign := interopForeign(t)
	send("sp.interop.foreign", foreign)
	m = lastOnStream(t, env, "sp.interop.foreign")
	if got := m.Header.Get("ce-source"); got != interopSource {
		t.Fatalf("sdk-go wrote ce-source %q, want %q", got, interopSource)
	}
	got, err := events.Parse(m)
	if err != nil {
		t.Fatalf("our Parse of sdk-go's message: %v", err)
	}
	if got.Source() != foreign.Source() || got.Subject() != foreign.Subject() || got.ID() != foreign.ID() ||
		got.Extensions()["note"] != interopNote || string(got.Data()) != string(foreign.Data()) {
		t.Errorf("we read\n%v\nsdk-go sent\n%v", got, foreign)
	}
}

// TestInteropJetStreamWeWriteSDKReads: our messages, published to a real
// server, are received by sdk-go's JetStream binding (its Consumer) as
// valid events with the same id, type, time and data. Its reader does not
// percent-decode: where a value needs the binding's encoding (non-ASCII,
// %, space, a double quote) it reads the encoding we wrote, which the
// binding's decoding turns back into our value; a Stillpoint event's own
// attributes are ASCII tokens that need none, and read the same.
func TestInteropJetStreamWeWriteSDKReads(t *testing.T) {
	env := jstest.Start(t)
	nc, _ := env.Connect(t)
	receive := func(subject string, publish func()) *event.Event {
		t.Helper()
		c, err := cejs.NewConsumerFromConn(nc, jetstream.StreamName, subject, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- c.OpenInbound(ctx) }()
		publish()
		msg, err := c.Receive(ctx)
		if errors.Is(err, io.EOF) {
			t.Fatalf("sdk-go received nothing on %s: %v", subject, ctx.Err())
		}
		e, err := binding.ToEvent(ctx, msg)
		if err != nil {
			t.Fatalf("sdk-go ToEvent: %v", err)
		}
		_ = msg.Finish(nil)
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sdk-go OpenInbound: %v", err)
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("sdk-go's event does not validate: %v", err)
		}
		return e
	}
	publish := func(m *nats.Msg) func() {
		return func() {
			if _, err := env.JS.PublishMsg(t.Context(), m); err != nil {
				t.Fatal(err)
			}
		}
	}
	// decoded is the value the binding's reader makes of what sdk-go read.
	decoded := func(field, wire string) string {
		t.Helper()
		m := nats.NewMsg("x")
		m.Header.Set("ce-specversion", "1.0")
		m.Header.Set("ce-id", "x")
		m.Header.Set("ce-type", "x")
		m.Header.Set("ce-source", "/x")
		m.Header.Set("ce-"+field, wire)
		e, err := events.Parse(m)
		if err != nil {
			t.Fatalf("decoding %s %q: %v", field, wire, err)
		}
		if v, ok := e.Extensions()[field]; ok {
			return v.(string)
		}
		return e.Subject()
	}

	ours, p := interopPrepare(t)
	m, err := events.Encode(events.Subject(p), ours)
	if err != nil {
		t.Fatal(err)
	}
	wire := m.Header.Get("ce-spnote")
	if wire == interopNote {
		t.Fatal("ce-spnote went out unencoded")
	}
	theirs := receive(events.Subject(p), publish(m))
	if theirs.ID() != ours.ID() || theirs.Type() != ours.Type() || theirs.Source() != ours.Source() ||
		theirs.Subject() != ours.Subject() || !theirs.Time().Equal(ours.Time()) || string(theirs.Data()) != string(ours.Data()) {
		t.Errorf("sdk-go read\n%v\nwe sent\n%v", theirs, ours)
	}
	for _, ext := range []string{events.ExtRun, events.ExtSeq, events.ExtEpoch} {
		if a, b := theirs.Extensions()[ext], ours.Extensions()[ext]; a != b {
			t.Errorf("extension %s: sdk-go %v, ours %v", ext, a, b)
		}
	}
	if got := theirs.Extensions()["spnote"]; got != wire || decoded("spnote", wire) != interopNote {
		t.Errorf("sdk-go read ce-spnote %q, want the wire's %q, which decodes to %q", got, wire, interopNote)
	}
	if d, err := events.DecodeAny(*theirs); err != nil || d.(events.Prepare).CheckpointID != p.CheckpointID {
		t.Errorf("DecodeAny of sdk-go's event: %v, %v", d, err)
	}

	foreign := interopForeign(t)
	m, err = events.Encode("sp.interop.foreign", foreign)
	if err != nil {
		t.Fatal(err)
	}
	theirs = receive("sp.interop.foreign", publish(m))
	if theirs.ID() != foreign.ID() || string(theirs.Data()) != string(foreign.Data()) {
		t.Errorf("sdk-go read\n%v\nwe sent\n%v", theirs, foreign)
	}
	if got := theirs.Source(); got != m.Header.Get("ce-source") {
		t.Errorf("sdk-go read ce-source %q, want the wire's %q", got, m.Header.Get("ce-source"))
	}
	if got, err := events.Parse(m); err != nil || got.Source() != foreign.Source() {
		t.Errorf("our own reader: source %q, %v, want %q", got.Source(), err, foreign.Source())
	}
	if got := theirs.Subject(); got != m.Header.Get("ce-subject") || decoded("subject", got) != foreign.Subject() {
		t.Errorf("sdk-go read ce-subject %q, want the wire's %q, which decodes to %q", got, m.Header.Get("ce-subject"), foreign.Subject())
	}
	if got := theirs.Extensions()["note"]; got != m.Header.Get("ce-note") || decoded("note", got.(string)) != interopNote {
		t.Errorf("sdk-go read ce-note %q, want the wire's %q", got, m.Header.Get("ce-note"))
	}
}
