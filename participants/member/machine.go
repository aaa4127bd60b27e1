package member

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

// State is a member's phase-machine state (PROTOCOL §5).
type State uint8

// The member states. Every transition the machine makes is listed in
// successors; anything else is refused with ErrTransition.
const (
	// StateIdle admits work; no checkpoint is open.
	StateIdle State = iota
	// StatePreparing has closed admission and waits for readiness.
	StatePreparing
	// StatePrepared is at a boundary and may commit.
	StatePrepared
	// StateCommitted has exported its records and created its manifest.
	StateCommitted
	// StateRestored has installed a checkpoint's records and waits for
	// resume.
	StateRestored
)

var stateNames = [...]string{"idle", "preparing", "prepared", "committed", "restored"}

// String returns the state's protocol name.
func (s State) String() string {
	if int(s) < len(stateNames) {
		return stateNames[s]
	}
	return fmt.Sprintf("State(%d)", uint8(s))
}

// Wire returns the state as an ack carries it.
func (s State) Wire() events.State { return events.State(s.String()) }

// successors lists the legal transitions (PROTOCOL §5): idle -prepare->
// preparing -ready-> prepared -commit-> committed; idle -restore->
// restored; any -resume-> idle.
var successors = map[State][]State{
	StateIdle:      {StatePreparing, StateRestored},
	StatePreparing: {StatePrepared, StateIdle},
	StatePrepared:  {StateCommitted, StateIdle},
	StateCommitted: {StateIdle},
	StateRestored:  {StateIdle},
}

// ErrTransition is returned (wrapped, naming both states) for a transition
// that successors does not list. The machine never makes one; seeing it
// means a bug, and the phase that caused it is answered CodeInternal.
var ErrTransition = errors.New("member: illegal transition")

// CheckTransition returns nil if from -> to is a legal transition, else an
// error wrapping ErrTransition that names both states.
func CheckTransition(from, to State) error {
	if slices.Contains(successors[from], to) {
		return nil
	}
	return fmt.Errorf("%w from %s to %s", ErrTransition, from, to)
}

// ResumedKept is how many resumed checkpoint ids a member remembers to
// refuse as stale (PROTOCOL §5, Fencing).
const ResumedKept = 64

// Input is something that happens to a member: a phase event, a worker's
// result, or the passing of time. Only this package's types implement it.
type Input interface{ input() }

// PhaseReceived is a decoded phase event.
type PhaseReceived struct{ Data events.PhaseEvent }

// LeaseTick asks the machine whether its lease has run out.
type LeaseTick struct{}

// ReadinessReported is a prepare wait's answer: the participant became
// ready, or the reply time came first, or Prepare failed.
type ReadinessReported struct {
	Op     uint64
	Report Report
	Err    error
}

// RecordsWritten says a commit's records are in the object store (Manifest
// describes them), or why not (Err).
type RecordsWritten struct {
	Op       uint64
	Manifest events.MemberManifest
	Err      *events.AckError
}

// ManifestCreated says the member manifest of a commit was created (or
// already existed with the same content), or why not.
type ManifestCreated struct {
	Op  uint64
	Err *events.AckError
}

// RestoreFinished says a restore installed its records (Restored are the
// next-attempt capture keys), or why not.
type RestoreFinished struct {
	Op       uint64
	Restored []string
	Err      *events.AckError
}

// CallFinished says a retire, forget or release call on the participant
// returned; Deleted is what a release deleted.
type CallFinished struct {
	Op      uint64
	Deleted []string
	Err     *events.AckError
}

// OutcomeReceived is a checkpoint.committed outcome seen on the bus.
type OutcomeReceived struct{ Committed events.CheckpointCommitted }

func (PhaseReceived) input()     {}
func (LeaseTick) input()         {}
func (ReadinessReported) input() {}
func (RecordsWritten) input()    {}
func (ManifestCreated) input()   {}
func (RestoreFinished) input()   {}
func (CallFinished) input()      {}
func (OutcomeReceived) input()   {}

// reasonResume is the Reopen reason of a resume phase (the one reopen that
// an ack follows).
const reasonResume = "resume"

