package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// MemberError names a member and what went wrong with it.
type MemberError struct {
	// Member is the member.
	Member Member `json:"member"`
	// Code and Detail are as in AckError; a member that never answered has
	// code "missing_ack".
	Code   string `json:"code"`
	Detail string `json:"detail,omitempty"`
}

// CodeMissingAck names a member that did not answer by the deadline.
const CodeMissingAck = "missing_ack"

func validateMemberErrors(field string, errs []MemberError) error {
	if len(errs) > MaxListLen {
		return fieldErr(field, ErrTooLarge, "%d entries, limit %d", len(errs), MaxListLen)
	}
	for i, e := range errs {
		f := fmt.Sprintf("%s[%d]", field, i)
		if err := validateMember(f+".member", string(e.Member)); err != nil {
			return err
		}
		if !codeRE.MatchString(e.Code) {
			return fieldErr(f+".code", ErrInvalid, "%q must match %s", clip(e.Code), codeRE)
		}
		if len(e.Detail) > MaxDetail {
			return fieldErr(f+".detail", ErrTooLarge, "%d bytes, limit %d", len(e.Detail), MaxDetail)
		}
	}
	return nil
}

// OutcomeHeader is carried by every outcome.
type OutcomeHeader struct {
	// Run is the run id.
	Run string `json:"run"`
	// CheckpointID is the checkpoint (or restore/release operation) id.
	CheckpointID string `json:"checkpoint_id"`
	// Epoch is the run's epoch after the operation.
	Epoch uint64 `json:"epoch"`
}

func (h OutcomeHeader) validate() error {
	return prefixField("data.", errors.Join(ValidateRun(h.Run), ValidateCheckpointID(h.CheckpointID)))
}

func (h OutcomeHeader) outcomeRoute(t Type) route {
	return route{run: h.Run, subject: h.CheckpointID, nats: OutcomeSubject(h.Run, t), epoch: h.Epoch}
}

// CheckpointCommitted says a checkpoint exists: its manifest was created
// and LATEST points at it.
type CheckpointCommitted struct {
	OutcomeHeader
	// Continued and Restarted are the episodes the checkpoint continues and
	// those that will restart from their input.
	Continued []string `json:"continued"`
	Restarted []string `json:"restarted,omitempty"`
	// Carried and Retired are as in the manifest: the episodes held
	// through an older checkpoint, and those the controller left out.
	Carried []Carry  `json:"carried,omitempty"`
	Retired []string `json:"retired,omitempty"`
	// Members are the members whose manifests the checkpoint names.
	Members []Member `json:"members"`
	// PrepareMS and CommitMS time the two phases.
	PrepareMS int64 `json:"prepare_ms"`
	CommitMS  int64 `json:"commit_ms"`
	// Stop tells members to park exported work now.
	Stop bool `json:"stop,omitempty"`

	// What the checkpoint manifest holds, so that the run's checkpoints
	// read back from the stream once a release deleted the manifests.
	// Created is when the manifest was created; PrepareSeq and CommitSeq
	// are the checkpoint's phase sequences.
	Created    time.Time `json:"created,omitzero"`
	PrepareSeq uint64    `json:"prepare_seq,omitempty"`
	CommitSeq  uint64    `json:"commit_seq,omitempty"`
	// Exports are what each member exported, member by member as in
	// Members. ExportsCut counts the members left off the list to keep the
	// event under MaxDataSize (see CapExports); the manifest, while it is
	// kept, names them all.
	Exports    []MemberExport `json:"exports,omitempty"`
	ExportsCut int            `json:"exports_cut,omitempty"`
}

// MemberExport is what one member exported for a checkpoint, as its member
// manifest says, with the member's kind, process instance and epoch.
type MemberExport struct {
	// Member and Kind name the member (Kind is the kind half of the name).
	Member Member     `json:"member"`
	Kind   MemberKind `json:"kind"`
	// Instance is the member's process instance as its heartbeat said when
	// the checkpoint was asked; empty when the bridge did not see it (a
	// checkpoint finished by a restarted bridge).
	Instance string `json:"instance,omitempty"`
	// Epoch is the epoch the member answered the commit in.
	Epoch uint64 `json:"epoch"`
	// Bucket, Object, SHA256, Size and Count are the records object: its
	// store as in MemberManifest.Bucket ("" for sp_records), its name, the
	// hex digest and length of its bytes, its record count.
	Bucket string `json:"bucket,omitempty"`
	Object string `json:"object"`
	SHA256 string `json:"sha256"`
	Size   int64  `json:"size"`
	Count  int    `json:"count"`
	// Episodes is how many capture keys the member exported.
	Episodes int `json:"episodes"`
}

// ExportOf returns the export that a member manifest describes.
func ExportOf(mm MemberManifest, epoch uint64, instance string) MemberExport {
	return MemberExport{Member: mm.Member, Kind: mm.Member.Kind(), Instance: instance, Epoch: epoch, Bucket: mm.Bucket, Object: mm.Object,
		SHA256: mm.SHA256, Size: mm.Size, Count: mm.Count, Episodes: len(mm.Episodes)}
}

