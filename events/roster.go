package events

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
)

// Rosters (PROTOCOL §3, §4): a phase addresses every sandbox daemon of its
// run as a kind, not by name. The sandbox daemons the bridge waits for are
// listed once, in a roster event on the stream (sp.<run>.roster.<seq>),
// and the phase names that event by its stream sequence, count and digest.
// So a phase stays a few hundred bytes at any number of sandboxes, and
// every daemon decodes that much, not the whole fleet's names, which
// would make a checkpoint's cost grow with N² (N daemons decoding N names).

// TypeRoster is the type of a roster event.
const TypeRoster Type = "dev.stillpoint.roster.sandboxes.v1"

// RosterSubject returns sp.<run>.roster.<seq>: the roster first published
// for phase seq. Later phases of the same member set (a resume after its
// prepare) name the same event.
func RosterSubject(run string, seq uint64) string {
	return SubjectPrefix + "." + run + ".roster." + strconv.FormatUint(seq, 10)
}

// Roster is the sandbox daemons a phase addresses: the bridge waits for
// an ack of each (PROTOCOL §5, Bridge rules). It is published by the
// bridge before the first phase that names it.
type Roster struct {
	// Run is the run id.
	Run string `json:"run"`
	// CheckpointID is the operation of the phase it was published for.
	CheckpointID string `json:"checkpoint_id"`
	// Seq is the sequence of the phase it was published for.
	Seq uint64 `json:"seq"`
	// Epoch is that phase's epoch.
	Epoch uint64 `json:"epoch"`
	// Members are the sandbox daemons, sorted, each once.
	Members []Member `json:"members"`
}

// Type implements Data.
func (Roster) Type() Type { return TypeRoster }

// Validate implements Data.
func (r Roster) Validate() error {
	var errs []error
	errs = append(errs, prefixField("data.", errors.Join(ValidateRun(r.Run), ValidateCheckpointID(r.CheckpointID))))
	if r.Seq == 0 {
		errs = append(errs, fieldErr("data.seq", ErrInvalid, "must be at least 1"))
	}
	if len(r.Members) == 0 {
		errs = append(errs, fieldErr("data.members", ErrInvalid, "a roster names at least one sandbox daemon"))
	}
	errs = append(errs, validateSandboxes("data.members", r.Members))
	return errors.Join(errs...)
}

func (r Roster) route() route {
	return route{run: r.Run, subject: r.CheckpointID, nats: RosterSubject(r.Run, r.Seq), seq: r.Seq, epoch: r.Epoch, hasSeq: true}
}

// Ref returns how a phase names this roster once it is on the stream at
// stream sequence streamSeq, with the names filled in.
func (r Roster) Ref(streamSeq uint64) RosterRef {
	ref := NewRosterRef(r.Members)
	ref.Seq, ref.StreamSeq = r.Seq, streamSeq
	return ref
}

// validateSandboxes checks a sorted list of sandbox daemons, each once.
func validateSandboxes(field string, ms []Member) error {
	if len(ms) > MaxMembers {
		return fieldErr(field, ErrTooLarge, "%d members, limit %d", len(ms), MaxMembers)
	}
	for i, m := range ms {
		f := fmt.Sprintf("%s[%d]", field, i)
		if err := validateMember(f, string(m)); err != nil {
			return err
		}
		if m.Kind() != KindSandbox {
			return fieldErr(f, ErrInvalid, "%s is not a sandbox daemon", m)
		}
		if i > 0 && ms[i-1] >= m {
			return fieldErr(f, ErrInvalid, "%s after %s: not sorted, or named twice", m, ms[i-1])
		}
	}
	return nil
}

// RosterRef is how a phase names its roster (PhaseHeader.Sandboxes): the
// roster's phase sequence and stream sequence, how many sandbox daemons it
// names and the sha256 of their names (RosterDigest). A RosterRef decoded
// from an event holds no names; Expand fills them from the roster event.
type RosterRef struct {
	// Seq is the phase sequence of the roster's subject, RosterSubject.
	Seq uint64 `json:"seq"`
	// StreamSeq is the roster event's sequence in the stream.
	StreamSeq uint64 `json:"stream_seq"`
	// Count is the number of sandbox daemons it names.
	Count int `json:"count"`
	// SHA256 is RosterDigest of the names.
	SHA256 string `json:"sha256"`

	names []Member // when known: from the bridge that built it, or Expand
}

