package events

import (
	"errors"
	"strconv"
)

// TypeResumeAcked is the type of the bridge's record of a resume's acks.
const TypeResumeAcked Type = "dev.stillpoint.resume.acked.v1"

// ResumeAckedSubject returns sp.<run>.resumed.<seq>: the record of the
// acks of resume seq.
func ResumeAckedSubject(run string, seq uint64) string {
	return SubjectPrefix + "." + run + ".resumed." + strconv.FormatUint(seq, 10)
}

// MaxListed bounds the members a ResumeAcked names in each of its lists;
// its counts are never capped.
const MaxListed = 100

// ResumeAcked is what the bridge heard of the acks of one resume, in the
// stream (PROTOCOL §3): resume acks travel on core NATS, so that a fleet's
// resume writes nothing per member, and this one event keeps the audit log
// saying who answered, who did not (a member that missed the resume
// reopens when its lease runs out) and who answered with an error.
type ResumeAcked struct {
	// Run is the run id.
	Run string `json:"run"`
	// CheckpointID is the operation the resume ended.
	CheckpointID string `json:"checkpoint_id"`
	// Seq and Epoch are the resume's.
	Seq   uint64 `json:"seq"`
	Epoch uint64 `json:"epoch"`
	// Expected is how many members the resume addressed; Answered how
	// many acks of them the bridge heard by the deadline.
	Expected int `json:"expected"`
	Answered int `json:"answered"`
	// Missing names the first MaxListed members not heard, of
	// MissingCount.
	Missing      []Member `json:"missing,omitempty"`
	MissingCount int      `json:"missing_count,omitempty"`
	// Errors names the first MaxListed members that answered with an
	// error, of ErrorCount.
	Errors     []MemberError `json:"errors,omitempty"`
	ErrorCount int           `json:"error_count,omitempty"`
	// HeldCalls adds up the model calls the sandboxes' relays held through
	// the checkpoint (their daemons' pause reports).
	HeldCalls int `json:"held_calls,omitempty"`
	// P50MS and MaxMS are the acks' latencies from the resume's publish,
	// as the bridge heard them, in milliseconds.
	P50MS float64 `json:"p50_ms,omitempty"`
	MaxMS float64 `json:"max_ms,omitempty"`
}

// Type implements Data.
func (ResumeAcked) Type() Type { return TypeResumeAcked }

// Validate implements Data.
func (r ResumeAcked) Validate() error {
	var errs []error
	errs = append(errs, prefixField("data.", errors.Join(ValidateRun(r.Run), ValidateCheckpointID(r.CheckpointID))))
	if r.Seq == 0 {
		errs = append(errs, fieldErr("data.seq", ErrInvalid, "must be at least 1"))
	}
	if r.Expected < 0 || r.Expected > MaxMembers || r.Answered < 0 || r.Answered > r.Expected {
		errs = append(errs, fieldErr("data.answered", ErrInvalid, "%d of %d: want 0 to expected, expected 0 to %d", r.Answered, r.Expected, MaxMembers))
	}
	if r.MissingCount < len(r.Missing) || r.MissingCount > r.Expected || r.ErrorCount < len(r.Errors) || r.ErrorCount > r.Answered {
		errs = append(errs, fieldErr("data.missing_count", ErrInvalid, "missing %d (%d named), errors %d (%d named) of %d expected, %d answered",
			r.MissingCount, len(r.Missing), r.ErrorCount, len(r.Errors), r.Expected, r.Answered))
	}
	if len(r.Missing) > MaxListed {
		errs = append(errs, fieldErr("data.missing", ErrTooLarge, "%d entries, limit %d", len(r.Missing), MaxListed))
	}
	for i, m := range r.Missing {
		if err := validateMemberAt("data.missing", i, string(m)); err != nil {
			errs = append(errs, err)
			break
		}
	}
	if len(r.Errors) > MaxListed {
		errs = append(errs, fieldErr("data.errors", ErrTooLarge, "%d entries, limit %d", len(r.Errors), MaxListed))
	} else {
		errs = append(errs, validateMemberErrors("data.errors", r.Errors))
	}
	if r.HeldCalls < 0 || r.P50MS < 0 || r.MaxMS < r.P50MS {
		errs = append(errs, fieldErr("data.max_ms", ErrInvalid, "held calls %d, p50 %g ms, max %g ms", r.HeldCalls, r.P50MS, r.MaxMS))
	}
	return errors.Join(errs...)
}

func (r ResumeAcked) route() route {
	return route{run: r.Run, subject: r.CheckpointID, nats: ResumeAckedSubject(r.Run, r.Seq), seq: r.Seq, epoch: r.Epoch, hasSeq: true}
}
