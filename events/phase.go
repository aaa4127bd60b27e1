package events

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Phase names a checkpoint phase (PROTOCOL §5).
type Phase string

// The phases.
const (
	PhasePrepare Phase = "prepare"
	PhaseRenew   Phase = "renew"
	PhaseCommit  Phase = "commit"
	PhaseResume  Phase = "resume"
	PhaseRestore Phase = "restore"
	PhaseRetire  Phase = "retire"
	PhaseForget  Phase = "forget"
	PhaseRelease Phase = "release"
	PhaseBranch  Phase = "branch"
)

// Phases lists every phase in protocol order.
var Phases = []Phase{PhasePrepare, PhaseRenew, PhaseCommit, PhaseResume, PhaseRestore, PhaseRetire, PhaseForget, PhaseRelease, PhaseBranch}

// Valid reports whether p is a phase of the protocol.
func (p Phase) Valid() bool {
	for _, q := range Phases {
		if p == q {
			return true
		}
	}
	return false
}

// MaxMembers bounds the member set a phase names.
const MaxMembers = 16384

// PhaseHeader is carried by every phase event (PROTOCOL §4). For retire,
// forget and release, CheckpointID is the id of that operation.
type PhaseHeader struct {
	// Run is the run id.
	Run string `json:"run"`
	// CheckpointID is the checkpoint (or operation) id the phase belongs to.
	CheckpointID string `json:"checkpoint_id"`
	// Seq is the phase sequence, monotonic per run, assigned by the bridge.
	Seq uint64 `json:"seq"`
	// Epoch is the number of restores of the run so far.
	Epoch uint64 `json:"epoch"`
	// Deadline is when the bridge stops waiting for acks (RFC 3339, UTC).
	Deadline time.Time `json:"deadline"`
	// Members is the member set the bridge expects to answer; with
	// Sandboxes, every member of it but the sandbox daemons.
	Members []Member `json:"members"`
	// Sandboxes, when set, addresses every sandbox daemon of the run as a
	// kind (PROTOCOL §3, Rosters): the daemons the bridge waits for are in
	// the roster it names, and Members names none. Nil: no sandbox daemon
	// is addressed but those Members names (a phase of an older build).
	Sandboxes *RosterRef `json:"sandboxes,omitempty"`
}

// Header returns the phase's common fields; with Phase it makes every
// phase type a PhaseEvent.
func (h PhaseHeader) Header() PhaseHeader { return h }

// Names reports whether the phase addresses m: m is in Members, or m is a
// sandbox daemon and the phase addresses sandbox daemons (Sandboxes).
// Every member of a host asks this of the same event, so it is a binary
// search on the sorted list the bridge sends, with an exact scan only when
// m is not found in a list that is not sorted.
func (h PhaseHeader) Names(m Member) bool {
	if h.Sandboxes != nil && m.Kind() == KindSandbox {
		return true
	}
	return Includes(h.Members, m)
}

// Expected returns every member the bridge waits for, sorted: Members and
// the roster's sandbox daemons. ok is false when the phase names a roster
// whose names are not known (a phase decoded from the stream, not yet
// expanded with RosterRef.Expand).
func (h PhaseHeader) Expected() (members []Member, ok bool) {
	if h.Sandboxes == nil {
		return h.Members, true
	}
	names, ok := h.Sandboxes.Names()
	if !ok {
		return slices.Clone(h.Members), false
	}
	out := make([]Member, 0, len(h.Members)+len(names))
	out = append(append(out, h.Members...), names...)
	slices.Sort(out)
	return out, true
}

// Address returns the header with the member set members: the sandbox
// daemons among them go to a roster reference (Sandboxes, not yet
// published: Seq and StreamSeq are the publisher's to set), the others to
// Members, sorted. A set without sandbox daemons has no roster.
func (h PhaseHeader) Address(members []Member) PhaseHeader {
	var named, sandboxes []Member
	for _, m := range members {
		if m.Kind() == KindSandbox {
			sandboxes = append(sandboxes, m)
		} else {
			named = append(named, m)
		}
	}
	slices.Sort(named)
	if named == nil {
		named = []Member{}
	}
	h.Members, h.Sandboxes = named, nil
	if len(sandboxes) > 0 {
		ref := NewRosterRef(sandboxes)
		h.Sandboxes = &ref
	}
	return h
}

