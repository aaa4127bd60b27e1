package events

import (
	"errors"
	"fmt"
	"regexp"
	"time"
)

// Error codes an ack may carry (PROTOCOL §5).
const (
	CodeStaleCheckpoint    = "stale_checkpoint"
	CodeCheckpointConflict = "checkpoint_conflict"
	CodeInvalidPhase       = "invalid_phase"
	CodeStaleAttempt       = "stale_attempt"
	CodeDeadlineExceeded   = "deadline_exceeded"
	CodeRestartInScope     = "restart_in_scope"
	CodeExportFailed       = "export_failed"
	CodeInstallFailed      = "install_failed"
	CodeSuperseded         = "superseded"
	// CodeRestarted refuses a prepare published before the member's
	// process started: it addressed the process before (PROTOCOL §5).
	CodeRestarted = "restarted"
	CodeInternal  = "internal"
)

var codeRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

// MaxBlockers caps the blocker list of a prepare ack; BlockerCount always
// carries the full count.
const MaxBlockers = 100

// MaxDetail bounds the length of an error detail.
const MaxDetail = 4096

// AckError is the error a member answers a phase with.
type AckError struct {
	// Code is a snake_case code, one of the Code* constants or a
	// participant's own.
	Code string `json:"code"`
	// Detail says what happened, for a person.
	Detail string `json:"detail,omitempty"`
}

// Error implements error.
func (e *AckError) Error() string { return e.Code + ": " + e.Detail }

// State is a member's phase-machine state (PROTOCOL §5).
type State string

// The member states.
const (
	StateIdle      State = "idle"
	StatePreparing State = "preparing"
	StatePrepared  State = "prepared"
	StateCommitted State = "committed"
	StateRestored  State = "restored"
)

// Valid reports whether s is a member state.
func (s State) Valid() bool {
	switch s {
	case StateIdle, StatePreparing, StatePrepared, StateCommitted, StateRestored:
		return true
	}
	return false
}

// AckHeader is carried by every ack (PROTOCOL §4).
type AckHeader struct {
	// Run is the run id.
	Run string `json:"run"`
	// Member is the member that answers.
	Member Member `json:"member"`
	// Seq is the sequence of the phase event this ack answers.
	Seq uint64 `json:"seq"`
	// CheckpointID is the checkpoint (or operation) id of that phase.
	CheckpointID string `json:"checkpoint_id"`
	// Epoch is the epoch the member serves.
	Epoch uint64 `json:"epoch"`
	// OK tells success; on failure Error says why.
	OK bool `json:"ok"`
	// Error is set when OK is false.
	Error *AckError `json:"error,omitempty"`
	// State is the member's phase after handling the event.
	State State `json:"phase"`
	// TookMS is how long the member took, in milliseconds.
	TookMS int64 `json:"took_ms"`
}

func (h AckHeader) validate() error {
	var errs []error
	if err := ValidateRun(h.Run); err != nil {
		errs = append(errs, prefixField("data.", err))
	}
	if err := validateMember("data.member", string(h.Member)); err != nil {
		errs = append(errs, err)
	}
	if h.Seq == 0 {
		errs = append(errs, fieldErr("data.seq", ErrInvalid, "must be at least 1"))
	}
	if err := ValidateCheckpointID(h.CheckpointID); err != nil {
		errs = append(errs, prefixField("data.", err))
	}
	switch {
	case h.OK && h.Error != nil:
		errs = append(errs, fieldErr("data.error", ErrInvalid, "set on an ok ack"))
	case !h.OK && h.Error == nil:
		errs = append(errs, fieldErr("data.error", ErrInvalid, "missing on a failed ack"))
	case h.Error != nil:
		if !codeRE.MatchString(h.Error.Code) {
			errs = append(errs, fieldErr("data.error.code", ErrInvalid, "%q must match %s", clip(h.Error.Code), codeRE))
		}
		if len(h.Error.Detail) > MaxDetail {
			errs = append(errs, fieldErr("data.error.detail", ErrTooLarge, "%d bytes, limit %d", len(h.Error.Detail), MaxDetail))
		}
	}
	if !h.State.Valid() {
		errs = append(errs, fieldErr("data.phase", ErrInvalid, "%q is not a member state", clip(string(h.State))))
	}
	if h.TookMS < 0 {
		errs = append(errs, fieldErr("data.took_ms", ErrInvalid, "negative"))
	}
	return errors.Join(errs...)
}

