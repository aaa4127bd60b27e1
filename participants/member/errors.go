package member

import "errors"

var (
	// ErrSuperseded is returned by Run when a phase of a newer epoch showed
	// that the run has moved on without this member (PROTOCOL §5, Epochs
	// fence zombies). The member stopped its handlers and touched no
	// shared state; its process should exit. Machine.Step returns it
	// (wrapped) for every input after the supersession.
	ErrSuperseded = errors.New("member: superseded by a newer epoch")

	// ErrStaleAttempt is returned (wrapped) by Admit for an attempt at or
	// below its rollout's retire mark. Participants refuse such work with
	// events.CodeStaleAttempt.
	ErrStaleAttempt = errors.New("member: stale attempt")

	// ErrInvalidConfig is returned (wrapped, one per field, joined) by
	// Config.Validate and New.
	ErrInvalidConfig = errors.New("member: invalid config")

	// ErrAlreadyRunning is returned by a second call to Run.
	ErrAlreadyRunning = errors.New("member: Run called twice")

	// ErrConsumerLost is returned (wrapped) by Run when a consumer it
	// cannot make again (one behind a Source) was deleted under it: a
	// member that cannot hear phases must not go on. A member's own
	// durable consumer is made again instead.
	ErrConsumerLost = errors.New("member: consumer lost")

	// ErrReplaced is returned by Run when another process has taken this
	// member's name (its heartbeat key names another instance): the one
	// that was presumed dead stops, touching nothing.
	ErrReplaced = errors.New("member: replaced by another process of the same name")

	// ErrUnknownInput is returned by Machine.Step for a nil input.
	ErrUnknownInput = errors.New("member: unknown machine input")
)

// CodeCorruptRecords is the ack error code of a restore whose records do
// not verify against their manifest (ErrCorruptRecords).
const CodeCorruptRecords = "corrupt_records"