// CapExports keeps the leading exports whose JSON fits in budget bytes and
// returns them with the number cut. A budget below zero keeps none.
func CapExports(exports []MemberExport, budget int) ([]MemberExport, int) {
	used := 0
	for i, e := range exports {
		b, err := json.Marshal(e)
		if err != nil || used+len(b)+1 > budget {
			return exports[:i], len(exports) - i
		}
		used += len(b) + 1
	}
	return exports, 0
}

func validateExports(field string, exports []MemberExport) error {
	if len(exports) > MaxMembers {
		return fieldErr(field, ErrTooLarge, "%d entries, limit %d", len(exports), MaxMembers)
	}
	for i, e := range exports {
		f := fmt.Sprintf("%s[%d]", field, i)
		if err := validateMember(f+".member", string(e.Member)); err != nil {
			return err
		}
		if e.Kind != e.Member.Kind() {
			return fieldErr(f+".kind", ErrMismatch, "%q, member %s", clip(string(e.Kind)), e.Member)
		}
		if e.Size < 0 || e.Count < 0 || e.Episodes < 0 {
			return fieldErr(f+".size", ErrInvalid, "negative size, count or episodes")
		}
		if len(e.Instance) > 255 || len(e.Bucket) > 255 || len(e.Object) > 1024 || len(e.SHA256) > 64 {
			return fieldErr(f, ErrTooLarge, "instance, object or sha256 too long")
		}
	}
	return nil
}

// Type implements Data.
func (CheckpointCommitted) Type() Type { return TypeCheckpointCommitted }

// Validate implements Data.
func (o CheckpointCommitted) Validate() error {
	errs := []error{o.validate(), validateKeys("data.continued", o.Continued), validateKeys("data.restarted", o.Restarted),
		validateKeys("data.retired", o.Retired), validateExports("data.exports", o.Exports)}
	if len(o.Carried) > MaxListLen {
		errs = append(errs, fieldErr("data.carried", ErrTooLarge, "%d entries, limit %d", len(o.Carried), MaxListLen))
	}
	for i, c := range o.Carried {
		if err := c.Validate(); err != nil {
			errs = append(errs, prefixField(fmt.Sprintf("data.carried[%d].", i), err))
			break
		}
	}
	if o.ExportsCut < 0 {
		errs = append(errs, fieldErr("data.exports_cut", ErrInvalid, "negative"))
	}
	for i, m := range o.Members {
		if err := validateMemberAt("data.members", i, string(m)); err != nil {
			errs = append(errs, err)
			break
		}
	}
	return errors.Join(errs...)
}

func (o CheckpointCommitted) route() route { return o.outcomeRoute(TypeCheckpointCommitted) }

// CheckpointFailed says a checkpoint was aborted and will never exist.
type CheckpointFailed struct {
	OutcomeHeader
	// Phase is the phase it failed in.
	Phase Phase `json:"phase"`
	// Reason sums it up for a person.
	Reason string `json:"reason"`
	// Blockers maps each member that was not ready to its blockers (capped
	// per member as in PrepareAck), and BlockerCount to the full count.
	Blockers     map[Member][]string `json:"blockers,omitempty"`
	BlockerCount map[Member]int      `json:"blocker_count,omitempty"`
	// Errors names every member that failed or never answered.
	Errors []MemberError `json:"errors,omitempty"`

	// Members are the members the failed phase addressed (the resume
	// that aborts names the same). PrepareSeq and CommitSeq are the
	// checkpoint's phase sequences so far, PrepareMS and CommitMS their
	// timings (zero for a phase it did not reach).
	// MembersCut is set instead of Members when the list would not fit in
	// MaxDataSize: the number of members left off.
	Members    []Member `json:"members,omitempty"`
	MembersCut int      `json:"members_cut,omitempty"`
	PrepareSeq uint64   `json:"prepare_seq,omitempty"`
	CommitSeq  uint64   `json:"commit_seq,omitempty"`
	PrepareMS  int64    `json:"prepare_ms,omitempty"`
	CommitMS   int64    `json:"commit_ms,omitempty"`
}

// Type implements Data.
func (CheckpointFailed) Type() Type { return TypeCheckpointFailed }

// Validate implements Data.
func (o CheckpointFailed) Validate() error {
	errs := []error{o.validate(), validateMemberErrors("data.errors", o.Errors)}
	if !o.Phase.Valid() {
		errs = append(errs, fieldErr("data.phase", ErrInvalid, "%q is not a phase", clip(string(o.Phase))))
	}
	if o.Reason == "" || len(o.Reason) > MaxDetail {
		errs = append(errs, fieldErr("data.reason", ErrInvalid, "must be 1 to %d bytes", MaxDetail))
	}
	if len(o.Members) > MaxMembers {
		errs = append(errs, fieldErr("data.members", ErrTooLarge, "%d members, limit %d", len(o.Members), MaxMembers))
	}
	for i, m := range o.Members {
		if err := validateMemberAt("data.members", i, string(m)); err != nil {
			errs = append(errs, err)
			break
		}
	}
	if len(o.Blockers) > MaxMembers {
		errs = append(errs, fieldErr("data.blockers", ErrTooLarge, "%d members, limit %d", len(o.Blockers), MaxMembers))
	}
	for m, bs := range o.Blockers {
		if err := validateMember("data.blockers", string(m)); err != nil {
			errs = append(errs, err)
			break
		}
		if len(bs) > MaxBlockers {
			errs = append(errs, fieldErr("data.blockers."+string(m), ErrTooLarge, "%d entries, limit %d", len(bs), MaxBlockers))
			break
		}
	}
	return errors.Join(errs...)
}

