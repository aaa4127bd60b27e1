package events

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
	"unsafe"
)

// fastDecoder is implemented by the payloads decoded once per member per
// phase: the prepare and resume every member hears, and the acks the
// bridge gathers for them. decodeFast reads the plain JSON that Marshal
// writes (known keys each once, strings without escapes, numbers in the
// field's own form) straight into the zero value it is called on, and
// reports false for anything else: decodeData then decodes the payload
// with encoding/json from scratch, which is the reference, so that a
// payload decodes to the same value, or fails with the same error, either
// way (FuzzFastDecode holds the two to that).
type fastDecoder interface {
	decodeFast(b []byte) bool
}

// jscan reads one JSON value at a time from b.
type jscan struct {
	b []byte
	i int
}

func (s *jscan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// next skips whitespace and consumes c, reporting whether it was there.
func (s *jscan) next(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// end reports whether only whitespace is left.
func (s *jscan) end() bool {
	s.ws()
	return s.i == len(s.b)
}

// rawString returns a string value with its quotes, if it has no escape,
// no control character and is valid UTF-8.
func (s *jscan) rawString() ([]byte, bool) {
	s.ws()
	if s.i >= len(s.b) || s.b[s.i] != '"' {
		return nil, false
	}
	start, ascii := s.i, true
	for j := s.i + 1; j < len(s.b); j++ {
		switch c := s.b[j]; {
		case c == '"':
			raw := s.b[start : j+1]
			if !ascii && !utf8.Valid(raw) {
				return nil, false
			}
			s.i = j + 1
			return raw, true
		case c == '\\' || c < 0x20:
			return nil, false
		case c >= 0x80:
			ascii = false
		}
	}
	return nil, false
}

func (s *jscan) str() (string, bool) {
	raw, ok := s.rawString()
	if !ok {
		return "", false
	}
	return string(raw[1 : len(raw)-1]), true
}

// digits consumes a JSON integer without sign (0, or a non-zero digit and
// more digits) and returns its value; false on overflow or anything else,
// a fraction or an exponent included.
func (s *jscan) digits() (uint64, bool) {
	start := s.i
	var n uint64
	for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
		d := uint64(s.b[s.i] - '0')
		if n > (math.MaxUint64-d)/10 {
			return 0, false
		}
		n = n*10 + d
		s.i++
	}
	switch {
	case s.i == start, s.b[start] == '0' && s.i-start > 1:
		return 0, false
	case s.i < len(s.b) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E'):
		return 0, false
	}
	return n, true
}

func (s *jscan) uint() (uint64, bool) {
	s.ws()
	return s.digits()
}

func (s *jscan) int() (int64, bool) {
	s.ws()
	neg := s.i < len(s.b) && s.b[s.i] == '-'
	if neg {
		s.i++
	}
	n, ok := s.digits()
	switch {
	case !ok:
		return 0, false
	case neg && n <= 1<<63:
		return -int64(n), true
	case !neg && n < 1<<63:
		return int64(n), true
	}
	return 0, false
}

// float consumes a JSON number and reads it as encoding/json reads one
// into a float64 (strconv.ParseFloat of the literal).
func (s *jscan) float() (float64, bool) {
	s.ws()
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	switch {
	case s.i < len(s.b) && s.b[s.i] == '0':
		s.i++
	case !s.digitRun():
		return 0, false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if !s.digitRun() {
			return 0, false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if !s.digitRun() {
			return 0, false
		}
	}
	f, err := strconv.ParseFloat(string(s.b[start:s.i]), 64)
	return f, err == nil
}

// digitRun consumes one or more digits.
func (s *jscan) digitRun() bool {
	start := s.i
	for s.i < len(s.b) && '0' <= s.b[s.i] && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > start
}

func (s *jscan) boolean() (bool, bool) {
	s.ws()
	switch {
	case len(s.b)-s.i >= 4 && string(s.b[s.i:s.i+4]) == "true":
		s.i += 4
		return true, true
	case len(s.b)-s.i >= 5 && string(s.b[s.i:s.i+5]) == "false":
		s.i += 5
		return false, true
	}
	return false, false
}

func (s *jscan) time() (time.Time, bool) {
	raw, ok := s.rawString()
	if !ok {
		return time.Time{}, false
	}
	var t time.Time
	if t.UnmarshalJSON(raw) != nil {
		return time.Time{}, false
	}
	return t, true
}

// array reads a JSON array whose every element elem reads.
func array[T any](s *jscan, elem func() (T, bool)) ([]T, bool) {
	if !s.next('[') {
		return nil, false
	}
	out := []T{}
	if s.next(']') {
		return out, true
	}
	for {
		v, ok := elem()
		if !ok {
			return nil, false
		}
		out = append(out, v)
		if s.next(']') {
			return out, true
		}
		if !s.next(',') {
			return nil, false
		}
	}
}

// list reads an array of strings without escapes.
func list[T ~string](s *jscan) ([]T, bool) {
	return array(s, func() (T, bool) { v, ok := s.str(); return T(v), ok })
}

// ints reads an array of integers.
func (s *jscan) ints() ([]int, bool) {
	return array(s, func() (int, bool) { v, ok := s.int(); return int(v), ok })
}

// object reads an object whose keys field knows: field reads the value of
// key and reports false for a key it does not know or a value it does not
// take. A key that comes twice is not taken either (encoding/json keeps
// the last, which the fallback does).
func (s *jscan) object(field func(key string) bool) bool {
	if !s.next('{') {
		return false
	}
	if s.next('}') {
		return true
	}
	// The payloads' objects have a dozen keys at most; one with more
	// (counts, say) is left to encoding/json rather than checked for
	// repeats key by key against all before it.
	var buf [maxFastKeys]string
	seen := buf[:0]
	for {
		raw, ok := s.rawString()
		if !ok || !s.next(':') {
			return false
		}
		// The key is read in place: field only compares it, and b is not
		// written while it is read.
		key := unsafe.String(&raw[1], len(raw)-2)
		if len(raw) == 2 || len(seen) == maxFastKeys || slices.Contains(seen, key) {
			return false // "" is no field's key
		}
		seen = append(seen, key)
		if !field(key) {
			return false
		}
		if s.next('}') {
			return true
		}
		if !s.next(',') {
			return false
		}
	}
}

// maxFastKeys bounds the keys of an object the fast decode reads.
const maxFastKeys = 24

// whole reads b as one object with object(field) and nothing after it.
func whole(b []byte, field func(s *jscan, key string) bool) bool {
	s := &jscan{b: b}
	return s.object(func(key string) bool { return field(s, key) }) && s.end()
}

// phaseField reads one field of a PhaseHeader.
func (h *PhaseHeader) phaseField(s *jscan, key string) bool {
	var ok bool
	switch key {
	case "run":
		h.Run, ok = s.str()
	case "checkpoint_id":
		h.CheckpointID, ok = s.str()
	case "seq":
		h.Seq, ok = s.uint()
	case "epoch":
		h.Epoch, ok = s.uint()
	case "deadline":
		h.Deadline, ok = s.time()
	case "members":
		h.Members, ok = list[Member](s)
	case "sandboxes":
		r := &RosterRef{}
		ok = s.object(func(key string) bool { return r.field(s, key) })
		h.Sandboxes = r
	}
	return ok
}

// field reads one field of a RosterRef.
func (r *RosterRef) field(s *jscan, key string) bool {
	var ok bool
	switch key {
	case "seq":
		r.Seq, ok = s.uint()
	case "stream_seq":
		r.StreamSeq, ok = s.uint()
	case "count":
		var n int64
		n, ok = s.int()
		r.Count = int(n)
	case "sha256":
		r.SHA256, ok = s.str()
	}
	return ok
}

func (p *Prepare) decodeFast(b []byte) bool { return whole(b, p.phaseField) }

func (p *Resume) decodeFast(b []byte) bool {
	return whole(b, func(s *jscan, key string) bool {
		if key == "aborted" {
			var ok bool
			p.Aborted, ok = s.boolean()
			return ok
		}
		return p.phaseField(s, key)
	})
}

// ackField reads one field of an AckHeader; an error object is left to
// encoding/json.
func (h *AckHeader) ackField(s *jscan, key string) bool {
	var ok bool
	switch key {
	case "run":
		h.Run, ok = s.str()
	case "member":
		var v string
		v, ok = s.str()
		h.Member = Member(v)
	case "seq":
		h.Seq, ok = s.uint()
	case "checkpoint_id":
		h.CheckpointID, ok = s.str()
	case "epoch":
		h.Epoch, ok = s.uint()
	case "ok":
		h.OK, ok = s.boolean()
	case "phase":
		var v string
		v, ok = s.str()
		h.State = State(v)
	case "took_ms":
		h.TookMS, ok = s.int()
	}
	return ok
}

// intMap reads an object of integers.
func intMap(s *jscan) (map[string]int, bool) {
	m := map[string]int{}
	ok := s.object(func(key string) bool {
		n, ok := s.int()
		m[strings.Clone(key)] = int(n) // key is read in place (object)
		return ok
	})
	return m, ok
}

// pause reads a pause report object into *p.
func pause(s *jscan, p **PauseReport) bool {
	r := &PauseReport{}
	*p = r
	return s.object(func(key string) bool {
		var ok bool
		switch key {
		case "mode":
			r.Mode, ok = s.str()
		case "pause_seq":
			var n int64
			n, ok = s.int()
			r.PauseSeq = int(n)
		case "identity":
			r.Identity, ok = s.str()
		case "wall":
			r.Wall, ok = s.time()
		case "uptime":
			r.Uptime, ok = s.float()
		case "pid_count":
			var n int64
			n, ok = s.int()
			r.PIDCount = int(n)
		case "pids":
			r.PIDs, ok = s.ints()
		case "pending":
			r.Pending, ok = list[string](s)
		case "fallback":
			r.Fallback, ok = s.str()
		case "frozen":
			r.Frozen, ok = s.boolean()
		case "took_ms":
			r.TookMS, ok = s.float()
		case "held_calls":
			var n int64
			n, ok = s.int()
			r.HeldCalls = int(n)
		}
		return ok
	})
}

func (a *PrepareAck) decodeFast(b []byte) bool {
	return whole(b, func(s *jscan, key string) bool {
		var ok bool
		switch key {
		case "ready":
			a.Ready, ok = s.boolean()
		case "blockers":
			a.Blockers, ok = list[string](s)
		case "blocker_count":
			var n int64
			n, ok = s.int()
			a.BlockerCount = int(n)
		case "restarts":
			a.Restarts, ok = list[string](s)
		case "counts":
			a.Counts, ok = intMap(s)
		case "pause":
			ok = pause(s, &a.Pause)
		default:
			ok = a.ackField(s, key)
		}
		return ok
	})
}

func (a *ResumeAck) decodeFast(b []byte) bool {
	return whole(b, func(s *jscan, key string) bool {
		if key == "pause" {
			return pause(s, &a.Pause)
		}
		return a.ackField(s, key)
	})
}
