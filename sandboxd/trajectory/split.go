package trajectory

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"unicode/utf8"
)

// This file splits a captured request for its record: its model, its
// other members and its messages, in one pass of the decoder (decode.go).

// splitRequest splits a request body into its model, its other members
// (params) and its messages, each compact, as splitRequestStd does with
// encoding/json (json.Unmarshal into a map[string]json.RawMessage, then
// marshalPlain of the map less messages) but in one pass and without
// reflection, since every captured call is split. It gives the same bytes,
// and an error where that does: a member given twice counts as the last
// (names compared unquoted); params holds the members but messages, sorted
// by name (one form for equal fields), each name quoted as encoding/json
// quotes a map's key, or is null for a null body; the model is "" unless
// a string. What it returns is its own, not slices of
// body. FuzzSplitRequest holds it to splitRequestStd.
func splitRequest(body []byte) (model string, params json.RawMessage, msgs []json.RawMessage, err error) {
	d := decoder{data: body}
	d.ws()
	switch d.peek() {
	case '{':
	case 'n':
		if err := d.null(); err != nil {
			return "", nil, nil, notObject(err)
		}
		d.ws()
		if d.i < len(d.data) {
			return "", nil, nil, notObject(d.syntax("after the top-level value"))
		}
		return "", json.RawMessage("null"), nil, nil // marshalPlain of a nil map
	default:
		return "", nil, nil, notObject(d.mismatch("an object"))
	}
	// The members and the last messages' elements, on the stack while
	// few.
	var (
		memberBuf [32]reqMember
		spanBuf   [64]span
	)
	members, spans := memberBuf[:0], spanBuf[:0]
	const (
		noMsgs = iota // none, or null
		msgsArray
		msgsOther
	)
	msgsKind := noMsgs
	var msgsErr error
	if err := d.open(1); err != nil {
		return "", nil, nil, notObject(err)
	}
	for first := true; ; first = false {
		name, fl, end, err := d.member(first)
		if err != nil {
			return "", nil, nil, notObject(err)
		}
		if end {
			break
		}
		key := name
		if fl&strEscape != 0 || fl&strNonASCII != 0 && !utf8.Valid(name) {
			key = []byte(text(name, fl))
		}
		start := d.i
		if string(key) == "messages" {
			switch d.peek() {
			case '[':
				msgsKind = msgsArray
				spans, err = d.spans(spans[:0], 1)
			case 'n':
				msgsKind = noMsgs
				err = d.null()
			default:
				msgsKind, msgsErr = msgsOther, d.mismatch("an array")
				err = d.skip(1)
			}
		} else {
			err = d.skip(1)
		}
		if err != nil {
			return "", nil, nil, notObject(err)
		}
		members = append(members, reqMember{key: key, val: body[start:d.i]})
	}
	d.ws()
	if d.i < len(d.data) {
		return "", nil, nil, notObject(d.syntax("after the top-level value"))
	}
	if msgsKind == msgsOther {
		return "", nil, nil, fmt.Errorf("the request's messages are not an array: %w", msgsErr)
	}

	// params and the messages, compact, into one buffer: the members
	// sorted by name, stably, so that the last of each name wins.
	slices.SortStableFunc(members, func(a, b reqMember) int { return bytes.Compare(a.key, b.key) })
	size := 2
	for _, m := range members {
		if string(m.key) != "messages" {
			size += len(m.key) + 4 + len(m.val)
		}
	}
	if msgsKind == msgsArray {
		for _, s := range spans {
			size += s.end - s.start
		}
	}
	out := make([]byte, 0, size)
	out = append(out, '{')
	for k, m := range members {
		if k+1 < len(members) && bytes.Equal(members[k+1].key, m.key) {
			continue // given again
		}
		switch string(m.key) {
		case "messages":
			continue
		case "model":
			if m.val[0] == '"' {
				md := decoder{data: m.val}
				_ = md.str(&model, 1)
			}
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = appendKey(out, m.key)
		out = append(out, ':')
		out = appendCompact(out, m.val)
	}
	out = append(out, '}')
	params = out[:len(out):len(out)]
	if msgsKind != msgsArray {
		return model, params, nil, nil
	}
	for k, s := range spans {
		at := len(out)
		out = appendCompact(out, body[s.start:s.end])
		spans[k] = span{at, len(out)} // now in out
	}
	// out is where the appends left it: cut from it at the end.
	params = out[:len(params):len(params)]
	msgs = make([]json.RawMessage, len(spans))
	for k, s := range spans {
		msgs[k] = out[s.start:s.end:s.end]
	}
	return model, params, msgs, nil
}

// notObject is the error of a request that is not a JSON object.
func notObject(err error) error { return fmt.Errorf("the request is not a JSON object: %w", err) }

// reqMember is a member of a request's top-level object: its name
// unquoted (a slice of the body if that needs nothing) and its value's
// bytes in the body.
type reqMember struct {
	key, val []byte
}

// span is where a value is in a text: data[start:end].
type span struct{ start, end int }

// spans reads an array, checking each element, and appends each one's
// span to s; it returns s, not stores it, so that a buffer on the stack
// stays there.
func (d *decoder) spans(s []span, depth int) ([]span, error) {
	if err := d.open(depth + 1); err != nil {
		return s, err
	}
	for first := true; ; first = false {
		end, err := d.elem(first)
		if err != nil || end {
			return s, err
		}
		start := d.i
		if err := d.skip(depth + 1); err != nil {
			return s, err
		}
		s = append(s, span{start, d.i})
	}
}

// appendCompact appends v, a checked JSON value, with the white space
// outside its strings dropped: what json.Compact (and json.Marshal of a
// json.RawMessage) makes of it.
func appendCompact(dst, v []byte) []byte {
	d := decoder{data: v}
	start := 0
	for d.i < len(v) {
		switch v[d.i] {
		case '"':
			_, _ = d.scanString() // checked
		case ' ', '\t', '\n', '\r':
			dst = append(dst, v[start:d.i]...)
			d.ws()
			start = d.i
		default:
			d.i++
		}
	}
	return append(dst, v[start:]...)
}

// appendKey appends key, a member's name unquoted, quoted as encoding/json
// quotes a map's key without its HTML escapes: \" and \\, \b, \f, \n, \r
// and \t, \u00xx for another control character, \u2028 and \u2029 for
// those two (JSONP's line ends), \ufffd for a byte that is not UTF-8.
func appendKey(dst, key []byte) []byte {
	const hexDigits = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(key); {
		c := key[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, key[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune(key[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, key[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, key[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, key[start:]...)
	return append(dst, '"')
}
