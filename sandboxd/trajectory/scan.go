package trajectory

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// This file is the JSON scanner the decoders of decode.go and split.go
// share: syntax checked as encoding/json checks it, values skipped or
// read, strings unquoted.

// maxDepth is encoding/json's bound on nested arrays and objects: a value
// nested deeper is not JSON to it, so not to us.
const maxDepth = 10000

// decoder reads a JSON text from data, at i, checking it as
// encoding/json's scanner does. Its methods that decode a value start at
// the value's first byte and take depth, the arrays and objects it is in.
type decoder struct {
	data []byte
	i    int
}

// array starts an array value: it reports true past its bracket, false
// for a null (the caller makes its slice nil) or an error.
func (d *decoder) array(depth int, what string) (bool, error) {
	switch d.peek() {
	case '[':
		err := d.open(depth + 1)
		return err == nil, err
	case 'n':
		return false, d.null()
	}
	return false, d.mismatch(what)
}

// object starts an object value: it reports true past its brace, false
// for a null (which leaves a struct as it was) or an error.
func (d *decoder) object(depth int, what string) (bool, error) {
	switch d.peek() {
	case '{':
		err := d.open(depth + 1)
		return err == nil, err
	case 'n':
		return false, d.null()
	}
	return false, d.mismatch(what)
}

// open takes the bracket or brace of an array or object that makes depth
// of them.
func (d *decoder) open(depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("arrays and objects nested over %d deep (offset %d)", maxDepth, d.i)
	}
	d.i++
	return nil
}

// member reads an object's next member up to its value: the comma before
// it (none before the first), its name and the colon. It reports end past
// the object's closing brace. name is the raw name between the quotes, fl
// what unquoting it needs.
func (d *decoder) member(first bool) (name []byte, fl strFlags, end bool, err error) {
	d.ws()
	c := d.peek()
	if c == '}' {
		d.i++
		return nil, 0, true, nil
	}
	if !first {
		if c != ',' {
			return nil, 0, false, d.syntax("after an object member")
		}
		d.i++
		d.ws()
		c = d.peek()
	}
	if c != '"' {
		return nil, 0, false, d.syntax("looking for an object key")
	}
	start := d.i + 1
	if fl, err = d.scanString(); err != nil {
		return nil, 0, false, err
	}
	name = d.data[start : d.i-1]
	d.ws()
	if d.peek() != ':' {
		return nil, 0, false, d.syntax("after an object key")
	}
	d.i++
	d.ws()
	return name, fl, false, nil
}

// elem reads up to an array's next element: the comma before it (none
// before the first). It reports end past the array's closing bracket.
func (d *decoder) elem(first bool) (end bool, err error) {
	d.ws()
	c := d.peek()
	if c == ']' {
		d.i++
		return true, nil
	}
	if !first {
		if c != ',' {
			return false, d.syntax("after an array element")
		}
		d.i++
		d.ws()
	}
	return false, nil
}

// field returns the index in names of the member a key names, or -1: as
// encoding/json, the name exactly, else one equal to it under Unicode case
// folding.
func field(name []byte, fl strFlags, names []string) int {
	if fl == 0 {
		for k, n := range names {
			if string(name) == n {
				return k
			}
		}
		upper := false
		for _, c := range name {
			upper = upper || 'A' <= c && c <= 'Z'
		}
		if !upper {
			return -1 // the names are lower case
		}
	}
	key := text(name, fl)
	for k, n := range names {
		if strings.EqualFold(key, n) {
			return k
		}
	}
	return -1
}