// Effect is something the driver must do. Effects come in the order they
// must be done. Only this package's types implement it.
type Effect interface{ effect() }

// Reply answers the phase event with sequence Header.Seq: publish the ack
// once, then acknowledge the JetStream message.
type Reply struct {
	// Phase is the phase answered.
	Phase events.Phase
	// Header is the ack header (TookMS left zero).
	Header events.AckHeader
	body   func(events.AckHeader) events.Data
}

// Ack builds the ack payload, with TookMS from took.
func (r Reply) Ack(took time.Duration) events.Data {
	h := r.Header
	h.TookMS = max(took.Milliseconds(), 0)
	return r.body(h)
}

// Drop acknowledges the event with sequence Seq without answering it: it
// belongs to an older epoch or is not addressed to this member.
type Drop struct {
	Seq    uint64
	Reason string
}

// Supersede says a newer epoch has started without this member: stop
// everything, touch no shared state, leave the event with sequence Seq for
// whoever serves the new epoch.
type Supersede struct {
	Seq   uint64
	Epoch uint64
	Newer uint64
}

// WaitReady starts a prepare wait: call the participant's Prepare until it
// is ready or ReplyAt comes, then report ReadinessReported{Op}.
type WaitReady struct {
	Op         uint64
	Checkpoint Checkpoint
	ReplyAt    time.Time
}

// WriteCommit starts a commit: re-check readiness, refuse restarts in
// scope, export once, write the records and report RecordsWritten{Op}.
type WriteCommit struct {
	Op       uint64
	Commit   events.Commit
	Restarts []string
}

// CommitManifest creates the member manifest of commit Op, then reports
// ManifestCreated{Op}. The machine asks for it only while the commit is
// live, and the driver does it in the goroutine that handles resumes, so a
// resumed commit never gets a manifest (PROTOCOL §5).
type CommitManifest struct {
	Op       uint64
	Manifest events.MemberManifest
}

// InstallRestore starts a restore: read and verify the member's records,
// install them, and report RestoreFinished{Op}.
type InstallRestore struct {
	Op      uint64
	Restore events.Restore
}

// CallParticipant calls the participant's Retirer, Forgetter or Releaser
// for the phase in Data and reports CallFinished{Op}.
type CallParticipant struct {
	Op   uint64
	Data events.PhaseEvent
}

// Reopen ends the open checkpoint CheckpointID: cancel every handler of
// it and wait until each has stopped, drop what was exported for it, then
// reopen admission through the participant's Resumer.
type Reopen struct {
	CheckpointID string
	// Reason says why: "resume", "lease expired", "prepare failed",
	// "restore failed".
	Reason string
}

// Park asks the participant to park what it exported for the stop commit
// CheckpointID, best effort.
type Park struct{ CheckpointID string }

func (Reply) effect()           {}
func (Drop) effect()            {}
func (Supersede) effect()       {}
func (WaitReady) effect()       {}
func (WriteCommit) effect()     {}
func (CommitManifest) effect()  {}
func (InstallRestore) effect()  {}
func (CallParticipant) effect() {}
func (Reopen) effect()          {}
func (Park) effect()            {}

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
// recorded replies, the retire marks and the epoch. One goroutine owns it.
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

	marks        map[string]int
	marksVersion uint64

	epoch    uint64
	epochSet bool
	served   bool

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
		marks:      map[string]int{},
		prepares:   map[uint64]*op{},
		calls:      map[uint64]*op{},
		ops:        map[uint64]*op{},
	}
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
// driver must do, in order.
func (m *Machine) Step(now time.Time, in Input) []Effect {
	switch in := in.(type) {
	case PhaseReceived:
		return m.phase(now, in.Data)
	case LeaseTick:
		return m.tick(now)
	case ReadinessReported:
		return m.readiness(now, in)
	case RecordsWritten:
		return m.written(in)
	case ManifestCreated:
		return m.created(in)
	case RestoreFinished:
		return m.restored(in)
	case CallFinished:
		return m.called(in)
	case OutcomeReceived:
		return m.outcome(in.Committed)
	}
	return nil
}