// Includes reports whether members holds m: a binary search when members
// is sorted (as the bridge sends every member list), a scan otherwise.
func Includes(members []Member, m Member) bool {
	if _, found := slices.BinarySearch(members, m); found {
		return true
	}
	return !slices.IsSorted(members) && slices.Contains(members, m)
}

// WithHeader returns phase p with its common fields replaced by h.
func WithHeader(p PhaseEvent, h PhaseHeader) PhaseEvent {
	switch e := p.(type) {
	case Prepare:
		e.PhaseHeader = h
		return e
	case Renew:
		e.PhaseHeader = h
		return e
	case Commit:
		e.PhaseHeader = h
		return e
	case Resume:
		e.PhaseHeader = h
		return e
	case Restore:
		e.PhaseHeader = h
		return e
	case Retire:
		e.PhaseHeader = h
		return e
	case Forget:
		e.PhaseHeader = h
		return e
	case Release:
		e.PhaseHeader = h
		return e
	case Branch:
		e.PhaseHeader = h
		return e
	}
	return p
}

// PhaseEvent is implemented by every phase payload.
type PhaseEvent interface {
	Data
	// Header returns the fields every phase carries.
	Header() PhaseHeader
	// Phase returns the phase.
	Phase() Phase
}

func (h PhaseHeader) validate() error {
	var errs []error
	if err := ValidateRun(h.Run); err != nil {
		errs = append(errs, prefixField("data.", err))
	}
	if err := ValidateCheckpointID(h.CheckpointID); err != nil {
		errs = append(errs, prefixField("data.", err))
	}
	if h.Seq == 0 {
		errs = append(errs, fieldErr("data.seq", ErrInvalid, "must be at least 1"))
	}
	if h.Deadline.IsZero() {
		errs = append(errs, fieldErr("data.deadline", ErrInvalid, "missing"))
	}
	if h.Sandboxes != nil {
		errs = append(errs, h.Sandboxes.validate(h))
	}
	if len(h.Members) > MaxMembers {
		errs = append(errs, fieldErr("data.members", ErrTooLarge, "%d members, limit %d", len(h.Members), MaxMembers))
	} else {
		for i, m := range h.Members {
			if err := validateMemberAt("data.members", i, string(m)); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	return errors.Join(errs...)
}

func (h PhaseHeader) phaseRoute(p Phase) route {
	return route{run: h.Run, subject: h.CheckpointID, nats: PhaseSubject(h.Run, p), seq: h.Seq, epoch: h.Epoch, hasSeq: true}
}

// Prepare asks every member to close admission and bring its work to a
// boundary.
type Prepare struct {
	PhaseHeader
}

// Phase implements PhaseEvent.
func (Prepare) Phase() Phase { return PhasePrepare }

// Type implements Data.
func (Prepare) Type() Type { return TypePrepare }

// Validate implements Data.
func (p Prepare) Validate() error { return p.validate() }

func (p Prepare) route() route { return p.phaseRoute(PhasePrepare) }

// Renew extends the lease of an open checkpoint during a slow outer save.
type Renew struct {
	PhaseHeader
}

// Phase implements PhaseEvent.
func (Renew) Phase() Phase { return PhaseRenew }

// Type implements Data.
func (Renew) Type() Type { return TypeRenew }

// Validate implements Data.
func (p Renew) Validate() error { return p.validate() }

func (p Renew) route() route { return p.phaseRoute(PhaseRenew) }

// Commit asks every prepared member to export its state once.
type Commit struct {
	PhaseHeader
	// Scope is the episodes that continue from this checkpoint.
	Scope []Episode `json:"scope"`
	// Stop asks members to park (kill) exported work once the checkpoint
	// manifest is durable.
	Stop bool `json:"stop,omitempty"`
}

// Phase implements PhaseEvent.
func (Commit) Phase() Phase { return PhaseCommit }

// Type implements Data.
func (Commit) Type() Type { return TypeCommit }

// Validate implements Data.
func (p Commit) Validate() error {
	return errors.Join(p.validate(), validateEpisodes("data.scope", p.Scope))
}

func (p Commit) route() route { return p.phaseRoute(PhaseCommit) }

// Resume reopens admission; it is also the abort of an open checkpoint.
type Resume struct {
	PhaseHeader
	// Aborted tells whether the checkpoint was abandoned (true) or
	// committed (false).
	Aborted bool `json:"aborted,omitempty"`
}

// Phase implements PhaseEvent.
func (Resume) Phase() Phase { return PhaseResume }

// Type implements Data.
func (Resume) Type() Type { return TypeResume }

// Validate implements Data.
func (p Resume) Validate() error { return p.validate() }

func (p Resume) route() route { return p.phaseRoute(PhaseResume) }

// Restore asks fresh members to install a checkpoint's records, all or
// none. It opens a new epoch.
type Restore struct {
	PhaseHeader
	// Source is the checkpoint restored from.
	Source string `json:"source_checkpoint_id"`
	// Scope is the checkpointed episodes that continue; each continues as
	// its Next() attempt.
	Scope []Episode `json:"scope"`
	// SourceCommitSeq is the phase sequence of the source's commit: a
	// member finds its own manifest in its commit ack,
	// AckSubject(run, SourceCommitSeq, commit, member), without reading
	// the member list. 0 from a bridge that did not say (schema 1).
	SourceCommitSeq uint64 `json:"source_commit_seq,omitempty"`
	// SourceAcks tells that the stream still keeps every commit ack of the
	// source's commit, and will for longer than the restore can last: a
	// member with no ack there has no manifest, and reads no member list.
	// False: a member without an ack reads the list.
	SourceAcks bool `json:"source_acks,omitempty"`
	// Carried are the episodes of Scope whose records come from an older
	// checkpoint than Source (the source carried them, §5): a member
	// installs each of them from that checkpoint's records alone.
	Carried []CarriedSource `json:"carried,omitempty"`
	// Rejoin marks a restore into members that came back fresh while the
	// rest of the fleet served on (§5, Rejoin): it keeps the run's epoch
	// and names those members only, so no member that served is
	// superseded.
	Rejoin bool `json:"rejoin,omitempty"`
}

// CarriedSource is one older checkpoint a restore reads carried episodes
// from.
type CarriedSource struct {
	// Source, SourceCommitSeq and SourceAcks are as in Restore, for this
	// checkpoint.
	Source          string `json:"source_checkpoint_id"`
	SourceCommitSeq uint64 `json:"source_commit_seq,omitempty"`
	SourceAcks      bool   `json:"source_acks,omitempty"`
	// Episodes are the episodes (of the restore's Scope) read from it.
	Episodes []Episode `json:"episodes"`
}

// CarriedFrom returns the carried source each carried episode is read
// from.
func (p Restore) CarriedFrom() map[Episode]string {
	out := map[Episode]string{}
	for _, c := range p.Carried {
		for _, e := range c.Episodes {
			out[e] = c.Source
		}
	}
	return out
}

// Phase implements PhaseEvent.
func (Restore) Phase() Phase { return PhaseRestore }

// Type implements Data.
func (Restore) Type() Type { return TypeRestore }

// Validate implements Data.
func (p Restore) Validate() error {
	var errs []error
	errs = append(errs, p.validate())
	if err := ValidateToken("data.source_checkpoint_id", p.Source); err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, validateEpisodes("data.scope", p.Scope))
	if len(p.Carried) > MaxListLen {
		errs = append(errs, fieldErr("data.carried", ErrTooLarge, "%d entries, limit %d", len(p.Carried), MaxListLen))
		return errors.Join(errs...)
	}
	inScope := make(map[Episode]bool, len(p.Scope))
	for _, e := range p.Scope {
		inScope[e] = true
	}
	seen := map[Episode]bool{}
	for i, c := range p.Carried {
		f := fmt.Sprintf("data.carried[%d]", i)
		if err := ValidateToken(f+".source_checkpoint_id", c.Source); err != nil {
			errs = append(errs, err)
		} else if c.Source == p.Source {
			errs = append(errs, fieldErr(f+".source_checkpoint_id", ErrInvalid, "is the restore's own source"))
		}
		if err := validateEpisodes(f+".episodes", c.Episodes); err != nil {
			errs = append(errs, err)
			break
		}
		for _, e := range c.Episodes {
			if !inScope[e] {
				return errors.Join(append(errs, fieldErr(f+".episodes", ErrInvalid, "%s is not in the scope", e))...)
			}
			if seen[e] {
				return errors.Join(append(errs, fieldErr(f+".episodes", ErrInvalid, "%s is carried twice", e))...)
			}
			seen[e] = true
		}
	}
	return errors.Join(errs...)
}

func (p Restore) route() route { return p.phaseRoute(PhaseRestore) }

// Retire refuses the given attempts (and every earlier attempt of the same
// rollouts) from now on and stops their work.
type Retire struct {
	PhaseHeader
	// Episodes are the attempts to refuse.
	Episodes []Episode `json:"episodes"`
}

// Phase implements PhaseEvent.
func (Retire) Phase() Phase { return PhaseRetire }

// Type implements Data.
func (Retire) Type() Type { return TypeRetire }

// Validate implements Data.
func (p Retire) Validate() error {
	err := validateEpisodes("data.episodes", p.Episodes)
	if err == nil && len(p.Episodes) == 0 {
		err = fieldErr("data.episodes", ErrInvalid, "at least one episode")
	}
	return errors.Join(p.validate(), err)
}

func (p Retire) route() route { return p.phaseRoute(PhaseRetire) }

// Forget drops the refusal marks of rollouts that are finished for good.
type Forget struct {
	PhaseHeader
	// Rollouts are the rollout ids to forget.
	Rollouts []string `json:"rollouts"`
}

// Phase implements PhaseEvent.
func (Forget) Phase() Phase { return PhaseForget }

// Type implements Data.
func (Forget) Type() Type { return TypeForget }

// Validate implements Data.
func (p Forget) Validate() error {
	errs := []error{p.validate()}
	if len(p.Rollouts) == 0 {
		errs = append(errs, fieldErr("data.rollouts", ErrInvalid, "at least one rollout"))
	}
	for i, r := range p.Rollouts {
		if err := ValidateRollout(fmt.Sprintf("data.rollouts[%d]", i), r); err != nil {
			errs = append(errs, err)
			break
		}
	}
	return errors.Join(errs...)
}

func (p Forget) route() route { return p.phaseRoute(PhaseForget) }

// Release asks members to delete external state that no kept checkpoint
// names.
type Release struct {
	PhaseHeader
	// Keep lists the checkpoint ids still kept.
	Keep []string `json:"keep"`
	// Final marks the last release of a run: nothing is kept.
	Final bool `json:"final,omitempty"`
}

// Phase implements PhaseEvent.
func (Release) Phase() Phase { return PhaseRelease }

// Type implements Data.
func (Release) Type() Type { return TypeRelease }

// Validate implements Data.
func (p Release) Validate() error {
	errs := []error{p.validate(), validateTokens("data.keep", p.Keep)}
	if p.Final && len(p.Keep) > 0 {
		errs = append(errs, fieldErr("data.final", ErrInvalid, "a final release keeps nothing, but keep lists %d", len(p.Keep)))
	}
	return errors.Join(errs...)
}

func (p Release) route() route { return p.phaseRoute(PhaseRelease) }

// MaxListLen bounds every list an event carries (scopes, restarts, keep
// lists), so that a hostile event cannot make a reader allocate without
// bound; MaxDataSize bounds the bytes.
const MaxListLen = 1 << 16

func validateEpisodes(field string, eps []Episode) error {
	if len(eps) > MaxListLen {
		return fieldErr(field, ErrTooLarge, "%d entries, limit %d", len(eps), MaxListLen)
	}
	for i, e := range eps {
		if err := e.Validate(); err != nil {
			return prefixField(fmt.Sprintf("%s[%d].", field, i), err)
		}
	}
	return nil
}

func validateTokens(field string, ids []string) error {
	if len(ids) > MaxListLen {
		return fieldErr(field, ErrTooLarge, "%d entries, limit %d", len(ids), MaxListLen)
	}
	for i, id := range ids {
		if err := ValidateToken(fmt.Sprintf("%s[%d]", field, i), id); err != nil {
			return err
		}
	}
	return nil
}

func validateKeys(field string, keys []string) error {
	if len(keys) > MaxListLen {
		return fieldErr(field, ErrTooLarge, "%d entries, limit %d", len(keys), MaxListLen)
	}
	for i, k := range keys {
		if _, err := ParseEpisode(k); err != nil {
			return prefixField(fmt.Sprintf("%s[%d].", field, i), err)
		}
	}
	return nil
}

// prefixField puts a path in front of the field a FieldError names.
func prefixField(prefix string, err error) error {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		var errs []error
		for _, e := range joined.Unwrap() {
			errs = append(errs, prefixField(prefix, e))
		}
		return errors.Join(errs...)
	}
	var fe *FieldError
	if errors.As(err, &fe) {
		return &FieldError{Field: prefix + fe.Field, Err: fe.Err}
	}
	return err
}
