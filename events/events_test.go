package events

import (
	"errors"
	"math/rand/v2"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

func TestSamplesCoverEveryType(t *testing.T) {
	s := samples()
	for _, typ := range Types() {
		if _, ok := s[typ]; !ok {
			t.Errorf("no sample for %s", typ)
		}
	}
}

func TestRoundTripEveryType(t *testing.T) {
	for typ, s := range samples() {
		t.Run(typ.Noun(), func(t *testing.T) {
			at := time.Date(2026, 11, 29, 8, 0, 0, 123456789, time.UTC)
			m, err := Marshal(s.src, s.data, WithID("id-"+typ.Noun()), WithTime(at))
			if err != nil {
				t.Fatalf("Marshal: %v", err)
			}
			if got := m.Header.Get(HeaderMsgID); got != "id-"+typ.Noun() {
				t.Errorf("Nats-Msg-Id = %q, want the ce-id", got)
			}
			for k := range m.Header {
				if strings.HasPrefix(strings.ToLower(k), "ce-") && k != strings.ToLower(k) {
					t.Errorf("header %q is not lower-case", k)
				}
			}
			e, d, err := Unmarshal(m)
			if err != nil {
				t.Fatalf("Unmarshal: %v", err)
			}
			if !reflect.DeepEqual(d, s.data) {
				t.Errorf("data changed in the round trip:\n got %#v\nwant %#v", d, s.data)
			}
			if !e.Time().Equal(at) || e.Type() != string(typ) || e.SpecVersion() != "1.0" {
				t.Errorf("attributes: time %v type %s specversion %s", e.Time(), e.Type(), e.SpecVersion())
			}
			if got := e.Source(); !strings.HasPrefix(got, "/run1/") {
				t.Errorf("source = %q", got)
			}
		})
	}
}

func TestDecodeTyped(t *testing.T) {
	s := samples()[TypeCommit]
	e, err := New(s.src, s.data)
	if err != nil {
		t.Fatal(err)
	}
	c, err := Decode[Commit](e)
	if err != nil {
		t.Fatalf("Decode[Commit]: %v", err)
	}
	if !c.Stop || len(c.Scope) != 2 || c.Scope[1] != (Episode{Rollout: "r2", Attempt: 3}) {
		t.Errorf("decoded %+v", c)
	}
	if _, err := Decode[Prepare](e); !errors.Is(err, ErrMismatch) || !strings.Contains(err.Error(), "ce-type") {
		t.Errorf("Decode[Prepare] of a commit: %v, want a ce-type mismatch", err)
	}
}

func TestSubjects(t *testing.T) {
	cases := map[Type]string{
		TypePrepare:             "sp.run1.phase.prepare",
		TypePrepareAck:          "sp.run1.ack.1.prepare.agent.a0",
		TypeCommitAck:           "sp.run1.ack.3.commit.agent.a0",
		TypeCheckpointCommitted: "sp.run1.outcome.checkpoint.committed",
		TypeMemberJoined:        "sp.run1.member.sandbox.sb-1",
	}
	s := samples()
	for typ, want := range cases {
		if got := Subject(s[typ].data); got != want {
			t.Errorf("%s: subject %q, want %q", typ, got, want)
		}
	}
	if got := AckFilter("run1", 9); got != "sp.run1.ack.9.>" {
		t.Errorf("AckFilter = %q", got)
	}
}

func TestPercentEncoding(t *testing.T) {
	cases := []struct{ in, out string }{
		{"plain", "plain"},
		{"ckpt-42 café", "ckpt-42%20caf%C3%A9"},
		{`a"b%c`, "a%22b%25c"},
		{"tab\there~", "tab%09here~"},
		{"\x7f", "%7F"},
	}
	for _, c := range cases {
		if got := percentEncode(c.in); got != c.out {
			t.Errorf("percentEncode(%q) = %q, want %q", c.in, got, c.out)
		}
		back, err := percentDecode("x", c.out)
		if err != nil || back != c.in {
			t.Errorf("percentDecode(%q) = %q, %v", c.out, back, err)
		}
	}
	if got, err := percentDecode("x", `"quoted%20value"`); err != nil || got != "quoted value" {
		t.Errorf("quoted value decoded to %q, %v", got, err)
	}
	// As other writers write them (sdk-go's JetStream binding writes values
	// raw): a % that starts no escape is itself, a quoted-string is
	// unquoted with its backslash escapes, a value that is not one is read
	// as it is.
	for _, c := range []struct{ in, out string }{
		{"%", "%"},
		{"%4", "%4"},
		{"%G1", "%G1"},
		{"100%", "100%"},
		{"50%off", "50%off"},
		{"%%41", "%A"},
		{"ä 100% %zz", "ä 100% %zz"},
		{`"a\"b"`, `a"b`},
		{`"back\\slash"`, `back\slash`},
		{`"\q%20x"`, "q x"},
		{`"a"b"`, `"a"b"`},
		{`"open`, `"open`},
		{`"esc\"`, `"esc\"`},
		{`"`, `"`},
		{`""`, ""},
	} {
		if got, err := percentDecode("x", c.in); err != nil || got != c.out {
			t.Errorf("percentDecode(%q) = %q, %v, want %q", c.in, got, err, c.out)
		}
	}
	// A valid escape of a broken UTF-8 sequence, or broken UTF-8 raw, is
	// refused.
	for _, bad := range []string{"%C3", "%FF", "\xff", `"%C3"`, "100%\xc3"} {
		if _, err := percentDecode("ce-subject", bad); err == nil || !strings.Contains(err.Error(), "ce-subject") {
			t.Errorf("percentDecode(%q) = %v, want an error naming ce-subject", bad, err)
		}
	}
}

func TestHeaderNamesAreCaseInsensitive(t *testing.T) {
	m, err := Marshal(testBridge, Prepare{testPhase(1)})
	if err != nil {
		t.Fatal(err)
	}
	mixed := nats.NewMsg(m.Subject)
	mixed.Data = m.Data
	for k, v := range m.Header {
		if strings.HasPrefix(k, "ce-") {
			k = "Ce-" + strings.ToUpper(k[3:4]) + k[4:]
		}
		mixed.Header[k] = v
	}
	if _, d, err := Unmarshal(mixed); err != nil || d.Type() != TypePrepare {
		t.Fatalf("mixed-case headers: %v", err)
	}
}

func TestNonASCIIAttributesSurvive(t *testing.T) {
	e, err := New(testBridge, Prepare{testPhase(1)})
	if err != nil {
		t.Fatal(err)
	}
	e.SetExtension("note", "résumé 100% \"done\"")
	m, err := Encode("sp.run1.phase.prepare", e)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Header.Get("ce-note"); got != "r%C3%A9sum%C3%A9%20100%25%20%22done%22" {
		t.Errorf("ce-note on the wire = %q", got)
	}
	back, err := Parse(m)
	if err != nil {
		t.Fatal(err)
	}
	if got := back.Extensions()["note"]; got != "résumé 100% \"done\"" {
		t.Errorf("ce-note read back = %q", got)
	}
}

func TestStructuredModeIsRead(t *testing.T) {
	m := nats.NewMsg("sp.run1.phase.prepare")
	m.Header.Set("Content-Type", "application/cloudevents+json; charset=utf-8")
	m.Data = []byte(`{"specversion":"1.0","id":"x1","source":"/run1/bridge.main","type":"dev.stillpoint.phase.prepare.v1",
		"subject":"ckpt-7","sprun":"run1","spseq":"1","spepoch":"2","datacontenttype":"application/json",
		"data":{"run":"run1","checkpoint_id":"ckpt-7","seq":1,"epoch":2,"deadline":"2026-11-29T08:00:30Z","members":["agent.a0"]}}`)
	_, d, err := Unmarshal(m)
	if err != nil {
		t.Fatalf("structured: %v", err)
	}
	if p := d.(Prepare); p.CheckpointID != "ckpt-7" || p.Members[0] != "agent.a0" {
		t.Errorf("decoded %+v", p)
	}
}

func TestEpisodes(t *testing.T) {
	good := map[string]Episode{
		"r1":           {"r1", 0},
		"r1-a1":        {"r1", 1},
		"task.7_x-a12": {"task.7_x", 12},
		"a-b":          {"a-b", 0},
	}
	for s, want := range good {
		got, err := ParseEpisode(s)
		if err != nil || got != want || got.String() != s {
			t.Errorf("ParseEpisode(%q) = %+v, %v", s, got, err)
		}
	}
	for _, s := range []string{"", "r1-a0", "r1-a01", "r1-a1-a2", "../x", "a/b", "-x", ".x", "a b", "a*", strings.Repeat("x", 129)} {
		if _, err := ParseEpisode(s); err == nil || !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseEpisode(%q) = %v, want ErrInvalid", s, err)
		}
	}
	if (Episode{"r", 2}).Next() != (Episode{"r", 3}) {
		t.Error("Next")
	}
}

