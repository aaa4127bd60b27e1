package events

import (
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/nats-io/nats.go"
)

// Header names used on the wire.
const (
	// HeaderPrefix starts every CloudEvents attribute header in binary mode.
	HeaderPrefix = "ce-"
	// HeaderMsgID is NATS's deduplication header; it carries ce-id.
	HeaderMsgID = nats.MsgIdHdr
	// HeaderContentType marks a structured-mode message when its value
	// starts with application/cloudevents.
	HeaderContentType = "content-type"
)

// Limits on what Parse reads from headers.
const (
	// MaxHeaderValue bounds one decoded ce-* header value.
	MaxHeaderValue = 4096
	// MaxAttributes bounds the number of ce-* headers.
	MaxAttributes = 32
)

// Encode writes e as a binary-mode CloudEvents NATS message (CloudEvents
// NATS protocol binding 1.0.3, section 3.1): one lower-case ce-<attribute> header
// per attribute, values percent-encoded, the data as the body, and ce-id
// repeated in Nats-Msg-Id so that the server drops a repeated publish.
func Encode(subject string, e event.Event) (*nats.Msg, error) {
	if err := e.Validate(); err != nil {
		return nil, fieldErr("event", ErrInvalid, "%v", err)
	}
	if len(e.Data()) > MaxDataSize {
		return nil, fieldErr("data", ErrTooLarge, "%d bytes, limit %d", len(e.Data()), MaxDataSize)
	}
	m := nats.NewMsg(subject)
	set := func(name, v string) { m.Header[HeaderPrefix+name] = []string{percentEncode(v)} }
	set("specversion", e.SpecVersion())
	set("id", e.ID())
	set("source", e.Source())
	set("type", e.Type())
	if v := e.Subject(); v != "" {
		set("subject", v)
	}
	if t := e.Time(); !t.IsZero() {
		set("time", t.UTC().Format(time.RFC3339Nano))
	}
	if v := e.DataContentType(); v != "" {
		set("datacontenttype", v)
	}
	if v := e.DataSchema(); v != "" {
		set("dataschema", v)
	}
	for name, v := range e.Extensions() {
		s, err := types.Format(v)
		if err != nil {
			return nil, fieldErr("ce-"+name, ErrInvalid, "%v", err)
		}
		set(strings.ToLower(name), s)
	}
	m.Header[HeaderMsgID] = []string{e.ID()}
	m.Data = e.Data()
	return m, nil
}

// Parse reads a CloudEvent from a NATS message. Binary mode is the norm;
// a message whose Content-Type starts with application/cloudevents is read
// in structured mode, as the binding requires. Header names match
// case-insensitively; values are read as percentDecode says (a quoted
// value unquoted, one round of percent-decoding in which a % that starts
// no escape is itself, valid UTF-8 required).
func Parse(m *nats.Msg) (event.Event, error) {
	if len(m.Data) > MaxDataSize {
		return event.Event{}, fieldErr("data", ErrTooLarge, "%d bytes, limit %d", len(m.Data), MaxDataSize)
	}
	// The attributes go to a list on the stack, not a map: an event has a
	// handful, and this runs for every event every member hears.
	var buf [12]attr
	attrs := attrList(buf[:0])
	var contentType string
	for k, vs := range m.Header {
		if strings.EqualFold(k, HeaderContentType) && len(vs) > 0 {
			contentType = vs[0]
			continue
		}
		// Lower-cased only when it is an attribute's: the stream's and the
		// live copy's own headers (Nats-Sequence, ...) are not read.
		if len(k) < len(HeaderPrefix) || !strings.EqualFold(k[:len(HeaderPrefix)], HeaderPrefix) || len(vs) == 0 {
			continue
		}
		lk := strings.ToLower(k) // no copy when k is lower-case already
		name := lk[len(HeaderPrefix):]
		if _, dup := attrs.get(name); dup || len(vs) > 1 {
			return event.Event{}, fieldErr(lk, ErrMalformed, "repeated header")
		}
		if len(attrs) == MaxAttributes {
			return event.Event{}, fieldErr("headers", ErrTooLarge, "more than %d ce-* headers", MaxAttributes)
		}
		v, err := percentDecode(lk, vs[0])
		if err != nil {
			return event.Event{}, err
		}
		attrs = append(attrs, attr{name: name, value: v, raw: vs[0]})
	}
	if strings.HasPrefix(strings.ToLower(strings.TrimSpace(contentType)), "application/cloudevents") {
		return parseStructured(m)
	}
	return parseBinary(attrs, contentType, m.Data)
}

