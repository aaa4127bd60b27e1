package member

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

type replyKey struct {
	id    string
	phase events.Phase
}

// op is a phase event whose answer waits on a worker.
type op struct {
	id    string
	phase events.Phase
	seqs  []uint64 // every event the answer goes to (duplicates attach)
	data  events.Data

	manifest events.MemberManifest // a commit's, once written
}

// Machine is a member's phase machine: pure, no I/O, time passed in. It
// holds the state, the open checkpoint, the lease, the fences, the
// recorded replies, what each open checkpoint exported, the retire marks,
// the epoch and whether a newer one superseded the member. One goroutine
// owns it; the driver publishes what others read (Marks) from there.
type Machine struct {
	run   string
	self  events.Member
	grace time.Duration

	state    State
	open     string // open checkpoint (or in-flight restore) id
	lease    time.Time
	restarts []string // from the prepare report that made the member prepared

	resumed    []string
	resumedSet map[string]bool
	replies    map[replyKey]func(events.AckHeader) events.Data

	exports map[string]Export // checkpoint id -> its one export

	marks        map[string]int
	marksVersion uint64

	epoch      uint64
	epochSet   bool
	served     bool
	superseded bool

	lastOp   uint64
	prepares map[uint64]*op
	commit   uint64 // op of the commit in flight, 0 if none
	restore  uint64 // op of the restore in flight, 0 if none
	calls    map[uint64]*op
	ops      map[uint64]*op

	stopCommit string // checkpoint committed with stop, waiting for its outcome
	parked     bool
}

// NewMachine returns an idle machine for member self of run; grace is the
// lease grace (PROTOCOL §5, Lease).
func NewMachine(run string, self events.Member, grace time.Duration) *Machine {
	return &Machine{
		run:        run,
		self:       self,
		grace:      grace,
		resumedSet: map[string]bool{},
		replies:    map[replyKey]func(events.AckHeader) events.Data{},
		exports:    map[string]Export{},
		marks:      map[string]int{},
		prepares:   map[uint64]*op{},
		calls:      map[uint64]*op{},
		ops:        map[uint64]*op{},
	}
}

// Adopt makes the member one that has served epoch: a sandbox daemon a
// restore adopts (Config.AdoptEpoch). Call it before the first Step.
func (m *Machine) Adopt(epoch uint64) {
	m.epoch, m.epochSet, m.served = epoch, true, true
}

// State returns the current state.
func (m *Machine) State() State { return m.state }

// Open returns the id of the open checkpoint (or of the restore in
// flight), "" when none.
func (m *Machine) Open() string { return m.open }

// Lease returns when the lease runs out; zero when there is none.
func (m *Machine) Lease() time.Time { return m.lease }

// Epoch returns the epoch the member serves and whether it has one yet.
func (m *Machine) Epoch() (uint64, bool) { return m.epoch, m.epochSet }

// Served reports whether the member has served a phase: prepared, restored
// or retired. A member that has not can still be restored into.
func (m *Machine) Served() bool { return m.served }

// Resumed reports whether id is fenced as resumed.
func (m *Machine) Resumed(id string) bool { return m.resumedSet[id] }

// Superseded reports whether a phase of a newer epoch superseded the
// member (PROTOCOL §5, Epochs fence zombies); the machine then ignores
// every input.
func (m *Machine) Superseded() bool { return m.superseded }

// Exported returns what checkpoint id exported, while it is open.
func (m *Machine) Exported(id string) (Export, bool) {
	ex, ok := m.exports[id]
	return ex, ok
}

// Marks returns a copy of the retire marks: rollout -> highest retired
// attempt.
func (m *Machine) Marks() map[string]int { return maps.Clone(m.marks) }

// MarksVersion changes whenever the retire marks do.
func (m *Machine) MarksVersion() uint64 { return m.marksVersion }

// Admit returns an error wrapping ErrStaleAttempt if ep's attempt is at or
// below its rollout's retire mark.
func (m *Machine) Admit(ep events.Episode) error { return checkMark(m.marks, ep) }