func TestTokens(t *testing.T) {
	for _, s := range []string{"run1", "R_2-x", strings.Repeat("a", 64)} {
		if err := ValidateRun(s); err != nil {
			t.Errorf("ValidateRun(%q): %v", s, err)
		}
	}
	for _, s := range []string{"", "a.b", "a*", ">", "../etc", "a b", "_x", strings.Repeat("a", 65), "é"} {
		err := ValidateRun(s)
		if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "run") {
			t.Errorf("ValidateRun(%q) = %v, want ErrInvalid naming run", s, err)
		}
	}
	if _, err := NewMember(KindAgent, "a.b"); err == nil {
		t.Error("member name with a dot accepted")
	}
	if err := Member("robot.x").Validate(); err == nil || !strings.Contains(err.Error(), "kind") {
		t.Errorf("unknown kind: %v", err)
	}
}

// TestValidIDMatchesThePattern checks the byte-loop matcher against the
// PROTOCOL §2 patterns it replaces, over many generated strings.
func TestValidIDMatchesThePattern(t *testing.T) {
	token, rollout := regexp.MustCompile(tokenRE), regexp.MustCompile(rolloutRE)
	alphabet := "aZ09_-.*> /é"
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 20000; i++ {
		n := rng.IntN(70)
		if i%100 == 0 {
			n = 60 + rng.IntN(80)
		}
		var b strings.Builder
		for j := 0; j < n; j++ {
			b.WriteByte(alphabet[rng.IntN(len(alphabet))])
		}
		s := b.String()
		if got, want := validID(s, 64, false), token.MatchString(s); got != want {
			t.Fatalf("token %q: validID %v, pattern %v", s, got, want)
		}
		if got, want := validID(s, 128, true), rollout.MatchString(s); got != want {
			t.Fatalf("rollout %q: validID %v, pattern %v", s, got, want)
		}
		if got, want := attemptSuffix(s) >= 0, regexp.MustCompile(`-a[0-9]+$`).MatchString(s); got != want {
			t.Fatalf("attempt suffix %q: %v, pattern %v", s, got, want)
		}
	}
}