func (m *Machine) phase(now time.Time, d events.PhaseEvent) []Effect {
	if d == nil {
		return nil
	}
	h, p := d.Header(), d.Phase()
	// PROTOCOL §5, Epochs fence zombies.
	if m.epochSet && h.Epoch < m.epoch {
		return []Effect{Drop{Seq: h.Seq, Reason: fmt.Sprintf("epoch %d is older than the member's %d", h.Epoch, m.epoch)}}
	}
	if m.epochSet && h.Epoch > m.epoch && m.served {
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
		return m.prepare(now, d)
	case events.Renew:
		return m.renew(d)
	case events.Commit:
		return m.commitPhase(now, d)
	case events.Resume:
		return m.resume(d)
	case events.Restore:
		return m.restorePhase(now, d)
	case events.Retire, events.Forget, events.Release:
		return m.outside(h, p, d)
	}
	return nil
}

// admit applies the fencing rules in the reference's order: stale, then
// conflict, then phase.
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

func (m *Machine) prepare(now time.Time, d events.Prepare) []Effect {
	h, p := d.PhaseHeader, events.PhasePrepare
	if eff := m.recorded(h, p); eff != nil {
		return eff
	}
	if e := m.admit(h, p, StateIdle, StatePreparing); e != nil {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, e)}
	}
	if m.restore != 0 {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, &events.AckError{Code: events.CodeInvalidPhase, Detail: "a restore of " + m.open + " is in progress"})}
	}
	if e := deadlinePassed(now, h, p); e != nil {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, e)}
	}
	if m.state == StateIdle {
		if e := m.transition(StatePreparing); e != nil {
			return []Effect{m.fail(p, h.Seq, h.CheckpointID, e)}
		}
		m.open = h.CheckpointID
		m.served = true
	}
	m.extendLease(h.Deadline)
	o := m.newOp(h.CheckpointID, p, h.Seq, d)
	m.prepares[o] = m.ops[o]
	return []Effect{WaitReady{
		Op:         o,
		Checkpoint: Checkpoint{Run: h.Run, ID: h.CheckpointID, Seq: h.Seq, Epoch: h.Epoch, Deadline: h.Deadline},
		ReplyAt:    ReplyAt(now, h.Deadline),
	}}
}

func (m *Machine) readiness(now time.Time, in ReadinessReported) []Effect {
	o, ok := m.prepares[in.Op]
	if !ok {
		return nil // cancelled by a resume or a lease expiry, already answered
	}
	delete(m.prepares, in.Op)
	delete(m.ops, in.Op)
	p, seq, id := events.PhasePrepare, o.seqs[0], o.id
	if in.Err != nil {
		e := &events.AckError{Code: events.CodeInternal, Detail: "prepare: " + in.Err.Error()}
		if m.open == id && m.state == StatePreparing {
			// A prepare that fails reopens admission, so that state and
			// admission never disagree (reference §1.3); the id is not fenced.
			out := m.reopen(id, false, "prepare failed", e)
			return append(out, m.fail(p, seq, id, e))
		}
		return []Effect{m.fail(p, seq, id, e)}
	}
	if eff := m.recorded(events.PhaseHeader{CheckpointID: id, Seq: seq}, p); eff != nil {
		return eff // another prepare of the same id got there first
	}
	if m.open != id || m.state != StatePreparing {
		return []Effect{m.fail(p, seq, id, &events.AckError{Code: events.CodeInvalidPhase, Detail: "state " + m.describe()})}
	}
	rep := in.Report
	if rep.Ready {
		if e := m.transition(StatePrepared); e != nil {
			return []Effect{m.fail(p, seq, id, e)}
		}
		m.restarts = slices.Clone(rep.Restarts)
		body := func(h events.AckHeader) events.Data {
			return events.PrepareAck{AckHeader: h, Ready: true, Restarts: slices.Clone(rep.Restarts), Counts: rep.Counts, Pause: rep.Pause}
		}
		m.replies[replyKey{id, p}] = body
		return []Effect{m.ok(p, seq, id, body)}
	}
	// Not ready by the reply time: admission stays closed, the blockers
	// are listed, nothing is recorded.
	return []Effect{m.ok(p, seq, id, func(h events.AckHeader) events.Data {
		a := events.PrepareAck{AckHeader: h, Restarts: slices.Clone(rep.Restarts), Counts: rep.Counts, Pause: rep.Pause}
		a.SetBlockers(rep.Blockers)
		return a
	})}
}

