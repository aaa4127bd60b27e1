package events

import (
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
)

// Data is the payload of one event type: one Go type per CloudEvent type.
// The interface is sealed; only this package's types implement it.
type Data interface {
	// Type returns the CloudEvents type the payload travels as.
	Type() Type
	// Validate checks every field against the protocol and returns an
	// error naming the first field that breaks it (errors.Join of several).
	Validate() error

	route() route
}

// route is what the envelope derives from a payload.
type route struct {
	run     string
	subject string // ce-subject
	nats    string // NATS subject
	alt     string // another NATS subject the event is read on (an older build's), or ""
	source  Member // the member that must send it; "" means any bridge
	seq     uint64
	epoch   uint64
	hasSeq  bool
}

// Extension attribute names (PROTOCOL §4).
const (
	ExtRun   = "sprun"
	ExtSeq   = "spseq"
	ExtEpoch = "spepoch"
)

// ContentTypeJSON is the data content type of every Stillpoint event.
const ContentTypeJSON = "application/json"

// MaxDataSize bounds the JSON data of one event. It stays below NATS's
// default 1 MiB max_payload with room for the headers; larger exports go to
// the sp_records object store and the event carries their manifest.
const MaxDataSize = 960 << 10

// Option changes how New builds an event.
type Option func(*options)

type options struct {
	id string
	at time.Time
}

// WithID sets ce-id (and so Nats-Msg-Id). A publisher that may make a
// publish again gives it an id from MsgIDs, the same for each attempt, so
// that the server drops the repeat; never one another client could tell
// beforehand (PROTOCOL §4). The default is a fresh unique id.
func WithID(id string) Option { return func(o *options) { o.id = id } }

// WithTime sets ce-time. The default is the current time.
func WithTime(t time.Time) Option { return func(o *options) { o.at = t } }

// New builds a CloudEvent from a payload sent by source. It validates the
// payload and checks that source may send it: phases and outcomes come from
// a bridge, acks and membership events from the member they name.
func New(source Member, d Data, opts ...Option) (event.Event, error) {
	env, err := build(source, d, opts)
	if err != nil {
		return event.Event{}, err
	}
	e := event.New(event.CloudEventsVersionV1)
	e.SetID(env.id)
	e.SetSource(env.source)
	e.SetType(string(env.typ))
	e.SetSubject(env.r.subject)
	e.SetTime(env.at)
	e.SetDataContentType(ContentTypeJSON)
	e.SetExtension(ExtRun, env.r.run)
	if env.r.hasSeq {
		e.SetExtension(ExtSeq, strconv.FormatUint(env.r.seq, 10))
	}
	e.SetExtension(ExtEpoch, strconv.FormatUint(env.r.epoch, 10))
	e.DataEncoded = env.body
	if err := e.Validate(); err != nil {
		return event.Event{}, fieldErr("event", ErrInvalid, "%v", err)
	}
	return e, nil
}

