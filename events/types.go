package events

import (
	"strings"
)

// Type is a CloudEvents type string, dev.stillpoint.<noun>.<verb>.v<N>.
type Type string

// TypePrefix starts every Stillpoint event type.
const TypePrefix = "dev.stillpoint."

// Version is the only event version this build reads and writes.
const Version = "v1"

// The event types of protocol v1 (PROTOCOL §4). Phase events are published
// by the bridge, acks by members, outcomes by the bridge, membership events
// by each member about itself.
const (
	TypePrepare Type = "dev.stillpoint.phase.prepare.v1"
	TypeRenew   Type = "dev.stillpoint.phase.renew.v1"
	TypeCommit  Type = "dev.stillpoint.phase.commit.v1"
	TypeResume  Type = "dev.stillpoint.phase.resume.v1"
	TypeRestore Type = "dev.stillpoint.phase.restore.v1"
	TypeRetire  Type = "dev.stillpoint.phase.retire.v1"
	TypeForget  Type = "dev.stillpoint.phase.forget.v1"
	TypeRelease Type = "dev.stillpoint.phase.release.v1"
	TypeBranch  Type = "dev.stillpoint.phase.branch.v1"

	TypePrepareAck Type = "dev.stillpoint.ack.prepare.v1"
	TypeRenewAck   Type = "dev.stillpoint.ack.renew.v1"
	TypeCommitAck  Type = "dev.stillpoint.ack.commit.v1"
	TypeResumeAck  Type = "dev.stillpoint.ack.resume.v1"
	TypeRestoreAck Type = "dev.stillpoint.ack.restore.v1"
	TypeRetireAck  Type = "dev.stillpoint.ack.retire.v1"
	TypeForgetAck  Type = "dev.stillpoint.ack.forget.v1"
	TypeReleaseAck Type = "dev.stillpoint.ack.release.v1"
	TypeBranchAck  Type = "dev.stillpoint.ack.branch.v1"

	TypeCheckpointCommitted Type = "dev.stillpoint.checkpoint.committed.v1"
	TypeCheckpointFailed    Type = "dev.stillpoint.checkpoint.failed.v1"
	TypeRestoreCompleted    Type = "dev.stillpoint.restore.completed.v1"
	TypeRestoreFailed       Type = "dev.stillpoint.restore.failed.v1"
	TypeReleaseCompleted    Type = "dev.stillpoint.release.completed.v1"
	TypeReleaseFailed       Type = "dev.stillpoint.release.failed.v1"
	TypeBranchCompleted     Type = "dev.stillpoint.branch.completed.v1"
	TypeBranchFailed        Type = "dev.stillpoint.branch.failed.v1"

	TypeMemberJoined Type = "dev.stillpoint.member.joined.v1"
	TypeMemberLeft   Type = "dev.stillpoint.member.left.v1"
)

// Noun returns the <noun>.<verb> part of t, e.g. "phase.prepare".
func (t Type) Noun() string {
	s := strings.TrimPrefix(string(t), TypePrefix)
	if i := strings.LastIndexByte(s, '.'); i >= 0 {
		return s[:i]
	}
	return s
}

// registry maps every known type to a decoder of its data.
var registry = map[Type]func([]byte) (Data, error){}

// nouns is the set of known <noun>.<verb> pairs, to tell an unknown
// version from an unknown type.
var nouns = map[string]bool{}

func register[T Data]() {
	var zero T
	t := zero.Type()
	registry[t] = func(b []byte) (Data, error) { return decodeData[T](b) }
	nouns[t.Noun()] = true
}

func init() {
	register[Prepare]()
	register[Renew]()
	register[Commit]()
	register[Resume]()
	register[Restore]()
	register[Retire]()
	register[Forget]()
	register[Release]()
	register[Branch]()
	register[PrepareAck]()
	register[RenewAck]()
	register[CommitAck]()
	register[ResumeAck]()
	register[RestoreAck]()
	register[RetireAck]()
	register[ForgetAck]()
	register[ReleaseAck]()
	register[BranchAck]()
	register[CheckpointCommitted]()
	register[CheckpointFailed]()
	register[RestoreCompleted]()
	register[RestoreFailed]()
	register[ReleaseCompleted]()
	register[ReleaseFailed]()
	register[BranchCompleted]()
	register[BranchFailed]()
	register[MemberJoined]()
	register[MemberLeft]()
	register[Roster]()
	register[ResumeAcked]()
	register[PrepareAcked]()
}

// Types returns every event type this build knows, in no set order.
func Types() []Type {
	out := make([]Type, 0, len(registry))
	for t := range registry {
		out = append(out, t)
	}
	return out
}

// checkType tells whether t is known, and if not, whether it is an unknown
// type or an unknown version of a known one.
func checkType(t string) error {
	if _, ok := registry[Type(t)]; ok {
		return nil
	}
	if !strings.HasPrefix(t, TypePrefix) {
		return fieldErr("ce-type", ErrUnknownType, "%q is not a %s* type", clip(t), TypePrefix)
	}
	if nouns[Type(t).Noun()] {
		return fieldErr("ce-type", ErrUnknownVersion, "%q: this build reads %s only", clip(t), Version)
	}
	return fieldErr("ce-type", ErrUnknownType, "%q", clip(t))
}