func (m *Machine) renew(d events.Renew) []Effect {
	h, p := d.PhaseHeader, events.PhaseRenew
	allowed := []State{StatePreparing, StatePrepared, StateCommitted, StateRestored}
	if m.restore != 0 && m.open == h.CheckpointID {
		allowed = append(allowed, StateIdle)
	}
	if e := m.admit(h, p, allowed...); e != nil {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, e)}
	}
	m.extendLease(h.Deadline)
	lease := m.lease
	return []Effect{m.ok(p, h.Seq, h.CheckpointID, func(h events.AckHeader) events.Data {
		return events.RenewAck{AckHeader: h, Lease: lease}
	})}
}

func sameEpisodes(a, b []events.Episode) bool {
	x, y := slices.Clone(a), slices.Clone(b)
	cmp := func(p, q events.Episode) int { return strings.Compare(p.String(), q.String()) }
	slices.SortFunc(x, cmp)
	slices.SortFunc(y, cmp)
	return slices.Equal(x, y)
}

func (m *Machine) commitPhase(now time.Time, d events.Commit) []Effect {
	h, p := d.PhaseHeader, events.PhaseCommit
	if eff := m.recorded(h, p); eff != nil {
		return eff
	}
	if e := m.admit(h, p, StatePrepared); e != nil {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, e)}
	}
	if m.commit != 0 {
		o := m.ops[m.commit]
		prev := o.data.(events.Commit)
		if prev.Stop != d.Stop || !sameEpisodes(prev.Scope, d.Scope) {
			return []Effect{m.fail(p, h.Seq, h.CheckpointID, &events.AckError{Code: events.CodeCheckpointConflict,
				Detail: fmt.Sprintf("checkpoint %s is already being committed with another scope or stop", h.CheckpointID)})}
		}
		m.extendLease(h.Deadline)
		o.seqs = append(o.seqs, h.Seq) // answered with the commit in flight
		return nil
	}
	m.extendLease(h.Deadline)
	if e := deadlinePassed(now, h, p); e != nil {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, e)}
	}
	m.commit = m.newOp(h.CheckpointID, p, h.Seq, d)
	return []Effect{WriteCommit{Op: m.commit, Commit: d, Restarts: slices.Clone(m.restarts)}}
}

func (m *Machine) written(in RecordsWritten) []Effect {
	if m.commit == 0 || m.commit != in.Op {
		return nil // the commit was resumed: its manifest is never created
	}
	if in.Err != nil {
		return m.finishCommit(in.Err)
	}
	m.ops[in.Op].manifest = in.Manifest
	return []Effect{CommitManifest{Op: in.Op, Manifest: in.Manifest}}
}

func (m *Machine) created(in ManifestCreated) []Effect {
	if m.commit == 0 || m.commit != in.Op {
		return nil
	}
	return m.finishCommit(in.Err)
}

// finishCommit answers every event waiting on the commit in flight: with
// e (the member stays prepared and a later commit tries again), or, when
// e is nil, with the manifest the op carries (the member is committed and
// the reply is recorded).
func (m *Machine) finishCommit(e *events.AckError) []Effect {
	o := m.ops[m.commit]
	delete(m.ops, m.commit)
	m.commit = 0
	p := events.PhaseCommit
	if e == nil {
		e = m.transition(StateCommitted)
	}
	var out []Effect
	if e != nil {
		for _, seq := range o.seqs {
			out = append(out, m.fail(p, seq, o.id, e))
		}
		return out
	}
	man := o.manifest
	body := func(h events.AckHeader) events.Data {
		mm := man
		mm.Episodes = slices.Clone(man.Episodes)
		return events.CommitAck{AckHeader: h, Manifest: &mm}
	}
	m.replies[replyKey{o.id, p}] = body
	if o.data.(events.Commit).Stop {
		m.stopCommit, m.parked = o.id, false
	}
	for _, seq := range o.seqs {
		out = append(out, m.ok(p, seq, o.id, body))
	}
	return out
}