// ackRoute is the route of an ack of phase p: its stream subject, or, for
// an ack that travels on core NATS (LiveAck), its live subject, read on its
// stream subject too (where the bridge records it, or a build before this
// one stored it).
func (h AckHeader) ackRoute(p Phase) route {
	r := route{run: h.Run, subject: h.CheckpointID, nats: AckSubject(h.Run, h.Seq, p, h.Member),
		source: h.Member, seq: h.Seq, epoch: h.Epoch, hasSeq: true}
	if LiveAck(p, h.Member) {
		r.nats, r.alt = LiveAckSubject(h.Run, h.Seq, p, h.Member), r.nats
	}
	return r
}

// Header returns the ack's common fields; with Answers it makes every ack
// type an Ack.
func (h AckHeader) Header() AckHeader { return h }

// Ack is implemented by every ack payload.
type Ack interface {
	Data
	// Header returns the fields every ack carries.
	Header() AckHeader
	// Answers returns the phase the ack answers.
	Answers() Phase
}

// Fail marks the ack failed with a code and detail.
func (h *AckHeader) Fail(code, detail string) {
	if len(detail) > MaxDetail {
		detail = detail[:MaxDetail]
	}
	h.OK = false
	h.Error = &AckError{Code: code, Detail: detail}
}

// PauseReport is what a sandbox daemon's prepare or resume ack carries
// (PROTOCOL §6): the summary over every launch it paused at the prepare or
// continued at the resume. The daemon folds it from the result of each
// launch's pause or continue (sandboxapi.PauseResult): mode, identity, wall
// and uptime of the first, the highest pause number, sums of the counts
// and times, the first pids, and each launch's fallback.
type PauseReport struct {
	// Mode is freeze, stop or hold.
	Mode string `json:"mode"`
	// PauseSeq is the highest pause number of the launches (pause N).
	PauseSeq int `json:"pause_seq"`
	// Identity is the supervisor's pid and start time, "<pid>:<start>".
	Identity string `json:"identity"`
	// Wall is the daemon's wall clock when it acted.
	Wall time.Time `json:"wall"`
	// Uptime is the daemon's uptime in seconds when it acted.
	Uptime float64 `json:"uptime"`
	// PIDCount is how many processes it acted on; PIDs lists the first few.
	PIDCount int   `json:"pid_count"`
	PIDs     []int `json:"pids,omitempty"`
	// Pending lists holdouts, "<pid>:D" for a process in state D.
	Pending []string `json:"pending,omitempty"`
	// Fallback is set when a launch's pause could not be confirmed and it
	// falls back to stop and relaunch; it says why, "<launch>: <why>" for
	// each such launch.
	Fallback string `json:"fallback,omitempty"`
	// Frozen is true when every launch's pause was a hold that also froze
	// it (restore_sandbox_clock): a restore may then keep the sandbox's
	// clock continuous with Wall.
	Frozen bool `json:"frozen,omitempty"`
	// TookMS is how long the pause or continue took.
	TookMS float64 `json:"took_ms"`
	// HeldCalls, in a resume ack, is how many model calls the sandbox's
	// relay held for the checkpoint when the daemon continued its launches
	// (the calls it then lets go); 0 without a relay.
	HeldCalls int `json:"held_calls,omitempty"`
}

// Still tells whether the pause stood still: the kernel confirmed it
// (a frozen cgroup, every thread stopped, or a hold that also froze the
// launch) and no launch fell back to stop and relaunch.
func (p PauseReport) Still() bool {
	return p.Fallback == "" && (p.Mode == "freeze" || p.Mode == "stop" || p.Mode == "hold" && p.Frozen)
}

// PrepareAck answers a prepare.
type PrepareAck struct {
	AckHeader
	// Ready tells whether every piece of the member's work is at a boundary.
	Ready bool `json:"ready"`
	// Blockers are the first MaxBlockers keys that are not ready.
	Blockers []string `json:"blockers,omitempty"`
	// BlockerCount is the full number of blockers.
	BlockerCount int `json:"blocker_count"`
	// Restarts are the episodes this member cannot capture; never capped.
	Restarts []string `json:"restarts,omitempty"`
	// Counts are the member's own tallies (runs parked, sessions held, ...).
	Counts map[string]int `json:"counts,omitempty"`
	// Pause is set by a sandbox daemon that paused launches.
	Pause *PauseReport `json:"pause,omitempty"`
}