func TestEveryAckAndPhaseImplementsItsInterface(t *testing.T) {
	for typ, s := range samples() {
		switch {
		case strings.Contains(string(typ), ".ack."):
			a, ok := s.data.(Ack)
			if !ok || "dev.stillpoint.ack."+string(a.Answers())+".v1" != string(typ) || a.Header().Member != "agent.a0" {
				t.Errorf("%s: not an Ack of its phase", typ)
			}
		case strings.Contains(string(typ), ".phase."):
			p, ok := s.data.(PhaseEvent)
			if !ok || "dev.stillpoint.phase."+string(p.Phase())+".v1" != string(typ) || p.Header().Run != "run1" {
				t.Errorf("%s: not a PhaseEvent of its phase", typ)
			}
		}
	}
}

// TestMarshalIsEncodeOfNew: Marshal writes the message straight from the
// payload; it must be exactly what Encode makes of New's event, for every
// event type.
func TestMarshalIsEncodeOfNew(t *testing.T) {
	times := []time.Time{
		time.Date(2026, 11, 29, 8, 0, 0, 123456789, time.FixedZone("x", 3600)),
		time.Date(2026, 11, 29, 8, 0, 0, 0, time.UTC), // no fraction
		time.Date(1, 1, 1, 0, 0, 0, 1000, time.UTC),
		time.Now(), // with a monotonic reading
	}
	ids := []string{"", "id-%41", `q"uote`, "a.b_c-9"} // "": the default id
	for typ, s := range samples() {
		for i, at := range times {
			for _, id := range ids {
				opts := []Option{WithTime(at)}
				if id != "" {
					opts = append(opts, WithID(id+"-"+typ.Noun()))
				}
				got, err := Marshal(s.src, s.data, opts...)
				if err != nil {
					t.Fatalf("%s: Marshal: %v", typ, err)
				}
				if id == "" {
					// The default id is random: compare with an Encode of
					// the id Marshal chose.
					opts = append(opts, WithID(got.Header.Get("ce-id")))
				}
				e, err := New(s.src, s.data, opts...)
				if err != nil {
					t.Fatalf("%s: New: %v", typ, err)
				}
				want, err := Encode(Subject(s.data), e)
				if err != nil {
					t.Fatalf("%s: Encode: %v", typ, err)
				}
				if got.Subject != want.Subject || string(got.Data) != string(want.Data) || !reflect.DeepEqual(got.Header, want.Header) {
					t.Errorf("%s, time %d, id %q: Marshal gave\n%s %v %s\nEncode(New) gave\n%s %v %s", typ, i, id,
						got.Subject, got.Header, got.Data, want.Subject, want.Header, want.Data)
				}
			}
		}
	}
}