func (m *Machine) resume(d events.Resume) []Effect {
	h, p := d.PhaseHeader, events.PhaseResume
	id := h.CheckpointID
	if m.resumedSet[id] {
		return []Effect{m.ok(p, h.Seq, id, nil)} // idempotent
	}
	if m.open == "" {
		// Never saw this id (a prepare that never reached us): fence it
		// anyway, so a late prepare cannot close admission.
		m.fence(id)
		return []Effect{m.ok(p, h.Seq, id, nil)}
	}
	if m.open != id {
		return []Effect{m.fail(p, h.Seq, id, &events.AckError{Code: events.CodeCheckpointConflict,
			Detail: fmt.Sprintf("checkpoint %s is open (state %s)", m.open, m.describe())})}
	}
	out := m.reopen(id, true, reasonResume, nil)
	return append(out, m.ok(p, h.Seq, id, nil))
}

// reopen ends the open checkpoint id: every event waiting on one of its
// handlers is answered (with cause, or stale_checkpoint), the id is fenced
// and its recorded replies dropped if fence is set, and the member is idle.
func (m *Machine) reopen(id string, fence bool, reason string, cause *events.AckError) []Effect {
	out := []Effect{Reopen{CheckpointID: id, Reason: reason}}
	var waiting []*op
	for _, k := range m.sortedOps() {
		o := m.ops[k]
		if o.id == id && (o.phase == events.PhasePrepare || o.phase == events.PhaseCommit || o.phase == events.PhaseRestore) {
			waiting = append(waiting, o)
			delete(m.ops, k)
			delete(m.prepares, k)
			if m.commit == k {
				m.commit = 0
			}
			if m.restore == k {
				m.restore = 0
			}
		}
	}
	if fence {
		m.fence(id)
		for k := range m.replies {
			if k.id == id {
				delete(m.replies, k)
			}
		}
	}
	if m.state != StateIdle {
		m.state = StateIdle // every state may resume (successors)
	}
	m.open, m.lease, m.restarts, m.stopCommit, m.parked = "", time.Time{}, nil, "", false
	e := cause
	if e == nil {
		e = &events.AckError{Code: events.CodeStaleCheckpoint, Detail: fmt.Sprintf("checkpoint %s ended (%s) while this phase ran", id, reason)}
	}
	for _, o := range waiting {
		for _, seq := range o.seqs {
			out = append(out, m.fail(o.phase, seq, o.id, e))
		}
	}
	return out
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

func (m *Machine) restorePhase(now time.Time, d events.Restore) []Effect {
	h, p := d.PhaseHeader, events.PhaseRestore
	if eff := m.recorded(h, p); eff != nil {
		return eff
	}
	if m.restore != 0 && m.open == h.CheckpointID {
		o := m.ops[m.restore]
		prev := o.data.(events.Restore)
		if prev.Source != d.Source || !sameEpisodes(prev.Scope, d.Scope) {
			return []Effect{m.fail(p, h.Seq, h.CheckpointID, &events.AckError{Code: events.CodeCheckpointConflict,
				Detail: fmt.Sprintf("restore %s is already running from %s with another scope", h.CheckpointID, prev.Source)})}
		}
		m.extendLease(h.Deadline)
		o.seqs = append(o.seqs, h.Seq)
		return nil
	}
	if e := m.admit(h, p, StateIdle); e != nil {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, e)}
	}
	if m.served {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, &events.AckError{Code: events.CodeInvalidPhase,
			Detail: "restore needs a member that has not served a phase"})}
	}
	if e := deadlinePassed(now, h, p); e != nil {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, e)}
	}
	m.open = h.CheckpointID
	m.extendLease(h.Deadline)
	m.restore = m.newOp(h.CheckpointID, p, h.Seq, d)
	return []Effect{InstallRestore{Op: m.restore, Restore: d}}
}