func checkMark(marks map[string]int, ep events.Episode) error {
	if mark, ok := marks[ep.Rollout]; ok && ep.Attempt <= mark {
		return fmt.Errorf("%w: %s: rollout %s is retired up to attempt %d", ErrStaleAttempt, ep, ep.Rollout, mark)
	}
	return nil
}

// Step feeds one input to the machine at time now and returns what the
// driver must do, in order. Once the member is superseded it returns no
// effects and an error wrapping ErrSuperseded; an input it does not know
// (nil) returns ErrUnknownInput.
func (m *Machine) Step(now time.Time, in Input) ([]Effect, error) {
	if m.superseded {
		return nil, fmt.Errorf("%w: %T ignored", ErrSuperseded, in)
	}
	if in == nil {
		return nil, ErrUnknownInput
	}
	return m.step(now, in), nil
}

func (m *Machine) step(now time.Time, in Input) []Effect {
	switch in := in.(type) {
	case PhaseReceived:
		return m.phase(now, in.Data, in.BeforeStart)
	case LeaseTick:
		return m.tick(now)
	case ReadinessReported:
		return m.readiness(now, in)
	case RecordsWritten:
		return m.written(in)
	case RestoreFinished:
		return m.restored(in)
	case CallFinished:
		return m.called(in)
	case OutcomeReceived:
		return m.outcome(in.Committed)
	case PhasesMissed:
		return m.missed(in)
	}
	return nil
}

func (m *Machine) phase(now time.Time, d events.PhaseEvent, beforeStart bool) []Effect {
	if d == nil {
		return nil
	}
	h, p := d.Header(), d.Phase()
	// PROTOCOL §5, Epochs fence zombies.
	if m.epochSet && h.Epoch < m.epoch {
		return []Effect{Drop{Seq: h.Seq, Reason: fmt.Sprintf("epoch %d is older than the member's %d", h.Epoch, m.epoch)}}
	}
	if m.epochSet && h.Epoch > m.epoch && m.served {
		m.superseded = true
		return []Effect{Supersede{Seq: h.Seq, Epoch: m.epoch, Newer: h.Epoch}}
	}
	if !h.Names(m.self) {
		return []Effect{Drop{Seq: h.Seq, Reason: "not addressed to this member"}}
	}
	if !m.epochSet || h.Epoch > m.epoch {
		m.epoch, m.epochSet = h.Epoch, true
	}
	switch d := d.(type) {
	case events.Prepare:
		return m.prepare(now, d, beforeStart)
	case events.Renew:
		return m.renew(d)
	case events.Commit:
		return m.commitPhase(now, d)
	case events.Resume:
		return m.resume(d)
	case events.Restore:
		return m.restorePhase(now, d)
	case events.Retire, events.Forget, events.Release:
		return m.outside(h, p, d, beforeStart)
	case events.Branch:
		return m.branchPhase(h, d, beforeStart)
	}
	return nil
}

// admit applies the fencing rules in PROTOCOL §5's order (Fencing):
// stale, then conflict, then phase.
func (m *Machine) admit(h events.PhaseHeader, p events.Phase, allowed ...State) *events.AckError {
	if m.resumedSet[h.CheckpointID] {
		return &events.AckError{Code: events.CodeStaleCheckpoint, Detail: fmt.Sprintf("checkpoint %s was already resumed", h.CheckpointID)}
	}
	if m.open != "" && m.open != h.CheckpointID {
		return &events.AckError{Code: events.CodeCheckpointConflict, Detail: fmt.Sprintf("checkpoint %s is open (state %s)", m.open, m.describe())}
	}
	if !slices.Contains(allowed, m.state) {
		return &events.AckError{Code: events.CodeInvalidPhase, Detail: fmt.Sprintf("%s is not valid in state %s", p, m.describe())}
	}
	return nil
}

func (m *Machine) describe() string {
	if m.restore != 0 {
		return m.state.String() + ", restoring"
	}
	return m.state.String()
}