// attr is one ce-* attribute of a binary-mode message: its name without
// the prefix, its decoded value, and the value as received.
type attr struct{ name, value, raw string }

// attrList is the attributes of one message, in the order read.
type attrList []attr

// get returns the decoded value of attribute name.
func (l attrList) get(name string) (string, bool) {
	for _, a := range l {
		if a.name == name {
			return a.value, true
		}
	}
	return "", false
}

func parseStructured(m *nats.Msg) (event.Event, error) {
	if !utf8.Valid(m.Data) {
		return event.Event{}, fieldErr("data", ErrMalformed, "invalid UTF-8")
	}
	e := event.New()
	if err := format.JSON.Unmarshal(m.Data, &e); err != nil {
		return event.Event{}, fieldErr("data", ErrMalformed, "structured event: %v", err)
	}
	if e.SpecVersion() != event.CloudEventsVersionV1 {
		return event.Event{}, fieldErr("specversion", ErrUnknownVersion, "%q, want %s", clip(e.SpecVersion()), event.CloudEventsVersionV1)
	}
	if err := e.Validate(); err != nil {
		return event.Event{}, fieldErr("event", ErrInvalid, "%v", err)
	}
	return e, nil
}

// parseBinary builds the event of a binary-mode message from its decoded
// attributes. A URI-typed attribute (source, dataschema) whose decoded
// value is no URI-reference is read as received instead (attr.raw): a
// writer that writes values raw (sdk-go's JetStream binding) writes a
// URI's own escapes, such as the %25 of a percent sign, which a decode
// would break.
func parseBinary(attrs attrList, contentType string, data []byte) (event.Event, error) {
	sv, ok := attrs.get("specversion")
	if !ok {
		return event.Event{}, fieldErr("ce-specversion", ErrInvalid, "missing")
	}
	if sv != event.CloudEventsVersionV1 {
		return event.Event{}, fieldErr("ce-specversion", ErrUnknownVersion, "%q, want %s", clip(sv), event.CloudEventsVersionV1)
	}
	e := event.New(event.CloudEventsVersionV1)
	ec := e.Context.(*event.EventContextV1)
	for _, req := range []string{"id", "source", "type"} {
		if v, _ := attrs.get(req); strings.TrimSpace(v) == "" {
			return event.Event{}, fieldErr("ce-"+req, ErrInvalid, "missing")
		}
	}
	for _, a := range attrs {
		name, v := a.name, a.value
		var err error
		switch name {
		case "specversion":
		case "id":
			e.SetID(v)
		case "source":
			if err = e.Context.SetSource(v); err != nil && a.raw != v {
				err = firstErr(e.Context.SetSource(a.raw), err)
			}
		case "type":
			e.SetType(v)
		case "subject":
			e.SetSubject(v)
		case "time":
			var t time.Time
			t, err = time.Parse(time.RFC3339Nano, v)
			if err == nil {
				e.SetTime(t)
			}
		case "datacontenttype":
			e.SetDataContentType(v)
		case "dataschema":
			if err = e.Context.SetDataSchema(v); err != nil && a.raw != v {
				err = firstErr(e.Context.SetDataSchema(a.raw), err)
			}
		default:
			if !event.IsExtensionNameValid(name) || len(name) > 20 {
				return event.Event{}, fieldErr("ce-"+name, ErrInvalid, "not a valid extension name")
			}
			// What SetExtension does for a valid, lower-case name that is
			// no spec attribute's (those are the cases above) and a string
			// value, without its checks again: three per event.
			if ec.Extensions == nil {
				ec.Extensions = make(map[string]any, 4)
			}
			ec.Extensions[name] = v
		}
		if err != nil {
			return event.Event{}, fieldErr("ce-"+name, ErrInvalid, "%q: %v", clip(v), err)
		}
	}
	if e.DataContentType() == "" && contentType != "" {
		e.SetDataContentType(contentType)
	}
	// Validate finds nothing more in what every member sends: id and type
	// are non-empty (checked above), a source whose path starts with / is
	// a non-empty URI-reference, the subject is trimmed or unset, and no
	// setter failed. Anything else it checks: a content type other than
	// JSON's, any dataschema (one such as "#" reads back as ""), another
	// source ("#" parses to an empty one).
	if dct := e.DataContentType(); len(e.FieldErrors) > 0 || (dct != "" && dct != ContentTypeJSON) ||
		ec.DataSchema != nil || !strings.HasPrefix(ec.Source.Path, "/") {
		if err := e.Validate(); err != nil {
			return event.Event{}, fieldErr("event", ErrInvalid, "%v", err)
		}
	}
	if len(data) > 0 {
		e.DataEncoded = data
	}
	return e, nil
}

