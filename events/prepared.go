package events

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// TypePrepareAcked is the type of the bridge's record of what the sandbox
// daemons answered a prepare.
const TypePrepareAcked Type = "dev.stillpoint.prepare.acked.v1"

// PrepareAckedSubject returns sp.<run>.prepared.<seq>.<part>: part (from
// 1) of the record of the sandbox daemons' acks of prepare seq.
func PrepareAckedSubject(run string, seq uint64, part int) string {
	return SubjectPrefix + "." + run + ".prepared." + strconv.FormatUint(seq, 10) + "." + strconv.Itoa(part)
}

// PrepareAckedFilter returns sp.<run>.prepared.<seq>.>, every part of the
// record of prepare seq.
func PrepareAckedFilter(run string, seq uint64) string {
	return SubjectPrefix + "." + run + ".prepared." + strconv.FormatUint(seq, 10) + ".>"
}

// MaxRecordParts bounds the parts of one prepare's record.
const MaxRecordParts = 10000

// HeardAck is one sandbox daemon's prepare ack as the bridge heard it, in
// its record (PrepareAcked).
type HeardAck struct {
	// At is when the bridge heard it.
	At time.Time `json:"at"`
	// Ack is the ack, as the daemon sent it.
	Ack PrepareAck `json:"ack"`
}

// PrepareAcked is what the bridge heard of the sandbox daemons' acks of
// one prepare, in the stream (PROTOCOL §3): a daemon's prepare ack travels
// on core NATS (LiveAck), so that a fleet's prepare writes nothing per
// daemon, and this record keeps the audit log saying how many answered,
// who was not ready or failed, and who never answered (left out, or the
// prepare failed); how the daemons paused, as counts by kind of pause
// (Pauses); and, whole, the ack of every daemon that did not answer ok,
// ready and still (Acks, the first MaxListed). It comes in Parts events of
// at most a few hundred kilobytes, each with the same counts, lists and
// tallies and its own share of the acks. Members of other kinds store
// their prepare acks in the stream themselves.
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
	// Pauses counts the pause reports of the acks heard by kind of pause;
	// an ack without one (a sandbox with no launch) is not counted.
	Pauses []PauseTally `json:"pauses,omitempty"`
	// Part is this event's number, from 1, of Parts.
	Part  int `json:"part"`
	Parts int `json:"parts"`
	// Acks are this part's share of the notable acks heard, whole, in the
	// order heard: an ack not ok, not ready, or whose pause did not stand
	// still (PauseReport.Still); the first MaxListed of NotableCount, over
	// all parts.
	Acks         []HeardAck `json:"acks,omitempty"`
	NotableCount int        `json:"notable_count,omitempty"`
}

// PauseTally counts the sandbox daemons of one prepare that paused their
// launches alike (PrepareAcked.Pauses).
type PauseTally struct {
	// Mode, Frozen and Fallback (a launch fell back to stop and relaunch)
	// are the pause reports' (PauseReport).
	Mode     string `json:"mode"`
	Frozen   bool   `json:"frozen,omitempty"`
	Fallback bool   `json:"fallback,omitempty"`
	// Count is how many daemons paused so; Still whether such a pause
	// stands still (PauseReport.Still).
	Count int  `json:"count"`
	Still bool `json:"still"`
	// PIDsMin and PIDsMax bound the processes each paused.
	PIDsMin int `json:"pids_min"`
	PIDsMax int `json:"pids_max"`
	// TookMaxMS is the longest pause.
	TookMaxMS float64 `json:"took_max_ms,omitempty"`
}

// Notable tells whether a daemon's prepare ack is kept whole in its
// prepare's record: not ok, not ready, or a pause that did not stand
// still.
func (a PrepareAck) Notable() bool {
	return !a.OK || !a.Ready || a.Pause != nil && !a.Pause.Still()
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
	if r.Part < 1 || r.Parts < r.Part || r.Parts > MaxRecordParts {
		errs = append(errs, fieldErr("data.part", ErrInvalid, "part %d of %d: want 1 to parts, parts at most %d", r.Part, r.Parts, MaxRecordParts))
	}
	if len(r.Acks) > r.NotableCount || r.NotableCount > r.Answered {
		errs = append(errs, fieldErr("data.acks", ErrInvalid, "%d acks of %d notable, %d answered", len(r.Acks), r.NotableCount, r.Answered))
	}
	paused := 0
	for i, p := range r.Pauses {
		if p.Count < 1 || p.PIDsMin < 0 || p.PIDsMax < p.PIDsMin || p.TookMaxMS < 0 || len(p.Mode) > 64 {
			errs = append(errs, fieldErr(fmt.Sprintf("data.pauses[%d]", i), ErrInvalid, "%+v", p))
			break
		}
		paused += p.Count
	}
	if len(r.Pauses) > MaxListed || paused > r.Answered {
		errs = append(errs, fieldErr("data.pauses", ErrInvalid, "%d tallies of %d pauses, %d answered (at most %d tallies)", len(r.Pauses), paused, r.Answered, MaxListed))
	}
	for i, h := range r.Acks {
		field := fmt.Sprintf("data.acks[%d]", i)
		a := h.Ack
		switch {
		case h.At.IsZero():
			errs = append(errs, fieldErr(field+".at", ErrInvalid, "missing"))
		case a.Member.Kind() != KindSandbox:
			errs = append(errs, fieldErr(field+".ack.member", ErrInvalid, "%q is not a sandbox daemon", clip(string(a.Member))))
		case a.Run != r.Run || a.Seq != r.Seq || a.CheckpointID != r.CheckpointID:
			errs = append(errs, fieldErr(field+".ack", ErrMismatch, "answers %s seq %d of %s, the record is of %s seq %d of %s",
				clip(a.CheckpointID), a.Seq, clip(a.Run), r.CheckpointID, r.Seq, r.Run))
		default:
			if err := a.Validate(); err != nil {
				errs = append(errs, prefixField(field+".ack.", err))
			}
		}
		if len(errs) > 8 {
			break
		}
	}
	return errors.Join(errs...)
}

func (r PrepareAcked) route() route {
	return route{run: r.Run, subject: r.CheckpointID, nats: PrepareAckedSubject(r.Run, r.Seq, r.Part), seq: r.Seq, epoch: r.Epoch, hasSeq: true}
}
