package events

import (
	"errors"
	"fmt"
	"strconv"
)

// TypePrepareAcked is the type of the bridge's record of what the sandbox
// daemons answered a prepare.
const TypePrepareAcked Type = "dev.stillpoint.prepare.acked.v1"

// PrepareAckedSubject returns sp.<run>.prepared.<seq>: the record of the
// sandbox daemons' acks of prepare seq.
func PrepareAckedSubject(run string, seq uint64) string {
	return SubjectPrefix + "." + run + ".prepared." + strconv.FormatUint(seq, 10)
}

// PrepareAcked is what the bridge heard of the sandbox daemons' acks of
// one prepare, in the stream (PROTOCOL §3): a daemon's prepare ack travels
// on core NATS (LiveAck), so that a fleet's prepare writes nothing per
// daemon, and this one event keeps the audit log saying how many answered,
// who was not ready or failed, and who never answered (left out, or the
// prepare failed). Members of other kinds store their acks, as before.
type PrepareAcked struct {
	// Run is the run id.
	Run string `json:"run"`
	// CheckpointID is the checkpoint the prepare asked.
	CheckpointID string `json:"checkpoint_id"`
	// Seq and Epoch are the prepare's.
	Seq   uint64 `json:"seq"`
	Epoch uint64 `json:"epoch"`
	// Expected is how many sandbox daemons the prepare addressed (its
	// roster); Answered how many of them the bridge heard while it
	// gathered the prepare's acks.
	Expected int `json:"expected"`
	Answered int `json:"answered"`
	// Ready counts the answers that were ok and ready.
	Ready int `json:"ready"`
	// Missing names the first MaxListed daemons not heard, of
	// MissingCount.
	Missing      []Member `json:"missing,omitempty"`
	MissingCount int      `json:"missing_count,omitempty"`
	// NotReady names the first MaxListed daemons that answered ok but not
	// ready, of NotReadyCount.
	NotReady      []Member `json:"not_ready,omitempty"`
	NotReadyCount int      `json:"not_ready_count,omitempty"`
	// Errors names the first MaxListed daemons that answered with an
	// error, of ErrorCount.
	Errors     []MemberError `json:"errors,omitempty"`
	ErrorCount int           `json:"error_count,omitempty"`
	// P50MS and MaxMS are the acks' latencies from the prepare's publish,
	// as the bridge heard them, in milliseconds.
	P50MS float64 `json:"p50_ms,omitempty"`
	MaxMS float64 `json:"max_ms,omitempty"`
}

// Type implements Data.
func (PrepareAcked) Type() Type { return TypePrepareAcked }

// Validate implements Data.
func (r PrepareAcked) Validate() error {
	var errs []error
	errs = append(errs, prefixField("data.", errors.Join(ValidateRun(r.Run), ValidateCheckpointID(r.CheckpointID))))
	if r.Seq == 0 {
		errs = append(errs, fieldErr("data.seq", ErrInvalid, "must be at least 1"))
	}
	if r.Expected < 0 || r.Expected > MaxMembers || r.Answered < 0 || r.Answered > r.Expected {
		errs = append(errs, fieldErr("data.answered", ErrInvalid, "%d of %d: want 0 to expected, expected 0 to %d", r.Answered, r.Expected, MaxMembers))
	}
	if r.Ready < 0 || r.NotReadyCount < 0 || r.ErrorCount < 0 || r.Ready+r.NotReadyCount+r.ErrorCount != r.Answered {
		errs = append(errs, fieldErr("data.ready", ErrInvalid, "ready %d, not ready %d and errors %d do not add up to the %d answered",
			r.Ready, r.NotReadyCount, r.ErrorCount, r.Answered))
	}
	if r.MissingCount < len(r.Missing) || r.MissingCount != r.Expected-r.Answered ||
		r.NotReadyCount < len(r.NotReady) || r.ErrorCount < len(r.Errors) {
		errs = append(errs, fieldErr("data.missing_count", ErrInvalid, "missing %d (%d named) of %d expected and %d answered, not ready %d (%d named), errors %d (%d named)",
			r.MissingCount, len(r.Missing), r.Expected, r.Answered, r.NotReadyCount, len(r.NotReady), r.ErrorCount, len(r.Errors)))
	}
	for _, l := range []struct {
		field string
		ms    []Member
	}{{"data.missing", r.Missing}, {"data.not_ready", r.NotReady}} {
		if len(l.ms) > MaxListed {
			errs = append(errs, fieldErr(l.field, ErrTooLarge, "%d entries, limit %d", len(l.ms), MaxListed))
			continue
		}
		for i, m := range l.ms {
			if err := validateMember(fmt.Sprintf("%s[%d]", l.field, i), string(m)); err != nil {
				errs = append(errs, err)
				break
			}
		}
	}
	if len(r.Errors) > MaxListed {
		errs = append(errs, fieldErr("data.errors", ErrTooLarge, "%d entries, limit %d", len(r.Errors), MaxListed))
	} else {
		errs = append(errs, validateMemberErrors("data.errors", r.Errors))
	}
	if r.P50MS < 0 || r.MaxMS < r.P50MS {
		errs = append(errs, fieldErr("data.max_ms", ErrInvalid, "p50 %g ms, max %g ms", r.P50MS, r.MaxMS))
	}
	return errors.Join(errs...)
}

func (r PrepareAcked) route() route {
	return route{run: r.Run, subject: r.CheckpointID, nats: PrepareAckedSubject(r.Run, r.Seq), seq: r.Seq, epoch: r.Epoch, hasSeq: true}
}