// skip reads past one value of any kind, checking it.
func (d *decoder) skip(depth int) error {
	switch c := d.peek(); {
	case c == '"':
		_, err := d.scanString()
		return err
	case c == '{':
		if err := d.open(depth + 1); err != nil {
			return err
		}
		for first := true; ; first = false {
			_, _, end, err := d.member(first)
			if err != nil || end {
				return err
			}
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
	case c == '[':
		if err := d.open(depth + 1); err != nil {
			return err
		}
		for first := true; ; first = false {
			end, err := d.elem(first)
			if err != nil || end {
				return err
			}
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
	case c == 't':
		return d.literal("true")
	case c == 'f':
		return d.literal("false")
	case c == 'n':
		return d.null()
	case c == '-' || '0' <= c && c <= '9':
		_, err := d.number()
		return err
	}
	return d.syntax("looking for the beginning of a value")
}

// raw reads a value of any kind into *dst as json.RawMessage takes one:
// its exact bytes, null included.
func (d *decoder) raw(dst *json.RawMessage, depth int) error {
	start := d.i
	if err := d.skip(depth); err != nil {
		return err
	}
	*dst = d.data[start:d.i]
	return nil
}

// str decodes a string; null leaves *dst as it was.
func (d *decoder) str(dst *string, _ int) error {
	switch d.peek() {
	case '"':
		start := d.i + 1
		fl, err := d.scanString()
		if err != nil {
			return err
		}
		*dst = text(d.data[start:d.i-1], fl)
		return nil
	case 'n':
		return d.null()
	}
	return d.mismatch("a string")
}

// integer decodes an int as encoding/json does: a number with no fraction or
// exponent that fits; null leaves *dst as it was.
func (d *decoder) integer(dst *int, _ int) error {
	c := d.peek()
	if c == 'n' {
		return d.null()
	}
	if c != '-' && (c < '0' || '9' < c) {
		return d.mismatch("an int")
	}
	start := d.i
	b, err := d.number()
	if err != nil {
		return err
	}
	n, ok := atoi(b)
	if !ok {
		return fmt.Errorf("cannot unmarshal number %s into an int (offset %d)", b, start)
	}
	*dst = n
	return nil
}

// atoi reads a JSON number as an int: false if it has a fraction or an
// exponent or does not fit.
func atoi(b []byte) (int, bool) {
	neg := b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) > 19 { // no leading zeros: over math.MaxInt64
		return 0, false
	}
	var n uint64
	for _, c := range b {
		if c < '0' || '9' < c {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	if neg {
		if n > uint64(math.MaxInt)+1 {
			return 0, false
		}
		return int(-n), true
	}
	if n > uint64(math.MaxInt) {
		return 0, false
	}
	return int(n), true
}

// float decodes a float64 as encoding/json does (strconv.ParseFloat of
// the literal, an error out of range); null leaves *dst as it was.
func (d *decoder) float(dst *float64, _ int) error {
	c := d.peek()
	if c == 'n' {
		return d.null()
	}
	if c != '-' && (c < '0' || '9' < c) {
		return d.mismatch("a float")
	}
	start := d.i
	b, err := d.number()
	if err != nil {
		return err
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil {
		return fmt.Errorf("cannot unmarshal number %s into a float64 (offset %d)", b, start)
	}
	*dst = f
	return nil
}

// number reads a number as JSON has them and returns its literal.
func (d *decoder) number() ([]byte, error) {
	start := d.i
	if d.peek() == '-' {
		d.i++
	}
	switch c := d.peek(); {
	case c == '0':
		d.i++
	case '1' <= c && c <= '9':
		d.digits()
	default:
		return nil, d.syntax("in a number")
	}
	if d.peek() == '.' {
		d.i++
		if !d.digits() {
			return nil, d.syntax("after a decimal point")
		}
	}
	if c := d.peek(); c == 'e' || c == 'E' {
		d.i++
		if c := d.peek(); c == '+' || c == '-' {
			d.i++
		}
		if !d.digits() {
			return nil, d.syntax("in an exponent")
		}
	}
	return d.data[start:d.i], nil
}

// digits reads one or more digits, reporting false for none.
func (d *decoder) digits() bool {
	start := d.i
	for d.i < len(d.data) && '0' <= d.data[d.i] && d.data[d.i] <= '9' {
		d.i++
	}
	return d.i > start
}

// strFlags says what a string literal holds that unquoting it must mind.
type strFlags uint8

const (
	strEscape   strFlags = 1 << iota // a backslash escape
	strNonASCII                      // a byte over 0x7f
)

// plain marks the bytes a string literal may hold that need no care: not
// a quote, a backslash, a control character or, in plain[0], a byte over
// 0x7f (plain[1] is for once one was seen).
var plain = func() (t [2][256]bool) {
	for c := 0x20; c < 0x100; c++ {
		t[0][c] = c != '"' && c != '\\' && c < 0x80
		t[1][c] = c != '"' && c != '\\'
	}
	return t
}()

// careIn returns non-zero if one of the eight string bytes in w needs
// care as plain says: a quote, a backslash, a control character or, with
// high 0x80 in each byte, a byte over 0x7f.
func careIn(w, high uint64) uint64 {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	q, bs := w^(ones*'"'), w^(ones*'\\')
	return (w-ones*0x20)&^w&highs | (q-ones)&^q&highs | (bs-ones)&^bs&highs | w&high
}

// scanString reads a string literal, checking it as encoding/json's
// scanner does (no control characters, only JSON's escapes; any other
// byte goes), and returns what unquoting it needs. It reads eight bytes
// at a time while none needs care.
func (d *decoder) scanString() (strFlags, error) {
	var fl strFlags
	data, i := d.data, d.i+1
	high, tab := uint64(0x8080808080808080), &plain[0]
	for {
		for i+8 <= len(data) && careIn(binary.LittleEndian.Uint64(data[i:]), high) == 0 {
			i += 8
		}
		for i < len(data) && tab[data[i]] {
			i++
		}
		if i >= len(data) {
			d.i = i
			return 0, d.syntax("in a string")
		}
		switch c := data[i]; {
		case c == '"':
			d.i = i + 1
			return fl, nil
		case c == '\\':
			fl |= strEscape
			i++
			if i >= len(data) {
				d.i = i
				return 0, d.syntax("in a string escape")
			}
			switch data[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				for k := 1; k <= 4; k++ {
					if i+k >= len(data) || hex(data[i+k]) < 0 {
						d.i = i + k
						return 0, d.syntax("in a \\u escape")
					}
				}
				i += 5
			default:
				d.i = i
				return 0, d.syntax("in a string escape")
			}
		case c < 0x20:
			d.i = i
			return 0, d.syntax("in a string")
		default:
			fl |= strNonASCII
			high, tab = 0, &plain[1]
			i++
		}
	}
}

// text returns the string a string literal's inside s holds, fl being
// what scanString found in it: s itself if it has no escape and is UTF-8.
func text(s []byte, fl strFlags) string {
	if fl&strEscape == 0 && (fl&strNonASCII == 0 || utf8.Valid(s)) {
		return string(s)
	}
	var b strings.Builder
	b.Grow(len(s))
	unquote(&b, s)
	return b.String()
}

// unquote writes to b what a checked string literal's inside s holds, as
// encoding/json unquotes it: escapes decoded (a \u surrogate that is not
// half of a pair as U+FFFD), each byte that is not UTF-8 as U+FFFD.
func unquote(b *strings.Builder, s []byte) {
	if bytes.IndexByte(s, '\\') < 0 && utf8.Valid(s) {
		b.Write(s)
		return
	}
	for len(s) > 0 {
		n := 0
		for n < len(s) && s[n] != '\\' {
			if s[n] < utf8.RuneSelf {
				n++
				continue
			}
			r, size := utf8.DecodeRune(s[n:])
			if r == utf8.RuneError && size == 1 {
				break
			}
			n += size
		}
		b.Write(s[:n])
		s = s[n:]
		if len(s) == 0 {
			return
		}
		if s[0] != '\\' {
			b.WriteRune(utf8.RuneError)
			s = s[1:]
			continue
		}
		c := s[1]
		s = s[2:]
		switch c {
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'u':
			r := u4(s)
			s = s[4:]
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if len(s) >= 6 && s[0] == '\\' && s[1] == 'u' {
					r2 = u4(s[2:])
				}
				if dec := utf16.DecodeRune(r, r2); dec != utf8.RuneError {
					r = dec
					s = s[6:]
				} else {
					r = utf8.RuneError
				}
			}
			b.WriteRune(r)
		default: // '"', '\\', '/'
			b.WriteByte(c)
		}
	}
}

// u4 reads the four hex digits of a checked \u escape.
func u4(s []byte) rune {
	return rune(hex(s[0])<<12 | hex(s[1])<<8 | hex(s[2])<<4 | hex(s[3]))
}

// hex returns a hex digit's value, or -1.
func hex(c byte) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// literal reads the literal lit (true, false, null).
func (d *decoder) literal(lit string) error {
	for k := 0; k < len(lit); k++ {
		if d.peek() != lit[k] {
			return d.syntax("in a literal")
		}
		d.i++
	}
	return nil
}

// null reads a null.
func (d *decoder) null() error { return d.literal("null") }

// ws skips whitespace as JSON has it.
func (d *decoder) ws() {
	for d.i < len(d.data) {
		switch d.data[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// peek returns the byte at i, 0 (never valid) at the end.
func (d *decoder) peek() byte {
	if d.i < len(d.data) {
		return d.data[d.i]
	}
	return 0
}

// errEnd is the error of a text that ends before its value does.
var errEnd = errors.New("unexpected end of JSON input")

// syntax returns the error of bad syntax at i.
func (d *decoder) syntax(where string) error {
	if d.i >= len(d.data) {
		return errEnd
	}
	return fmt.Errorf("invalid character %q %s (offset %d)", d.data[d.i], where, d.i)
}

// mismatch returns the error of a value at i that is not the kind wanted,
// or of bad syntax if no value starts there.
func (d *decoder) mismatch(want string) error {
	var kind string
	switch c := d.peek(); {
	case c == '"':
		kind = "a string"
	case c == '{':
		kind = "an object"
	case c == '[':
		kind = "an array"
	case c == 't' || c == 'f':
		kind = "a bool"
	case c == '-' || '0' <= c && c <= '9':
		kind = "a number"
	default:
		return d.syntax("looking for the beginning of a value")
	}
	return fmt.Errorf("cannot unmarshal %s into %s (offset %d)", kind, want, d.i)
}