// SetBlockers records every blocker: the list is capped, the count is not.
func (a *PrepareAck) SetBlockers(all []string) {
	a.BlockerCount = len(all)
	if len(all) > MaxBlockers {
		all = all[:MaxBlockers]
	}
	a.Blockers = append([]string(nil), all...)
}

// Answers implements Ack.
func (PrepareAck) Answers() Phase { return PhasePrepare }

// Type implements Data.
func (PrepareAck) Type() Type { return TypePrepareAck }

// Validate implements Data.
func (a PrepareAck) Validate() error {
	errs := []error{a.validate()}
	if len(a.Blockers) > MaxBlockers {
		errs = append(errs, fieldErr("data.blockers", ErrTooLarge, "%d entries, limit %d", len(a.Blockers), MaxBlockers))
	}
	if a.BlockerCount < len(a.Blockers) {
		errs = append(errs, fieldErr("data.blocker_count", ErrInvalid, "%d is below the %d blockers listed", a.BlockerCount, len(a.Blockers)))
	}
	if a.Ready && a.BlockerCount > 0 {
		errs = append(errs, fieldErr("data.ready", ErrInvalid, "ready with %d blockers", a.BlockerCount))
	}
	for i, b := range a.Blockers {
		if b == "" || len(b) > 256 {
			errs = append(errs, fieldErr(fmt.Sprintf("data.blockers[%d]", i), ErrInvalid, "must be 1 to 256 bytes"))
			break
		}
	}
	errs = append(errs, validateKeys("data.restarts", a.Restarts))
	if len(a.Counts) > 64 {
		errs = append(errs, fieldErr("data.counts", ErrTooLarge, "%d entries, limit 64", len(a.Counts)))
	}
	return errors.Join(errs...)
}

// route: a sandbox daemon's prepare ack travels on core NATS (LiveAck):
// the bridge counts the first it hears and records what it heard
// (PrepareAcked). Every other member's is stored.
func (a PrepareAck) route() route { return a.ackRoute(PhasePrepare) }

// RenewAck answers a renew.
type RenewAck struct {
	AckHeader
	// Lease is when the member's lease now runs out.
	Lease time.Time `json:"lease,omitzero"`
}

// Answers implements Ack.
func (RenewAck) Answers() Phase { return PhaseRenew }

// Type implements Data.
func (RenewAck) Type() Type { return TypeRenewAck }

// Validate implements Data.
func (a RenewAck) Validate() error { return a.validate() }

func (a RenewAck) route() route { return a.ackRoute(PhaseRenew) }

// ManifestSchema is the schema version of member manifests.
const ManifestSchema = 1

