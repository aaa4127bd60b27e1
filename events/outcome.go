package events

import (
	"errors"
	"fmt"
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
	// Members are the members whose manifests the checkpoint names.
	Members []Member `json:"members"`
	// PrepareMS and CommitMS time the two phases.
	PrepareMS int64 `json:"prepare_ms"`
	CommitMS  int64 `json:"commit_ms"`
	// Stop tells members to park exported work now.
	Stop bool `json:"stop,omitempty"`
}

// Type implements Data.
func (CheckpointCommitted) Type() Type { return TypeCheckpointCommitted }

// Validate implements Data.
func (o CheckpointCommitted) Validate() error {
	errs := []error{o.validate(), validateKeys("data.continued", o.Continued), validateKeys("data.restarted", o.Restarted)}
	for i, m := range o.Members {
		if err := validateMember(fmt.Sprintf("data.members[%d]", i), string(m)); err != nil {
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