func (m *Machine) restored(in RestoreFinished) []Effect {
	if m.restore == 0 || m.restore != in.Op {
		return nil
	}
	o := m.ops[m.restore]
	delete(m.ops, m.restore)
	m.restore = 0
	p := events.PhaseRestore
	d := o.data.(events.Restore)
	e := in.Err
	if e == nil {
		e = m.transition(StateRestored)
	}
	if e != nil {
		// All or none: admission reopens, the member stays fresh and idle.
		out := m.reopen(o.id, false, "restore failed", e)
		for _, seq := range o.seqs {
			out = append(out, m.fail(p, seq, o.id, e))
		}
		return out
	}
	m.served = true
	keys := slices.Clone(in.Restored)
	slices.Sort(keys)
	body := func(h events.AckHeader) events.Data {
		return events.RestoreAck{AckHeader: h, Source: d.Source, Restored: slices.Clone(keys)}
	}
	m.replies[replyKey{o.id, p}] = body
	var out []Effect
	for _, seq := range o.seqs {
		out = append(out, m.ok(p, seq, o.id, body))
	}
	return out
}

// outside handles retire, forget and release: allowed only while no
// checkpoint is open (idle, or restored and not yet resumed).
func (m *Machine) outside(h events.PhaseHeader, p events.Phase, d events.PhaseEvent) []Effect {
	if m.restore != 0 || (m.state != StateIdle && m.state != StateRestored) {
		return []Effect{m.fail(p, h.Seq, h.CheckpointID, &events.AckError{Code: events.CodeInvalidPhase,
			Detail: fmt.Sprintf("%s is not valid in state %s; resume first", p, m.describe())})}
	}
	if m.state == StateRestored {
		m.extendLease(h.Deadline)
	}
	switch d := d.(type) {
	case events.Retire:
		// Mark first, then stop the work: a request sent before the retire
		// and arriving after it is refused (reference §1.3).
		for _, ep := range d.Episodes {
			if mark, ok := m.marks[ep.Rollout]; !ok || ep.Attempt > mark {
				m.marks[ep.Rollout] = ep.Attempt
			}
		}
		m.marksVersion++
		m.served = true
	case events.Forget:
		for _, r := range d.Rollouts {
			delete(m.marks, r)
		}
		m.marksVersion++
	}
	o := m.newOp(h.CheckpointID, p, h.Seq, d)
	m.calls[o] = m.ops[o]
	return []Effect{CallParticipant{Op: o, Data: d}}
}

func (m *Machine) called(in CallFinished) []Effect {
	o, ok := m.calls[in.Op]
	if !ok {
		return nil
	}
	delete(m.calls, in.Op)
	delete(m.ops, in.Op)
	seq := o.seqs[0]
	if in.Err != nil {
		return []Effect{m.fail(o.phase, seq, o.id, in.Err)}
	}
	if o.phase == events.PhaseRelease {
		deleted := slices.Clone(in.Deleted)
		return []Effect{m.ok(o.phase, seq, o.id, func(h events.AckHeader) events.Data {
			return events.ReleaseAck{AckHeader: h, Deleted: deleted}
		})}
	}
	return []Effect{m.ok(o.phase, seq, o.id, nil)}
}

func (m *Machine) tick(now time.Time) []Effect {
	if m.lease.IsZero() || now.Before(m.lease) || m.open == "" {
		return nil
	}
	// The bridge is gone: resume by ourselves (PROTOCOL §5, Lease).
	return m.reopen(m.open, true, "lease expired", nil)
}

func (m *Machine) outcome(c events.CheckpointCommitted) []Effect {
	if m.state != StateCommitted || m.stopCommit == "" || m.stopCommit != c.CheckpointID || m.parked {
		return nil
	}
	if !events.Includes(c.Members, m.self) {
		return nil
	}
	m.parked = true
	return []Effect{Park{CheckpointID: c.CheckpointID}}
}
