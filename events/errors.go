package events

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Every error this package returns for bad input wraps one
// of them inside a *FieldError that names the offending field, so callers can
// both test the class with errors.Is and show the field to a person. Other
// packages wrap ErrInvalid for ids and values they check with this package's
// validators.
var (
	// ErrInvalid is returned when a field is missing or has a value that the
	// protocol does not allow (an id that breaks PROTOCOL §2, a zero
	// deadline, a blocker list over its cap, ...).
	ErrInvalid = errors.New("events: invalid")

	// ErrUnknownType is returned when ce-type is not a Stillpoint event type.
	ErrUnknownType = errors.New("events: unknown event type")

	// ErrUnknownVersion is returned when ce-type names a known event with a
	// version suffix this build does not understand (PROTOCOL §4: readers
	// refuse versions they do not know).
	ErrUnknownVersion = errors.New("events: unknown event version")

	// ErrTooLarge is returned when the data or a header is over its limit.
	ErrTooLarge = errors.New("events: too large")

	// ErrMalformed is returned when a message cannot be read as a CloudEvent
	// at all: bad percent-encoding, invalid UTF-8, data that is not JSON.
	ErrMalformed = errors.New("events: malformed")

	// ErrMismatch is returned when two places that must agree do not: the
	// NATS subject against the event, ce-source against the member in the
	// data, an extension against the data. Forged or misrouted events fail
	// with it.
	ErrMismatch = errors.New("events: mismatch")
)

// FieldError names the field that made an event unacceptable. Its message
// is "events: <field>: <class>: <detail>", the class being the sentinel's
// text without the package prefix the FieldError already gives.
type FieldError struct {
	// Field is the attribute, header or JSON field, e.g. "ce-source",
	// "data.checkpoint_id" or "data.blockers[3]".
	Field string
	// Err says what is wrong; it wraps one of the package's sentinels.
	Err error
}

// Error implements error.
func (e *FieldError) Error() string { return "events: " + e.Field + ": " + e.Err.Error() }

// Unwrap returns the cause.
func (e *FieldError) Unwrap() error { return e.Err }

func fieldErr(field string, sentinel error, format string, args ...any) error {
	class := strings.TrimPrefix(sentinel.Error(), "events: ")
	return &FieldError{Field: field, Err: &classError{class: sentinel, msg: class + ": " + fmt.Sprintf(format, args...)}}
}

// classError is a FieldError's cause: it wraps one sentinel and reads as
// "<class>: <detail>".
type classError struct {
	class error
	msg   string
}

func (e *classError) Error() string { return e.msg }

func (e *classError) Unwrap() error { return e.class }
