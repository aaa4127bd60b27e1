// Package events is Stillpoint's wire contract: one Go type per CloudEvent
// type of protocol v1, the subjects they travel on, and a binary-mode
// CloudEvents codec over nats.go messages.
//
// # The contract
//
//  1. Every message is a CloudEvent 1.0 in binary content mode (CloudEvents
//     NATS protocol binding 1.0.3): one lower-case ce-<attribute> header per
//     attribute, the JSON data as the body. Header values are percent-encoded
//     (space, double quote, percent and anything outside U+0021..U+007E, as
//     upper-case %XY over UTF-8 bytes); readers match header names without
//     regard to case, unquote a quoted-string (its backslash escapes
//     included), percent-decode once, reading a % that starts no escape as
//     itself (raw writers such as sdk-go's JetStream binding), keep a
//     ce-source or ce-dataschema that decoding would make no URI as
//     received, and refuse invalid UTF-8.
//     A message whose Content-Type starts with application/cloudevents is
//     read in structured mode instead.
//  2. ce-id is repeated in Nats-Msg-Id, so the server drops a repeated
//     publish inside the stream's duplicate window. Deduplication spans
//     the whole stream, so no id can be told before it is published: a
//     publish that may be made again takes its id from MsgIDs (its key
//     and a random part drawn once), any other a NewID.
//  3. ce-type is dev.stillpoint.<noun>.<verb>.v1. A reader ignores data
//     fields it does not know and refuses versions it does not know
//     (ErrUnknownVersion, naming the type).
//  4. ce-source is /<run>/<member>. Phases and outcomes come from a bridge;
//     an ack or a membership event comes from the member it names. ce-subject
//     is the checkpoint id (the member name for membership events).
//     Extensions: sprun (run), spseq (the phase sequence an ack answers),
//     spepoch (the run's epoch).
//  5. Subjects (PROTOCOL §3): phases on sp.<run>.phase.<phase>; acks on
//     sp.<run>.ack.<seq>.<phase>.<member>, one subject per phase event and
//     member, written once; outcomes on sp.<run>.outcome.<noun>.<verb>;
//     membership on sp.<run>.member.<member>. Every resume ack, and every
//     ack of a sandbox daemon, travels on core NATS instead, on
//     spl.<run>.ack.<seq>.<phase>.<member> (LiveAck); the bridge stores a
//     daemon's on its ack subject where the phase keeps acks (AckRecorded).
//  6. Ids (PROTOCOL §2): run, checkpoint and member names are single subject
//     tokens, ^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$; rollout ids allow dots, up to
//     128 bytes, and never end in -a<digits>; an episode's capture key is
//     <rollout> for attempt 0 and <rollout>-a<attempt> after.
//  7. Everything read is checked: attributes, data, ids, list and size
//     limits (MaxDataSize, MaxListLen, MaxBlockers), and agreement between
//     envelope and data (run, checkpoint, seq, epoch, sender, NATS subject).
//     A refusal is a *FieldError naming the field, wrapping ErrInvalid,
//     ErrUnknownType, ErrUnknownVersion, ErrTooLarge, ErrMalformed or
//     ErrMismatch. An ack published on one member's subject cannot claim to
//     come from another.
//
// # Use
//
// A sender builds a payload and calls Marshal, which validates it and
// returns a *nats.Msg on the right subject. A receiver calls Unmarshal on
// what it consumed and switches on the returned payload's type, or calls
// Parse and then Decode[T] when it expects one type.
//
// This package imports nats.go and sdk-go's event model only; the in-sandbox
// daemon builds on it and must stay small.
package events
