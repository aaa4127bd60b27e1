package machine

import (
	"fmt"
	"sort"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

// Verdict is what a tally decides about one phase.
type Verdict int

// The verdicts.
const (
	// Waiting: some members have not answered and nothing failed yet.
	Waiting Verdict = iota
	// Complete: every member answered ok (and, for prepare, ready).
	Complete
	// Failed: a member failed, was not ready, died, or the deadline passed.
	Failed
)

var verdictNames = [...]string{"waiting", "complete", "failed"}

// String returns the verdict's name.
func (v Verdict) String() string {
	if int(v) < len(verdictNames) {
		return verdictNames[v]
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// Tally is the pure core of ack gathering for one phase event: it is told
// the acks and deaths it sees and the time, and decides. It does no I/O.
type Tally struct {
	phase    events.Phase
	seq      uint64
	epoch    uint64
	ckpt     string
	deadline time.Time
	expected map[events.Member]bool
	acks     map[events.Member]events.Ack
	dead     map[events.Member]bool
	ignored  int
	repeats  int // second acks of a member that answered
	failed   int // acks not OK
	notReady int // OK prepare acks not ready

	// WaitAll keeps waiting for every answer (or the deadline, or a death)
	// after an ack failed, instead of failing at once.
	WaitAll bool
}

// NewTally starts the tally of the phase event p expecting every member of
// its member set to answer.
func NewTally(phase events.Phase, h events.PhaseHeader) *Tally {
	t := &Tally{phase: phase, seq: h.Seq, epoch: h.Epoch, ckpt: h.CheckpointID, deadline: h.Deadline,
		expected: map[events.Member]bool{}, acks: map[events.Member]events.Ack{}, dead: map[events.Member]bool{}}
	for _, m := range expected(h) {
		t.expected[m] = true
	}
	return t
}

// Add records an ack. It returns false, and counts it as ignored, for an
// ack that does not answer this phase event: another phase, sequence,
// checkpoint or epoch, or a member outside the set. A second ack of a
// member keeps the first and returns false too, counted as a repeat, not
// ignored: a sandbox daemon sends its prepare ack again when asked whether
// it is there (PROTOCOL §3), and the server refuses repeats of a stored one.
func (t *Tally) Add(ack events.Ack) bool {
	h := ack.Header()
	if ack.Answers() != t.phase || h.Seq != t.seq || h.CheckpointID != t.ckpt || h.Epoch != t.epoch || !t.expected[h.Member] {
		t.ignored++
		return false
	}
	if _, dup := t.acks[h.Member]; dup {
		t.repeats++
		return false
	}
	t.acks[h.Member] = ack
	if !h.OK {
		t.failed++
	} else if !ackOK(ack) {
		t.notReady++
	}
	return true
}

// Dead records that a member's heartbeat expired or it left.
func (t *Tally) Dead(m events.Member) {
	if t.expected[m] {
		if _, answered := t.acks[m]; !answered {
			t.dead[m] = true
		}
	}
}

// Excusable tells whether a member that dies or leaves during this phase
// may be left out instead of failing it: a sandbox daemon. Its sandbox
// stops when its session ends (the owner deletes its heartbeat then, and a
// session may end just as a phase starts), and nothing depends on the
// daemon itself: its agent is ready only once the daemon acked the pause
// or the launch is confirmed stopped, and its files are snapshotted by the
// owner from outside. A daemon that is alive and not ready still blocks.
func (t *Tally) Excusable(m events.Member) bool {
	return m.Kind() == events.KindSandbox
}

// Excuse leaves an expected member that has not answered out of the
// phase; see Excusable.
func (t *Tally) Excuse(m events.Member) {
	if _, answered := t.acks[m]; t.expected[m] && !answered {
		delete(t.expected, m)
	}
}

// Expects reports whether m is expected to answer: in the phase's member
// set and not excused.
func (t *Tally) Expects(m events.Member) bool { return t.expected[m] }

// Silent returns the expected members of kind that have not answered and
// are not dead, sorted.
func (t *Tally) Silent(kind events.MemberKind) []events.Member {
	var out []events.Member
	for m := range t.expected {
		if _, answered := t.acks[m]; !answered && !t.dead[m] && m.Kind() == kind {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// Ignored counts the acks Add refused as not answering this phase.
func (t *Tally) Ignored() int { return t.ignored }

// Answered tells whether member m's ack was counted.
func (t *Tally) Answered(m events.Member) bool {
	_, ok := t.acks[m]
	return ok
}

// Repeats counts the second acks of members that had answered.
func (t *Tally) Repeats() int { return t.repeats }

// Members returns the members expected to answer (the phase's member set
// less those excused), sorted.
func (t *Tally) Members() []events.Member {
	members := make([]events.Member, 0, len(t.expected))
	for m := range t.expected {
		members = append(members, m)
	}
	sort.Slice(members, func(i, j int) bool { return members[i] < members[j] })
	return members
}

// Acks returns the acks so far, by member.
func (t *Tally) Acks() map[events.Member]events.Ack { return t.acks }

// Decide returns the verdict at now: Failed at once on a failed ack or a
// dead member; otherwise Waiting until every member answered (then
// Complete if all are ok and ready, else Failed) or the deadline passed.
// A not-ready prepare ack does not end the wait early, so that the outcome
// can name the blockers of every member.
func (t *Tally) Decide(now time.Time) Verdict {
	switch {
	case t.failed > 0 && !t.WaitAll, len(t.dead) > 0:
		return Failed
	case len(t.acks) == len(t.expected) && t.failed+t.notReady == 0:
		return Complete
	case len(t.acks) == len(t.expected), !now.Before(t.deadline):
		return Failed
	}
	return Waiting
}

// Failure describes why the phase failed: every member that failed, was
// not ready (with its blockers), died or never answered.
func (t *Tally) Failure(now time.Time) (errs []events.MemberError, blockers map[events.Member][]string, counts map[events.Member]int) {
	blockers, counts = map[events.Member][]string{}, map[events.Member]int{}
	members := make([]events.Member, 0, len(t.expected))
	for m := range t.expected {
		members = append(members, m)
	}
	sort.Slice(members, func(i, j int) bool { return members[i] < members[j] })
	for _, m := range members {
		ack, answered := t.acks[m]
		switch {
		case t.dead[m]:
			errs = append(errs, events.MemberError{Member: m, Code: "member_dead", Detail: "heartbeat expired or member left before answering"})
		case !answered && now.Before(t.deadline):
			errs = append(errs, events.MemberError{Member: m, Code: "unanswered", Detail: "had not answered when the phase failed"})
		case !answered:
			errs = append(errs, events.MemberError{Member: m, Code: events.CodeMissingAck, Detail: "no ack by the deadline " + t.deadline.Format(time.RFC3339)})
		default:
			h := ack.Header()
			if h.Error != nil {
				errs = append(errs, events.MemberError{Member: m, Code: h.Error.Code, Detail: h.Error.Detail})
			}
			if p, ok := ack.(events.PrepareAck); ok && !p.Ready {
				blockers[m] = p.Blockers
				counts[m] = p.BlockerCount
				if h.Error == nil {
					errs = append(errs, events.MemberError{Member: m, Code: "not_ready",
						Detail: fmt.Sprintf("%d blockers", p.BlockerCount)})
				}
			}
		}
	}
	return errs, blockers, counts
}

func ackOK(ack events.Ack) bool {
	if !ack.Header().OK {
		return false
	}
	if p, ok := ack.(events.PrepareAck); ok {
		return p.Ready
	}
	return true
}