// isSHA256 reports whether s is 64 lower-case hex digits.
func isSHA256(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// MemberManifest describes the records one member exported for one
// checkpoint. It is recorded once, in the member's commit ack (whose
// subject is written once); the bridge gathers the acks' manifests into
// the checkpoint's member list (MemberList). Runs of schema 1 also hold it
// in sp_manifests under <run>.<checkpoint>.<member>. Readers verify the
// digest and count.
type MemberManifest struct {
	// Schema is ManifestSchema.
	Schema int `json:"schema"`
	// Run, CheckpointID and Member say whose records these are.
	Run          string `json:"run"`
	CheckpointID string `json:"checkpoint_id"`
	Member       Member `json:"member"`
	// Object is the object name (RecordsObject: named by the digest) in
	// Bucket.
	Object string `json:"object"`
	// Bucket is the object store that holds Object: RecordsBucket of Run
	// and Member for a member that writes with credentials of its own, ""
	// for sp_records, the store every member shares (and every manifest
	// written before members had stores of their own names).
	Bucket string `json:"bucket,omitempty"`
	// SHA256 is the hex digest of the object's bytes.
	SHA256 string `json:"sha256"`
	// Count is the number of records (JSON lines).
	Count int `json:"count"`
	// Size is the object's length in bytes.
	Size int64 `json:"size"`
	// Episodes are the capture keys of the exported records.
	Episodes []string `json:"episodes,omitempty"`
}

// Validate checks the manifest.
func (m MemberManifest) Validate() error {
	var errs []error
	if m.Schema != ManifestSchema {
		errs = append(errs, fieldErr("manifest.schema", ErrUnknownVersion, "%d, this build reads %d", m.Schema, ManifestSchema))
	}
	if err := ValidateRun(m.Run); err != nil {
		errs = append(errs, prefixField("manifest.", err))
	}
	if err := ValidateCheckpointID(m.CheckpointID); err != nil {
		errs = append(errs, prefixField("manifest.", err))
	}
	if err := validateMember("manifest.member", string(m.Member)); err != nil {
		errs = append(errs, err)
	}
	if want := RecordsObject(m.Run, m.CheckpointID, m.Member, m.SHA256); m.Object != want {
		errs = append(errs, fieldErr("manifest.object", ErrMismatch, "%q, want %q", clip(m.Object), want))
	}
	if m.Bucket != "" {
		if want := RecordsBucket(m.Run, m.Member); m.Bucket != want {
			errs = append(errs, fieldErr("manifest.bucket", ErrMismatch, "%q, want %q or none", clip(m.Bucket), want))
		}
	}
	if !isSHA256(m.SHA256) {
		errs = append(errs, fieldErr("manifest.sha256", ErrInvalid, "%q is not a hex sha256", clip(m.SHA256)))
	}
	if m.Count < 0 || m.Size < 0 {
		errs = append(errs, fieldErr("manifest.count", ErrInvalid, "negative count or size"))
	}
	errs = append(errs, validateKeys("manifest.episodes", m.Episodes))
	return errors.Join(errs...)
}

// RecordsObject returns the sp_records object name of a member's records
// in a checkpoint, named by their content:
// <run>/<checkpoint>/<member>.<first 16 hex digits of the sha256>.jsonl.
// A name fixed by the content can never be written again with other bytes,
// so a manifest always names the bytes it was created for, even if a
// presumed-dead process of the same member writes late.
func RecordsObject(run, checkpoint string, m Member, sha256 string) string {
	if len(sha256) > 16 {
		sha256 = sha256[:16]
	}
	return RecordsPrefix(run, checkpoint, m) + sha256 + ".jsonl"
}

// RecordsBucket returns the object store of member m's records in run,
// sp_records_<run>_<kind>_<name>: a member with credentials of its own
// writes there, and its user may write no other member's store
// (PROTOCOL-HISTORY §3, docs/PERMISSIONS.md).
func RecordsBucket(run string, m Member) string {
	return RecordsBucketPrefix(run) + string(m.Kind()) + "_" + m.Name()
}

// RecordsBucketPrefix returns the prefix of the name of every member's own
// records store in run (RecordsBucket): sp_records_<run>_.
func RecordsBucketPrefix(run string) string {
	return "sp_records_" + run + "_"
}

// TrajectoriesBucket returns the object store of agent m's rollouts'
// trajectories in run, sp_trajectories_<run>_<kind>_<name>: an agent with
// credentials of its own writes there, and its user may write no other
// agent's store, nor the shared sp_trajectories (PROTOCOL §3,
// docs/PERMISSIONS.md).
func TrajectoriesBucket(run string, m Member) string {
	return TrajectoriesBucketPrefix(run) + string(m.Kind()) + "_" + m.Name()
}

// TrajectoriesBucketPrefix returns the prefix of the name of every agent's
// own trajectories store in run (TrajectoriesBucket): sp_trajectories_<run>_.
func TrajectoriesBucketPrefix(run string) string {
	return "sp_trajectories_" + run + "_"
}

// RecordsPrefix returns the prefix of every records object of a member in a
// checkpoint.
func RecordsPrefix(run, checkpoint string, m Member) string {
	return run + "/" + checkpoint + "/" + string(m) + "."
}

// CommitAck answers a commit.
type CommitAck struct {
	AckHeader
	// Manifest describes the exported records. An ok ack without one
	// exported nothing (PROTOCOL §5, commit: no records, no manifest).
	Manifest *MemberManifest `json:"manifest,omitempty"`
}

// Answers implements Ack.
func (CommitAck) Answers() Phase { return PhaseCommit }

// Type implements Data.
func (CommitAck) Type() Type { return TypeCommitAck }

// Validate implements Data.
func (a CommitAck) Validate() error {
	errs := []error{a.validate()}
	if a.Manifest != nil {
		errs = append(errs, prefixField("data.", a.Manifest.Validate()))
		if a.Manifest.Member != a.Member || a.Manifest.CheckpointID != a.CheckpointID || a.Manifest.Run != a.Run {
			errs = append(errs, fieldErr("data.manifest", ErrMismatch, "names %s/%s/%s, the ack is %s/%s/%s",
				a.Manifest.Run, a.Manifest.CheckpointID, a.Manifest.Member, a.Run, a.CheckpointID, a.Member))
		}
	}
	return errors.Join(errs...)
}

func (a CommitAck) route() route { return a.ackRoute(PhaseCommit) }

// ResumeAck answers a resume.
type ResumeAck struct {
	AckHeader
	// Pause is set by a sandbox daemon that continued launches.
	Pause *PauseReport `json:"pause,omitempty"`
}

// Answers implements Ack.
func (ResumeAck) Answers() Phase { return PhaseResume }

// Type implements Data.
func (ResumeAck) Type() Type { return TypeResumeAck }

// Validate implements Data.
func (a ResumeAck) Validate() error { return a.validate() }

// route: a resume ack travels on core NATS (LiveAck), not into the
// stream (PROTOCOL §3, acks).
func (a ResumeAck) route() route { return a.ackRoute(PhaseResume) }

// RestoreAck answers a restore.
type RestoreAck struct {
	AckHeader
	// Source is the checkpoint the member restored from.
	Source string `json:"source_checkpoint_id,omitempty"`
	// Restored are the next-attempt capture keys the member now holds.
	Restored []string `json:"restored,omitempty"`
}

// Answers implements Ack.
func (RestoreAck) Answers() Phase { return PhaseRestore }

// Type implements Data.
func (RestoreAck) Type() Type { return TypeRestoreAck }

// Validate implements Data.
func (a RestoreAck) Validate() error {
	errs := []error{a.validate(), validateKeys("data.restored", a.Restored)}
	if a.Source != "" {
		errs = append(errs, ValidateToken("data.source_checkpoint_id", a.Source))
	}
	return errors.Join(errs...)
}

func (a RestoreAck) route() route { return a.ackRoute(PhaseRestore) }

// RetireAck answers a retire.
type RetireAck struct {
	AckHeader
}

// Answers implements Ack.
func (RetireAck) Answers() Phase { return PhaseRetire }

// Type implements Data.
func (RetireAck) Type() Type { return TypeRetireAck }

// Validate implements Data.
func (a RetireAck) Validate() error { return a.validate() }

func (a RetireAck) route() route { return a.ackRoute(PhaseRetire) }

// ForgetAck answers a forget.
type ForgetAck struct {
	AckHeader
}

// Answers implements Ack.
func (ForgetAck) Answers() Phase { return PhaseForget }

// Type implements Data.
func (ForgetAck) Type() Type { return TypeForgetAck }

// Validate implements Data.
func (a ForgetAck) Validate() error { return a.validate() }

func (a ForgetAck) route() route { return a.ackRoute(PhaseForget) }

// ReleaseAck answers a release.
type ReleaseAck struct {
	AckHeader
	// Deleted are the ids of what the member deleted (snapshot ids for an
	// owner).
	Deleted []string `json:"deleted,omitempty"`
}

// Answers implements Ack.
func (ReleaseAck) Answers() Phase { return PhaseRelease }

// Type implements Data.
func (ReleaseAck) Type() Type { return TypeReleaseAck }

// Validate implements Data.
func (a ReleaseAck) Validate() error {
	errs := []error{a.validate()}
	if len(a.Deleted) > MaxListLen {
		errs = append(errs, fieldErr("data.deleted", ErrTooLarge, "%d entries, limit %d", len(a.Deleted), MaxListLen))
	}
	return errors.Join(errs...)
}

func (a ReleaseAck) route() route { return a.ackRoute(PhaseRelease) }
