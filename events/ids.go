package events

import (
	"crypto/rand"
	"fmt"
	"strconv"
	"strings"
	"sync"
)

// The id patterns of PROTOCOL §2, quoted in errors. Matching is done by
// validID, a byte loop, not a regexp: ids are checked on every event.
const (
	tokenRE   = `^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`
	rolloutRE = `^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`
)

// validID reports whether s is 1..max bytes of [A-Za-z0-9_-] (plus '.'
// when dots is set) starting with a letter or digit.
func validID(s string, max int, dots bool) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case i > 0 && (c == '_' || c == '-' || (dots && c == '.')):
		default:
			return false
		}
	}
	return true
}

// attemptSuffix returns the index of a trailing "-a<digits>" in s, or -1.
func attemptSuffix(s string) int {
	i := len(s)
	for i > 0 && '0' <= s[i-1] && s[i-1] <= '9' {
		i--
	}
	if i == len(s) || i < 2 || s[i-1] != 'a' || s[i-2] != '-' {
		return -1
	}
	return i - 2
}

// MemberKind is the kind half of a member name (PROTOCOL §2).
type MemberKind string

// The member kinds.
const (
	KindAgent   MemberKind = "agent"
	KindOwner   MemberKind = "owner"
	KindSandbox MemberKind = "sandbox"
	KindBridge  MemberKind = "bridge"
)

// Valid reports whether k is one of the member kinds.
func (k MemberKind) Valid() bool {
	switch k {
	case KindAgent, KindOwner, KindSandbox, KindBridge:
		return true
	}
	return false
}

// ValidateToken checks an id that becomes a NATS subject token or a KV key
// part: a run id, checkpoint id or the name half of a member. field names
// the id in the error.
func ValidateToken(field, v string) error {
	if v == "" {
		return fieldErr(field, ErrInvalid, "missing")
	}
	if !validID(v, 64, false) {
		return fieldErr(field, ErrInvalid, "%q must match %s", clip(v), tokenRE)
	}
	return nil
}

// ValidateRun checks a run id.
func ValidateRun(v string) error { return ValidateToken("run", v) }

// ValidateCheckpointID checks a checkpoint (or operation) id.
func ValidateCheckpointID(v string) error {
	if v == "LATEST" || v == "HEAD" {
		// sp_manifests keys <run>.LATEST and <run>.HEAD are the run's own.
		return fieldErr("checkpoint_id", ErrInvalid, "%q is reserved", v)
	}
	return ValidateToken("checkpoint_id", v)
}

// ValidateRollout checks a rollout or session id: PROTOCOL §2 allows dots
// but not a trailing "-a<digits>", which would make episode keys ambiguous.
func ValidateRollout(field, v string) error {
	if v == "" {
		return fieldErr(field, ErrInvalid, "missing")
	}
	if !validID(v, 128, true) {
		return fieldErr(field, ErrInvalid, "%q must match %s", clip(v), rolloutRE)
	}
	if attemptSuffix(v) >= 0 {
		return fieldErr(field, ErrInvalid, "%q must not end in -a<digits>", clip(v))
	}
	return nil
}

// Member is a member name, <kind>.<name>.
type Member string

// NewMember builds and checks a member name.
func NewMember(kind MemberKind, name string) (Member, error) {
	m := Member(string(kind) + "." + name)
	return m, m.Validate()
}

// Kind returns the kind half of the name.
func (m Member) Kind() MemberKind {
	k, _, _ := strings.Cut(string(m), ".")
	return MemberKind(k)
}

// Name returns the name half.
func (m Member) Name() string {
	_, n, _ := strings.Cut(string(m), ".")
	return n
}

// Validate checks the member name against PROTOCOL §2.
func (m Member) Validate() error { return validateMember("member", string(m)) }

// validateMemberAt checks list[i], a member of the list named field; the
// error names list[i] as field[i]. The name is made only for an error:
// every phase and outcome lists up to MaxMembers.
func validateMemberAt(field string, i int, v string) error {
	if err := validateMember(field, v); err != nil {
		return validateMember(fmt.Sprintf("%s[%d]", field, i), v)
	}
	return nil
}

func validateMember(field, v string) error {
	kind, name, ok := strings.Cut(v, ".")
	if !ok {
		return fieldErr(field, ErrInvalid, "%q must be <kind>.<name>", clip(v))
	}
	if !MemberKind(kind).Valid() {
		return fieldErr(field, ErrInvalid, "%q: kind %q is not agent, owner, sandbox or bridge", clip(v), clip(kind))
	}
	if err := ValidateToken(field, name); err != nil {
		return fieldErr(field, ErrInvalid, "%q: name must match %s", clip(v), tokenRE)
	}
	return nil
}

// Episode is one attempt of a rollout (PROTOCOL §2). Its text form, the
// capture key, is the rollout id for attempt 0 and <rollout>-a<attempt>
// otherwise; it marshals to and from JSON as that string.
type Episode struct {
	Rollout string
	Attempt int
}