func (o CheckpointFailed) route() route { return o.outcomeRoute(TypeCheckpointFailed) }

// RestoreCompleted says every member installed the checkpoint.
type RestoreCompleted struct {
	OutcomeHeader
	// Source is the checkpoint restored from.
	Source string `json:"source_checkpoint_id"`
	// Restored are the next-attempt capture keys now live.
	Restored []string `json:"restored"`
}

// Type implements Data.
func (RestoreCompleted) Type() Type { return TypeRestoreCompleted }

// Validate implements Data.
func (o RestoreCompleted) Validate() error {
	return errors.Join(o.validate(), ValidateToken("data.source_checkpoint_id", o.Source), validateKeys("data.restored", o.Restored))
}

func (o RestoreCompleted) route() route { return o.outcomeRoute(TypeRestoreCompleted) }

// RestoreFailed says the restore installed nothing: the next attempts were
// retired everywhere and those rollouts restart from their input.
type RestoreFailed struct {
	OutcomeHeader
	// Source is the checkpoint the restore tried.
	Source string `json:"source_checkpoint_id"`
	// Errors names every member that failed or never answered.
	Errors []MemberError `json:"errors"`
	// Retired are the attempts that were retired.
	Retired []string `json:"retired,omitempty"`
}

// Type implements Data.
func (RestoreFailed) Type() Type { return TypeRestoreFailed }

// Validate implements Data.
func (o RestoreFailed) Validate() error {
	return errors.Join(o.validate(), ValidateToken("data.source_checkpoint_id", o.Source),
		validateMemberErrors("data.errors", o.Errors), validateKeys("data.retired", o.Retired))
}

func (o RestoreFailed) route() route { return o.outcomeRoute(TypeRestoreFailed) }

// ReleaseCompleted says a release finished on every member: what it kept
// and what it deleted. A release that failed on any member is
// ReleaseFailed instead.
type ReleaseCompleted struct {
	OutcomeHeader
	// Keep are the checkpoints still kept.
	Keep []string `json:"keep"`
	// Deleted are the checkpoints whose manifests and records are gone.
	Deleted []string `json:"deleted,omitempty"`
}

// Type implements Data.
func (ReleaseCompleted) Type() Type { return TypeReleaseCompleted }

// Validate implements Data.
func (o ReleaseCompleted) Validate() error {
	return errors.Join(o.validate(), validateTokens("data.keep", o.Keep), validateTokens("data.deleted", o.Deleted))
}

func (o ReleaseCompleted) route() route { return o.outcomeRoute(TypeReleaseCompleted) }

// ReleaseFailed says a release failed on at least one member: the bridge
// deleted nothing of its own (no manifest, record or LATEST), as the
// members that failed may still hold what the manifests name. The members
// that did release may have deleted snapshots; Deleted lists them.
type ReleaseFailed struct {
	OutcomeHeader
	// Keep are the checkpoints the release was asked to keep.
	Keep []string `json:"keep"`
	// Reason sums it up for a person.
	Reason string `json:"reason"`
	// Errors names every member that failed or never answered; at least
	// one.
	Errors []MemberError `json:"errors"`
	// Deleted maps each member that released to what it deleted.
	Deleted map[Member][]string `json:"member_deleted,omitempty"`
}

// Type implements Data.
func (ReleaseFailed) Type() Type { return TypeReleaseFailed }

// Validate implements Data.
func (o ReleaseFailed) Validate() error {
	errs := []error{o.validate(), validateTokens("data.keep", o.Keep), validateMemberErrors("data.errors", o.Errors)}
	if len(o.Errors) == 0 {
		errs = append(errs, fieldErr("data.errors", ErrInvalid, "a failed release names at least one member"))
	}
	if o.Reason == "" || len(o.Reason) > MaxDetail {
		errs = append(errs, fieldErr("data.reason", ErrInvalid, "must be 1 to %d bytes", MaxDetail))
	}
	if len(o.Deleted) > MaxMembers {
		errs = append(errs, fieldErr("data.member_deleted", ErrTooLarge, "%d members, limit %d", len(o.Deleted), MaxMembers))
	}
	for m, ids := range o.Deleted {
		if err := validateMember("data.member_deleted", string(m)); err != nil {
			errs = append(errs, err)
			break
		}
		if err := validateTokens("data.member_deleted."+string(m), ids); err != nil {
			errs = append(errs, err)
			break
		}
	}
	return errors.Join(errs...)
}

func (o ReleaseFailed) route() route { return o.outcomeRoute(TypeReleaseFailed) }