// TestMarshalRefusesUnsafeIDs: the id also travels unencoded as
// Nats-Msg-Id, so a space, a control character or a non-ASCII byte in it
// is refused and named.
func TestMarshalRefusesUnsafeIDs(t *testing.T) {
	s := samples()[TypePrepare]
	for _, id := range []string{"a b", "a\r\nNats-Expected-Stream: x", "é", strings.Repeat("a", MaxHeaderValue+1)} {
		_, err := Marshal(s.src, s.data, WithID(id))
		if err == nil || !strings.Contains(err.Error(), "ce-id") {
			t.Errorf("Marshal with id %q: %v, want an error naming ce-id", id, err)
		}
	}
}

// TestIncludes: exact whether or not the list is sorted.
func TestIncludes(t *testing.T) {
	sorted := []Member{"agent.a0", "agent.a1", "owner.o0", "sandbox.s1"}
	unsorted := []Member{"sandbox.s1", "agent.a1", "owner.o0", "agent.a0"}
	for _, c := range []struct {
		list []Member
		m    Member
		want bool
	}{
		{sorted, "agent.a0", true}, {sorted, "sandbox.s1", true}, {sorted, "agent.a2", false}, {sorted, "bridge.main", false},
		{unsorted, "agent.a0", true}, {unsorted, "sandbox.s1", true}, {unsorted, "owner.o0", true}, {unsorted, "agent.a2", false},
		{nil, "agent.a0", false},
	} {
		if got := Includes(c.list, c.m); got != c.want {
			t.Errorf("Includes(%v, %s) = %v, want %v", c.list, c.m, got, c.want)
		}
		if got := (PhaseHeader{Members: c.list}).Names(c.m); got != c.want {
			t.Errorf("PhaseHeader{%v}.Names(%s) = %v, want %v", c.list, c.m, got, c.want)
		}
	}
}