// String returns the capture key.
func (e Episode) String() string {
	if e.Attempt == 0 {
		return e.Rollout
	}
	return e.Rollout + "-a" + strconv.Itoa(e.Attempt)
}

// Next returns the episode that continues e after a restore.
func (e Episode) Next() Episode { return Episode{Rollout: e.Rollout, Attempt: e.Attempt + 1} }

// Validate checks the rollout id and the attempt.
func (e Episode) Validate() error {
	if err := ValidateRollout("rollout", e.Rollout); err != nil {
		return err
	}
	if e.Attempt < 0 {
		return fieldErr("attempt", ErrInvalid, "%d is negative", e.Attempt)
	}
	return nil
}

// ParseEpisode reads a capture key.
func ParseEpisode(s string) (Episode, error) {
	if at := attemptSuffix(s); at >= 0 {
		n, err := strconv.Atoi(s[at+2:])
		if err != nil || n <= 0 || s[at+2] == '0' {
			return Episode{}, fieldErr("episode", ErrInvalid, "%q: attempt must be a positive number without leading zeros", clip(s))
		}
		e := Episode{Rollout: s[:at], Attempt: n}
		if err := ValidateRollout("episode", e.Rollout); err != nil {
			return Episode{}, err
		}
		return e, nil
	}
	e := Episode{Rollout: s}
	if err := ValidateRollout("episode", s); err != nil {
		return Episode{}, err
	}
	return e, nil
}

// MarshalText implements encoding.TextMarshaler.
func (e Episode) MarshalText() ([]byte, error) {
	if err := e.Validate(); err != nil {
		return nil, err
	}
	return []byte(e.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler. A key that does not
// parse is kept whole as the rollout id, which Validate then refuses, so
// that the error names the field path (data.scope[3].rollout) rather than
// surfacing from inside the JSON decoder without one.
func (e *Episode) UnmarshalText(b []byte) error {
	p, err := ParseEpisode(string(b))
	if err != nil {
		p = Episode{Rollout: string(b)}
	}
	*e = p
	return nil
}

// clip shortens a value quoted in an error so that a hostile multi-megabyte
// id cannot turn into a multi-megabyte log line.
func clip(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	return s[:max] + fmt.Sprintf("…(%d bytes)", len(s))
}

// idDigits are the characters of NewID.
const idDigits = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

// IDLength is the length of a NewID.
const IDLength = 22

// NewID returns a new unique id, the default ce-id of every event (and a
// member's instance): IDLength base-62 characters drawn from crypto/rand
// on each call, about 130 random bits. It never comes from a generator
// seeded once per process (such as the nuid package's): the processes of
// two forks of one VM memory snapshot share such a generator's state and
// would draw the same ids, and the stream's deduplication (Nats-Msg-Id is
// the ce-id, §4) would drop the second fork's events. A forked guest
// reseeds its kernel RNG before it publishes (docs/MICROVM.md), so
// crypto/rand differs from then on.
func NewID() string {
	var b [IDLength]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic("events: crypto/rand failed: " + err.Error()) // crypto/rand.Read does not fail on Linux
	}
	for i, c := range b {
		b[i] = idDigits[int(c)%len(idDigits)]
	}
	return string(b[:])
}

// MsgIDs hands out the ids of one process's publishes that may be made
// again: each is the key, which names the logical publish (for example
// <run>.<seq>.<phase>.<member> for an ack), a dot and a NewID drawn the
// first time the key is asked for. Asked again for a key it holds, it
// returns the same id, so that the publish made again (an unanswered
// attempt, a delivery handled again) is a duplicate of the first to the
// server. It holds the last MsgIDsKept keys. The zero value is ready, and
// it is safe for concurrent use.
//
// The random part is what makes the id safe to send as Nats-Msg-Id
// (PROTOCOL §4): deduplication spans the whole stream, across subjects
// and runs, so a client that could tell an id before it is published
// could publish it first, anywhere in the stream, and have the real
// publish dropped as a duplicate of its own. The key alone, or anything
// else the bus shows (sequences, names, a process's nonce in its earlier
// ids), is such an id. A new process draws new ids: what must hold across
// a restart is read from the stream, not left to deduplication.
type MsgIDs struct {
	mu   sync.Mutex
	ids  map[string]string
	keys []string // oldest first
}

// MsgIDsKept is how many keys a MsgIDs holds: far more publishes than a
// process makes again before it moves on.
const MsgIDsKept = 64

// For returns the id of the publish that key names (see MsgIDs).
func (m *MsgIDs) For(key string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if id, ok := m.ids[key]; ok {
		return id
	}
	if m.ids == nil {
		m.ids = map[string]string{}
	}
	id := key + "." + NewID()
	m.ids[key] = id
	m.keys = append(m.keys, key)
	if len(m.keys) > MsgIDsKept {
		delete(m.ids, m.keys[0])
		m.keys = m.keys[1:]
	}
	return id
}