// Marshal builds the event for d and encodes it as a NATS message on the
// subject the protocol gives it (PROTOCOL §3). The message is what Encode
// makes of New's event, written straight from the payload: members send one
// per phase, so it skips the intermediate event.
func Marshal(source Member, d Data, opts ...Option) (*nats.Msg, error) {
	env, err := build(source, d, opts)
	if err != nil {
		return nil, err
	}
	m := &nats.Msg{Subject: env.r.nats, Header: make(nats.Header, 11), Data: env.body}
	// One backing array for the values and constant names: every member
	// sends one of these per phase.
	vals := make([]string, 0, 11)
	set := func(key, v string) {
		vals = append(vals, v)
		m.Header[key] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	set(hdrSpecVersion, event.CloudEventsVersionV1)
	set(hdrID, percentEncode(env.id))
	set(hdrSource, percentEncode(env.source))
	set(hdrType, percentEncode(string(env.typ)))
	if env.r.subject != "" {
		set(hdrSubject, percentEncode(env.r.subject))
	}
	set(hdrTime, env.at.Format(time.RFC3339Nano))
	set(hdrDataContentType, percentEncode(ContentTypeJSON))
	set(hdrRun, percentEncode(env.r.run))
	if env.r.hasSeq {
		set(hdrSeq, strconv.FormatUint(env.r.seq, 10))
	}
	set(hdrEpoch, strconv.FormatUint(env.r.epoch, 10))
	set(HeaderMsgID, env.id)
	return m, nil
}

// The ce-* header names Marshal writes.
const (
	hdrSpecVersion     = HeaderPrefix + "specversion"
	hdrID              = HeaderPrefix + "id"
	hdrSource          = HeaderPrefix + "source"
	hdrType            = HeaderPrefix + "type"
	hdrSubject         = HeaderPrefix + "subject"
	hdrTime            = HeaderPrefix + "time"
	hdrDataContentType = HeaderPrefix + "datacontenttype"
	hdrRun             = HeaderPrefix + ExtRun
	hdrSeq             = HeaderPrefix + ExtSeq
	hdrEpoch           = HeaderPrefix + ExtEpoch
)

// envelope is what New and Marshal derive from a payload.
type envelope struct {
	id, source string
	typ        Type
	at         time.Time
	r          route
	body       []byte
}

// build validates a payload and its sender and derives its envelope.
func build(source Member, d Data, opts []Option) (envelope, error) {
	o := options{}
	for _, opt := range opts {
		opt(&o)
	}
	if o.id == "" {
		o.id = NewID()
	}
	if err := checkID(o.id); err != nil {
		return envelope{}, err
	}
	if o.at.IsZero() {
		o.at = time.Now()
	}
	if err := source.Validate(); err != nil {
		return envelope{}, err
	}
	if err := d.Validate(); err != nil {
		return envelope{}, err
	}
	r := d.route()
	if err := checkSource("source", source, r); err != nil {
		return envelope{}, err
	}
	body, err := json.Marshal(d)
	if err != nil {
		return envelope{}, fieldErr("data", ErrMalformed, "%v", err)
	}
	if len(body) > MaxDataSize {
		return envelope{}, fieldErr("data", ErrTooLarge, "%d bytes, limit %d", len(body), MaxDataSize)
	}
	return envelope{id: o.id, source: "/" + r.run + "/" + string(source), typ: d.Type(), at: o.at.UTC(), r: r, body: body}, nil
}

// checkID checks an event id given with WithID: it also travels unencoded
// as Nats-Msg-Id, so it must be printable ASCII without spaces.
func checkID(id string) error {
	if len(id) > MaxHeaderValue {
		return fieldErr("ce-id", ErrTooLarge, "%d bytes, limit %d", len(id), MaxHeaderValue)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= 0x20 || c >= 0x7f {
			return fieldErr("ce-id", ErrInvalid, "%q: only printable ASCII without spaces", clip(id))
		}
	}
	return nil
}

// Subject returns the NATS subject d is published on.
func Subject(d Data) string { return d.route().nats }

// Decode reads the payload of e as T, checking the type (and its version),
// the data, and that the envelope agrees with the data: run, checkpoint,
// sequence, epoch and sender.
func Decode[T Data](e event.Event) (T, error) {
	var zero T
	if err := checkType(e.Type()); err != nil {
		return zero, err
	}
	if Type(e.Type()) != zero.Type() {
		return zero, fieldErr("ce-type", ErrMismatch, "%q, want %q", e.Type(), zero.Type())
	}
	if err := checkData(e); err != nil {
		return zero, err
	}
	d, err := decodeData[T](e.Data())
	if err != nil {
		return zero, err
	}
	if err := checkEnvelope(e, d.route()); err != nil {
		return zero, err
	}
	return d, nil
}

// DecodeAny reads the payload of e as whichever type ce-type names; the
// result is one of this package's payload types (a value, not a pointer).
func DecodeAny(e event.Event) (Data, error) {
	d, _, err := decodeAny(e)
	return d, err
}

// decodeAny is DecodeAny, with the route of the payload it checked the
// envelope against.
func decodeAny(e event.Event) (Data, route, error) {
	if err := checkType(e.Type()); err != nil {
		return nil, route{}, err
	}
	if err := checkData(e); err != nil {
		return nil, route{}, err
	}
	d, err := registry[Type(e.Type())](e.Data())
	if err != nil {
		return nil, route{}, err
	}
	r := d.route()
	if err := checkEnvelope(e, r); err != nil {
		return nil, route{}, err
	}
	return d, r, nil
}

// Unmarshal parses a NATS message and decodes its payload. When the message
// carries a subject (it does when it came from the server), the subject must
// be the one the payload belongs on, so an ack published on one member's
// subject cannot claim to come from another.
func Unmarshal(m *nats.Msg) (event.Event, Data, error) {
	e, err := Parse(m)
	if err != nil {
		return event.Event{}, nil, err
	}
	d, r, err := decodeAny(e)
	if err != nil {
		return event.Event{}, nil, err
	}
	if m.Subject != "" && m.Subject != r.nats && (r.alt == "" || m.Subject != r.alt) {
		return event.Event{}, nil, fieldErr("subject", ErrMismatch, "%q, the event belongs on %q", clip(m.Subject), r.nats)
	}
	return e, d, nil
}

func checkData(e event.Event) error {
	if ct := e.DataContentType(); ct != "" && !strings.HasPrefix(ct, ContentTypeJSON) {
		return fieldErr("ce-datacontenttype", ErrInvalid, "%q, want %s", clip(ct), ContentTypeJSON)
	}
	b := e.Data()
	if len(b) == 0 {
		return fieldErr("data", ErrInvalid, "missing")
	}
	if len(b) > MaxDataSize {
		return fieldErr("data", ErrTooLarge, "%d bytes, limit %d", len(b), MaxDataSize)
	}
	if !utf8.Valid(b) {
		return fieldErr("data", ErrMalformed, "invalid UTF-8")
	}
	return nil
}

func decodeData[T Data](b []byte) (T, error) {
	var v T
	if fd, ok := any(&v).(fastDecoder); ok && fd.decodeFast(b) {
		if err := v.Validate(); err != nil {
			var zero T
			return zero, err
		}
		return v, nil
	}
	v = *new(T) // what a fast decode that gave up left
	if err := json.Unmarshal(b, &v); err != nil {
		var zero T
		return zero, fieldErr("data", ErrMalformed, "%v", err)
	}
	if err := v.Validate(); err != nil {
		var zero T
		return zero, err
	}
	return v, nil
}

// checkEnvelope checks that the CloudEvents attributes agree with the data.
func checkEnvelope(e event.Event, r route) error {
	src := e.Source()
	run, member, ok := strings.Cut(strings.TrimPrefix(src, "/"), "/")
	if !strings.HasPrefix(src, "/") || !ok {
		return fieldErr("ce-source", ErrInvalid, "%q must be /<run>/<member>", clip(src))
	}
	if run != r.run {
		return fieldErr("ce-source", ErrMismatch, "run %q, data says %q", clip(run), r.run)
	}
	if err := validateMember("ce-source", member); err != nil {
		return err
	}
	if err := checkSource("ce-source", Member(member), r); err != nil {
		return err
	}
	if e.Subject() != r.subject {
		return fieldErr("ce-subject", ErrMismatch, "%q, data says %q", clip(e.Subject()), r.subject)
	}
	ext := extensions(e)
	if v, _ := ext[ExtRun].(string); v != r.run {
		return fieldErr("ce-"+ExtRun, ErrMismatch, "%q, data says %q", clip(v), r.run)
	}
	if r.hasSeq {
		if err := checkUint(ext, ExtSeq, r.seq, true); err != nil {
			return err
		}
	}
	return checkUint(ext, ExtEpoch, r.epoch, false)
}

// extensions returns e's extension attributes to read, without the copy
// Event.Extensions makes when the context is the CloudEvents 1.0 one that
// Parse builds.
func extensions(e event.Event) map[string]any {
	if ec, ok := e.Context.(*event.EventContextV1); ok {
		return ec.Extensions
	}
	return e.Extensions()
}

func checkUint(ext map[string]any, name string, want uint64, required bool) error {
	raw, ok := ext[name]
	if !ok {
		if required {
			return fieldErr("ce-"+name, ErrInvalid, "missing")
		}
		return nil
	}
	var got uint64
	switch v := raw.(type) {
	case string:
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return fieldErr("ce-"+name, ErrInvalid, "%q is not a number", clip(v))
		}
		got = n
	case int32:
		if v < 0 {
			return fieldErr("ce-"+name, ErrInvalid, "%d is negative", v)
		}
		got = uint64(v)
	default:
		return fieldErr("ce-"+name, ErrInvalid, "unexpected %T", raw)
	}
	if got != want {
		return fieldErr("ce-"+name, ErrMismatch, "%d, data says %d", got, want)
	}
	return nil
}

func checkSource(field string, source Member, r route) error {
	if r.source == "" {
		if source.Kind() != KindBridge {
			return fieldErr(field, ErrMismatch, "%q: only a bridge sends this event", source)
		}
		return nil
	}
	if source != r.source {
		return fieldErr(field, ErrMismatch, "%q, data says member %q", source, r.source)
	}
	return nil
}