func TestServiceSubject(t *testing.T) {
	a, _ := NewMember(KindAgent, "a1")
	s, _ := NewMember(KindSandbox, "sb-7")
	for _, c := range []struct{ got, want string }{
		{ServiceSubject("r1", a), "spsvc.r1.agent.a1"},
		{ServiceSubject("r1", s), "spsvc.r1.sandbox.sb-7"},
		{ServiceFilter("r1", KindOwner), "spsvc.r1.owner.*.>"},
	} {
		if c.got != c.want {
			t.Errorf("got %s, want %s", c.got, c.want)
		}
	}
}

// Sentinels name their package; a FieldError names it once, then the field
// and the class.
func TestSentinelsNameThePackage(t *testing.T) {
	for _, err := range []error{ErrInvalid, ErrUnknownType, ErrUnknownVersion, ErrTooLarge, ErrMalformed, ErrMismatch} {
		if !strings.HasPrefix(err.Error(), "events: ") {
			t.Errorf("%q does not name the package", err)
		}
	}
	err := ValidateRun("a b")
	if !errors.Is(err, ErrInvalid) || strings.Count(err.Error(), "events: ") != 1 || !strings.HasPrefix(err.Error(), "events: run: invalid: ") {
		t.Errorf("ValidateRun: %q, want events: run: invalid: ...", err)
	}
}

// TestNewID: ids are IDLength base-62 characters, valid ce-ids, and do not
// repeat.
func TestNewID(t *testing.T) {
	seen := map[string]bool{}
	for range 10000 {
		id := NewID()
		if len(id) != IDLength || checkID(id) != nil || strings.Trim(id, idDigits) != "" {
			t.Fatalf("id %q", id)
		}
		if seen[id] {
			t.Fatalf("id %q repeated", id)
		}
		seen[id] = true
	}
}

// TestURIAttributesAsWritten: a ce-source is read whether its writer
// percent-encoded it as the binding says or wrote the URI raw, with the
// URI's own escapes, as sdk-go does.
func TestURIAttributesAsWritten(t *testing.T) {
	for _, c := range []struct{ wire, source string }{
		{"/fleet/50%2525off", "/fleet/50%25off"},             // conformant: the URI's % encoded
		{"/fleet/50%25off", "/fleet/50%25off"},               // raw: decoding would leave a bare %
		{"/fleet/%C3%A4", "/fleet/%C3%A4"},                   // raw or not, the same URI
		{"/fleet/%25C3%25A4", "/fleet/%C3%A4"},               // conformant
		{`"/fleet/\"q\"%2525"`, "/fleet/%22q%22%25"},         // quoted, with backslash escapes
		{"https://x.example/a%2Fb", "https://x.example/a/b"}, // ambiguous: one decoding wins
	} {
		m := nats.NewMsg("x")
		m.Header.Set("ce-specversion", "1.0")
		m.Header.Set("ce-id", "1")
		m.Header.Set("ce-type", "t")
		m.Header.Set("ce-source", c.wire)
		e, err := Parse(m)
		if err != nil || e.Source() != c.source {
			t.Errorf("ce-source %q read as %q, %v, want %q", c.wire, e.Source(), err, c.source)
		}
	}
	m := nats.NewMsg("x")
	for k, v := range map[string]string{"ce-specversion": "1.0", "ce-id": "1", "ce-type": "t", "ce-source": "/x",
		"ce-dataschema": "https://x.example/s/50%25off"} {
		m.Header.Set(k, v)
	}
	if e, err := Parse(m); err != nil || e.DataSchema() != "https://x.example/s/50%25off" {
		t.Errorf("raw ce-dataschema read as %q, %v", e.DataSchema(), err)
	}
	m = nats.NewMsg("x")
	m.Header.Set("ce-specversion", "1.0")
	m.Header.Set("ce-id", "1")
	m.Header.Set("ce-type", "t")
	m.Header.Set("ce-source", "/fleet/50%off")
	if _, err := Parse(m); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "ce-source") {
		t.Errorf("a source that is no URI either way: %v, want ErrInvalid naming ce-source", err)
	}
}