// NewRosterRef returns the reference of a roster of sandboxes (sorted
// here), with its names; Seq and StreamSeq are set once it is published.
func NewRosterRef(sandboxes []Member) RosterRef {
	names := slices.Clone(sandboxes)
	slices.Sort(names)
	names = slices.Compact(names)
	return RosterRef{Count: len(names), SHA256: RosterDigest(names), names: names}
}

// RosterDigest is the sha256 (hex) of sorted member names, each followed
// by a newline: what a roster reference names its roster by.
func RosterDigest(sorted []Member) string {
	h := sha256.New()
	for _, m := range sorted {
		h.Write([]byte(m))
		h.Write([]byte{'\n'})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Names returns the sandbox daemons, sorted, and whether they are known:
// a reference decoded from an event knows none until Expand.
func (r RosterRef) Names() ([]Member, bool) {
	return r.names, r.names != nil || r.Count == 0
}

// Same reports whether r and o name the same sandbox daemons.
func (r RosterRef) Same(o RosterRef) bool { return r.Count == o.Count && r.SHA256 == o.SHA256 }

// Expand returns r with the names of roster, which must be the roster it
// names: its sequence, count and digest (else ErrMismatch naming the
// difference).
func (r RosterRef) Expand(roster Roster) (RosterRef, error) {
	if roster.Seq != r.Seq {
		return r, fieldErr("sandboxes.seq", ErrMismatch, "roster of phase %d, the phase names %d", roster.Seq, r.Seq)
	}
	if len(roster.Members) != r.Count {
		return r, fieldErr("sandboxes.count", ErrMismatch, "roster of %d sandbox daemons, the phase says %d", len(roster.Members), r.Count)
	}
	if d := RosterDigest(roster.Members); d != r.SHA256 {
		return r, fieldErr("sandboxes.sha256", ErrMismatch, "roster digest %s, the phase says %s", d, r.SHA256)
	}
	r.names = slices.Clone(roster.Members)
	return r, nil
}

func (r RosterRef) validate(h PhaseHeader) error {
	var errs []error
	if r.Count < 1 || r.Count > MaxMembers {
		errs = append(errs, fieldErr("data.sandboxes.count", ErrInvalid, "%d, want 1 to %d", r.Count, MaxMembers))
	}
	if !isSHA256(r.SHA256) {
		errs = append(errs, fieldErr("data.sandboxes.sha256", ErrInvalid, "%q is not a hex sha256", clip(r.SHA256)))
	}
	if r.Seq == 0 || r.Seq > h.Seq {
		errs = append(errs, fieldErr("data.sandboxes.seq", ErrInvalid, "%d: a roster of this phase or an earlier one (1 to %d)", r.Seq, h.Seq))
	}
	if r.StreamSeq == 0 {
		errs = append(errs, fieldErr("data.sandboxes.stream_seq", ErrInvalid, "must be at least 1"))
	}
	if r.names != nil && len(r.names) != r.Count {
		errs = append(errs, fieldErr("data.sandboxes.count", ErrMismatch, "%d names known, count says %d", len(r.names), r.Count))
	}
	if len(h.Members)+r.Count > MaxMembers {
		errs = append(errs, fieldErr("data.sandboxes", ErrTooLarge, "%d members and %d sandbox daemons, limit %d in all", len(h.Members), r.Count, MaxMembers))
	}
	for i, m := range h.Members {
		if m.Kind() == KindSandbox {
			errs = append(errs, fieldErr(fmt.Sprintf("data.members[%d]", i), ErrInvalid, "%s: a phase with a roster names no sandbox daemon", m))
			break
		}
	}
	return errors.Join(errs...)
}