func (m *Machine) extendLease(deadline time.Time) {
	if l := deadline.Add(m.grace); l.After(m.lease) {
		m.lease = l
	}
}

func (m *Machine) transition(to State) *events.AckError {
	if err := CheckTransition(m.state, to); err != nil {
		return &events.AckError{Code: events.CodeInternal, Detail: err.Error()}
	}
	m.state = to
	return nil
}

func (m *Machine) newOp(id string, p events.Phase, seq uint64, d events.Data) uint64 {
	m.lastOp++
	o := &op{id: id, phase: p, seqs: []uint64{seq}, data: d}
	m.ops[m.lastOp] = o
	return m.lastOp
}

func (m *Machine) header(seq uint64, id string) events.AckHeader {
	return events.AckHeader{Run: m.run, Member: m.self, Seq: seq, CheckpointID: id, Epoch: m.epoch, OK: true, State: m.state.Wire()}
}

func (m *Machine) ok(p events.Phase, seq uint64, id string, body func(events.AckHeader) events.Data) Reply {
	if body == nil {
		body = bare(p)
	}
	return Reply{Phase: p, Header: m.header(seq, id), body: body}
}

func (m *Machine) fail(p events.Phase, seq uint64, id string, e *events.AckError) Reply {
	h := m.header(seq, id)
	h.Fail(e.Code, e.Detail)
	return Reply{Phase: p, Header: h, body: bare(p)}
}

// bare builds the ack of phase p with nothing but its header.
func bare(p events.Phase) func(events.AckHeader) events.Data {
	return func(h events.AckHeader) events.Data {
		switch p {
		case events.PhasePrepare:
			return events.PrepareAck{AckHeader: h}
		case events.PhaseRenew:
			return events.RenewAck{AckHeader: h}
		case events.PhaseCommit:
			return events.CommitAck{AckHeader: h}
		case events.PhaseResume:
			return events.ResumeAck{AckHeader: h}
		case events.PhaseRestore:
			return events.RestoreAck{AckHeader: h}
		case events.PhaseRetire:
			return events.RetireAck{AckHeader: h}
		case events.PhaseForget:
			return events.ForgetAck{AckHeader: h}
		case events.PhaseBranch:
			return events.BranchAck{AckHeader: h}
		default:
			return events.ReleaseAck{AckHeader: h}
		}
	}
}

func (m *Machine) recorded(h events.PhaseHeader, p events.Phase) []Effect {
	if body, ok := m.replies[replyKey{h.CheckpointID, p}]; ok {
		return []Effect{m.ok(p, h.Seq, h.CheckpointID, body)}
	}
	return nil
}

func deadlinePassed(now time.Time, h events.PhaseHeader, p events.Phase) *events.AckError {
	if now.Before(h.Deadline) {
		return nil
	}
	return &events.AckError{Code: events.CodeDeadlineExceeded, Detail: fmt.Sprintf("%s deadline %s passed before the member handled it", p, h.Deadline.UTC().Format(time.RFC3339Nano))}
}

// ReplyAt is when a prepare that is not ready answers: a little before the
// deadline, deadline − min(1 s, a tenth of the time left), so that the
// bridge can name the blockers.
func ReplyAt(now, deadline time.Time) time.Time {
	left := deadline.Sub(now)
	if left <= 0 {
		return deadline
	}
	return deadline.Add(-min(time.Second, left/10))
}

func sameEpisodes(a, b []events.Episode) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	cmp := func(p, q events.Episode) int { return strings.Compare(p.String(), q.String()) }
	slices.SortFunc(x, cmp)
	slices.SortFunc(y, cmp)
	return slices.Equal(x, y)
}

func (m *Machine) sortedOps() []uint64 {
	keys := make([]uint64, 0, len(m.ops))
	for k := range m.ops {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func (m *Machine) fence(id string) {
	if m.resumedSet[id] {
		return
	}
	m.resumed = append(m.resumed, id)
	m.resumedSet[id] = true
	for len(m.resumed) > ResumedKept {
		delete(m.resumedSet, m.resumed[0])
		m.resumed = m.resumed[1:]
	}
}