// percentEncode encodes space, double quote, percent and every byte
// outside U+0021..U+007E as %XY with upper-case hex over the UTF-8 bytes
// (the binding's section 3.1.3.2).
func percentEncode(s string) string {
	needs := false
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= 0x20 || c >= 0x7f || c == '"' || c == '%' {
			needs = true
			break
		}
	}
	if !needs {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= 0x20 || c >= 0x7f || c == '"' || c == '%' {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// percentDecode reads a header value as the binding says a reader must
// (CloudEvents NATS binding 1.0.3, section 3.1.3.2, by way of the HTTP
// binding's header values), and as other writers write it:
//
//  1. A quoted-string (RFC 9110, 5.6.4: a double quote, text, a double
//     quote, nothing after it) is unquoted: the quotes go, and a backslash
//     takes the character after it as itself (a quoted-pair). A value that
//     is not one, such as a lone or an inner unescaped double quote, is
//     read as it is.
//  2. It is percent-decoded once: %XY with two hex digits is the byte XY.
//     A % that does not start such an escape is itself: sdk-go's JetStream
//     binding writes values raw, so "100%" or "50%off" arrive as they are.
//     (A raw "%41" reads as "A": an escape is an escape.)
//  3. The result must be valid UTF-8 (a valid escape of a broken sequence,
//     such as %FF, is refused) and at most MaxHeaderValue bytes.
func percentDecode(field, s string) (string, error) {
	if len(s) > 3*MaxHeaderValue {
		return "", fieldErr(field, ErrTooLarge, "%d bytes, limit %d", len(s), MaxHeaderValue)
	}
	if u, ok := unquote(s); ok {
		s = u
	}
	if strings.IndexByte(s, '%') >= 0 {
		b := make([]byte, 0, len(s))
		for i := 0; i < len(s); i++ {
			if s[i] == '%' && i+2 < len(s) {
				hi, ok1 := unhex(s[i+1])
				lo, ok2 := unhex(s[i+2])
				if ok1 && ok2 {
					b = append(b, hi<<4|lo)
					i += 2
					continue
				}
			}
			b = append(b, s[i])
		}
		s = string(b)
	}
	if !utf8.ValidString(s) {
		return "", fieldErr(field, ErrMalformed, "invalid UTF-8")
	}
	if len(s) > MaxHeaderValue {
		return "", fieldErr(field, ErrTooLarge, "%d bytes, limit %d", len(s), MaxHeaderValue)
	}
	return s, nil
}

// unquote returns the text of a quoted-string (RFC 9110, 5.6.4) with its
// quoted-pairs taken as the characters they quote, and whether s is one:
// it starts and ends with a double quote, holds no unescaped one in
// between, and its last backslash quotes a character.
func unquote(s string) (string, bool) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return "", false
	}
	inner := s[1 : len(s)-1]
	if strings.IndexByte(inner, '\\') < 0 {
		if strings.IndexByte(inner, '"') >= 0 {
			return "", false
		}
		return inner, true
	}
	b := make([]byte, 0, len(inner))
	for i := 0; i < len(inner); i++ {
		switch c := inner[i]; c {
		case '"':
			return "", false
		case '\\':
			if i+1 == len(inner) {
				return "", false // it quotes the closing quote: no end
			}
			i++
			b = append(b, inner[i])
		default:
			b = append(b, c)
		}
	}
	return string(b), true
}

// firstErr returns nil when the retry worked, else the first error.
func firstErr(retry, first error) error {
	if retry == nil {
		return nil
	}
	return first
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}
