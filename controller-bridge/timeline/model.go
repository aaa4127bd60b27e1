package timeline

import (
	"cmp"
	"slices"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

// Event is one event of a run as the stream holds it: its stream sequence,
// the time the stream stored it, its sender and its decoded payload (nil
// when it did not decode). Entry converts to it.
type Event struct {
	StreamSeq uint64
	Time      time.Time
	Source    string
	Data      events.Data
}

// Kind says what an operation is, named for the phase that opens it.
type Kind string

// The operation kinds. KindUnknown is an id whose opening phase is not on
// the stream (it aged out, or only acks of it were read).
const (
	KindCheckpoint Kind = "checkpoint"
	KindRestore    Kind = "restore"
	KindRelease    Kind = "release"
	KindRetire     Kind = "retire"
	KindForget     Kind = "forget"
	KindBranch     Kind = "branch"
	KindUnknown    Kind = "unknown"
)

// Status is where an operation stands.
type Status string

// The operation statuses. Retire and forget publish no outcome: they are
// completed once every member they name acked ok, failed once one failed.
const (
	StatusOpen      Status = "open"
	StatusCommitted Status = "committed"
	StatusCompleted Status = "completed"
	StatusFailed    Status = "failed"
)

// AckStatus is what one member answered one phase.
type AckStatus string

// The ack statuses. Missing is a member the phase named that had not
// answered when the phase was over (a later phase or the outcome followed
// it, or its deadline passed); pending one that may still answer.
const (
	AckOK       AckStatus = "ok"
	AckNotReady AckStatus = "not_ready"
	AckError    AckStatus = "error"
	AckMissing  AckStatus = "missing"
	AckPending  AckStatus = "pending"
	// AckUnknown: the bridge's record of a resume's acks (which are not
	// stored) names only the first events.MaxListed silent members, and
	// this one is not among them: it may have answered or not.
	AckUnknown AckStatus = "unknown"
)

// Op is one checkpoint or operation (restore, release, retire, forget) of
// a run: its phases in order and its outcome.
type Op struct {
	// ID is the checkpoint or operation id.
	ID   string `json:"id"`
	Kind Kind   `json:"kind"`
	// Epoch is the epoch of the operation's first phase; a restore's
	// outcome carries the epoch it opened.
	Epoch  uint64 `json:"epoch"`
	Status Status `json:"status"`
	// Start is the first phase's publish time (or the first event's time
	// when no phase was read); End the time of the operation's last event.
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	// Members is every member a phase named or that answered one, by name.
	Members []events.Member `json:"members"`
	Phases  []Phase         `json:"phases"`
	Outcome *Outcome        `json:"outcome,omitempty"`
}

// Phase is one phase event of an operation and every answer to it.
type Phase struct {
	Phase events.Phase `json:"phase"`
	Seq   uint64       `json:"seq"`
	Epoch uint64       `json:"epoch"`
	// StreamSeq and Published are the phase event's stream sequence and
	// time; zero when the phase event was not read (only acks of it).
	StreamSeq uint64    `json:"stream_seq,omitempty"`
	Published time.Time `json:"published,omitzero"`
	Deadline  time.Time `json:"deadline,omitzero"`
	// Aborted marks a resume that abandons the checkpoint.
	Aborted bool `json:"aborted,omitempty"`
	// Republished counts further copies of the same phase event on the
	// stream (a bridge restarted past the duplicate window).
	Republished int `json:"republished,omitempty"`
	// Expected is the member set the phase named.
	Expected []events.Member `json:"expected"`
	// Heard is the bridge's record of a resume's acks, or of a prepare's
	// sandbox daemons' acks, which travel on core NATS and are not stored
	// (PROTOCOL §3): those acks are read from it, without their times.
	Heard *Heard `json:"heard,omitempty"`
	// Acks has one entry per expected member and per other member that
	// answered, slowest first: missing and pending ones lead.
	Acks []Ack `json:"acks"`
}

// Ack is one member's answer to a phase (or its absence).
type Ack struct {
	Member events.Member     `json:"member"`
	Kind   events.MemberKind `json:"kind"`
	Status AckStatus         `json:"status"`
	// Time and StreamSeq are the ack's on the stream; zero when missing or
	// pending.
	Time      time.Time `json:"time,omitzero"`
	StreamSeq uint64    `json:"stream_seq,omitempty"`
	// LatencyMS is from the phase's publish to the ack, in milliseconds
	// (stream times both); absent when either is not on the stream.
	LatencyMS *float64 `json:"latency_ms,omitempty"`
	// TookMS is the member's own measure of its work.
	TookMS int64        `json:"took_ms,omitempty"`
	Epoch  uint64       `json:"epoch"`
	State  events.State `json:"state,omitempty"`
	// Code and Detail are a failed ack's error.
	Code   string `json:"code,omitempty"`
	Detail string `json:"detail,omitempty"`
	// Ready, Blockers and BlockerCount are a prepare ack's.
	Ready        *bool    `json:"ready,omitempty"`
	Blockers     []string `json:"blockers,omitempty"`
	BlockerCount int      `json:"blocker_count,omitempty"`
	// Late marks an ack stored after the phase's deadline or after the
	// operation's outcome; Unexpected one from a member the phase did not
	// name; BeforePhase one the stream holds before the phase event.
	Late        bool `json:"late,omitempty"`
	Unexpected  bool `json:"unexpected,omitempty"`
	BeforePhase bool `json:"before_phase,omitempty"`
	// Duplicates counts further acks of the same phase by the same member;
	// the first one is kept.
	Duplicates int `json:"duplicates,omitempty"`
}

// Heard is what the bridge recorded of a resume's acks
// (events.ResumeAcked) or of a prepare's sandbox daemons' acks
// (events.PrepareAcked).
type Heard struct {
	Time      time.Time `json:"time"`
	StreamSeq uint64    `json:"stream_seq"`
	Expected  int       `json:"expected"`
	Answered  int       `json:"answered"`
	// P50MS and MaxMS are the acks' latencies as the bridge heard them.
	P50MS float64 `json:"p50_ms"`
	MaxMS float64 `json:"max_ms"`

	missing  map[events.Member]bool
	notReady map[events.Member]bool
	errors   map[events.Member]events.MemberError
	// sandboxesOnly: the record covers the sandbox daemons alone (a
	// prepare's), not every member (a resume's).
	sandboxesOnly bool
	// complete: every silent, not ready and failed member is named.
	complete bool
}

// Outcome is the bridge's verdict on an operation.
type Outcome struct {
	Type      events.Type `json:"type"`
	Status    Status      `json:"status"`
	Time      time.Time   `json:"time"`
	StreamSeq uint64      `json:"stream_seq"`
	// AfterMS is from the operation's start to the outcome.
	AfterMS float64 `json:"after_ms"`
	Epoch   uint64  `json:"epoch"`
	// Phase is the phase a checkpoint failed in; Reason says why.
	Phase  events.Phase `json:"phase,omitempty"`
	Reason string       `json:"reason,omitempty"`
	// Errors names every member that failed or never answered, as the
	// bridge saw it.
	Errors []events.MemberError `json:"errors,omitempty"`
	// Source is a restore's or a branch's source checkpoint.
	Source string `json:"source_checkpoint_id,omitempty"`
	// Continued, Carried, Retired and Restarted count a committed
	// checkpoint's episodes; Restored a restore's; Keep and Deleted are a
	// release's; Branches counts a branch's branches (Retired, those a
	// failed one retired).
	Continued int      `json:"continued,omitempty"`
	Carried   int      `json:"carried,omitempty"`
	Retired   int      `json:"retired,omitempty"`
	Restarted int      `json:"restarted,omitempty"`
	Restored  int      `json:"restored,omitempty"`
	Branches  int      `json:"branches,omitempty"`
	Keep      []string `json:"keep,omitempty"`
	Deleted   []string `json:"deleted,omitempty"`
	// Stop is a committed checkpoint's: the fleet stays parked, no resume
	// follows.
	Stop bool `json:"stop,omitempty"`
	// Repeated counts further copies of an outcome on the stream.
	Repeated int `json:"repeated,omitempty"`
}

// Builder folds a run's events, in stream order, into its operations. It
// does no I/O and reads no clock: Op and Ops take the time to judge
// deadlines by. The zero Builder is ready; it is not safe for concurrent
// use.
type Builder struct {
	ops   map[string]*opState
	order []string
	// rosters are the roster events read, by stream sequence: the sandbox
	// daemons of the phases that name them (PROTOCOL §3, Rosters).
	rosters map[uint64]events.Roster
	// last is the time of the last event added.
	last time.Time
}

type opState struct {
	id      string
	kind    Kind
	start   time.Time
	end     time.Time
	phases  []*phaseState // by seq
	outcome *Outcome
	// done is set once Add reported the operation over.
	done bool
}

type phaseState struct {
	Phase
	acks map[events.Member]*Ack
	// anySandbox: the phase addressed sandbox daemons by a roster that was
	// not read, so an ack of any sandbox daemon is one it expected.
	anySandbox bool
}

// Add folds one event in. It returns the id of the operation the event
// belongs to ("" for membership and undecodable events).
func (b *Builder) Add(e Event) string {
	if b.ops == nil {
		b.ops = map[string]*opState{}
	}
	if e.Time.After(b.last) {
		b.last = e.Time
	}
	switch d := e.Data.(type) {
	case events.Roster:
		if b.rosters == nil {
			b.rosters = map[uint64]events.Roster{}
		}
		b.rosters[e.StreamSeq] = d
		return ""
	case events.PhaseEvent:
		h := d.Header()
		o := b.op(h.CheckpointID, e.Time)
		p := o.phase(h.Seq, d.Phase())
		if p.StreamSeq != 0 {
			p.Republished++
			return o.id
		}
		// The operation is named for its first phase; a later one names it
		// until that is read (or when it never is).
		if o.kind == KindUnknown || p.Seq == o.phases[0].Seq {
			o.kind = kindOf(d.Phase())
		}
		p.Phase.Phase, p.Epoch, p.StreamSeq, p.Published, p.Deadline = d.Phase(), h.Epoch, e.StreamSeq, e.Time, h.Deadline
		p.Expected, p.anySandbox = b.expected(h)
		if r, ok := d.(events.Resume); ok {
			p.Aborted = r.Aborted
		}
		for _, a := range p.acks {
			a.BeforePhase = a.StreamSeq < e.StreamSeq
		}
		o.touch(e.Time)
		return o.id
	case events.ResumeAcked:
		o := b.op(d.CheckpointID, e.Time)
		o.touch(e.Time)
		o.phase(d.Seq, events.PhaseResume).Heard = newHeard(e, d.Expected, d.Answered, d.P50MS, d.MaxMS,
			d.Missing, d.MissingCount, nil, 0, d.Errors, d.ErrorCount, false)
		return o.id
	case events.PrepareAcked:
		o := b.op(d.CheckpointID, e.Time)
		o.touch(e.Time)
		o.phase(d.Seq, events.PhasePrepare).Heard = newHeard(e, d.Expected, d.Answered, d.P50MS, d.MaxMS,
			d.Missing, d.MissingCount, d.NotReady, d.NotReadyCount, d.Errors, d.ErrorCount, true)
		return o.id
	case events.Ack:
		h := d.Header()
		o := b.op(h.CheckpointID, e.Time)
		p := o.phase(h.Seq, d.Answers())
		o.touch(e.Time)
		if a, ok := p.acks[h.Member]; ok {
			a.Duplicates++
			return o.id
		}
		a := &Ack{Member: h.Member, Kind: h.Member.Kind(), Time: e.Time, StreamSeq: e.StreamSeq,
			TookMS: h.TookMS, Epoch: h.Epoch, State: h.State, Status: AckOK}
		if !h.OK {
			a.Status = AckError
			if h.Error != nil {
				a.Code, a.Detail = h.Error.Code, h.Error.Detail
			}
		}
		if pa, ok := d.(events.PrepareAck); ok && h.OK {
			ready := pa.Ready
			a.Ready, a.Blockers, a.BlockerCount = &ready, pa.Blockers, pa.BlockerCount
			if !ready {
				a.Status = AckNotReady
			}
		}
		a.BeforePhase = p.StreamSeq == 0
		a.Late = (o.outcome != nil && p.StreamSeq != 0 && p.StreamSeq < o.outcome.StreamSeq) ||
			(!p.Deadline.IsZero() && e.Time.After(p.Deadline))
		p.acks[h.Member] = a
		return o.id
	}
	out, id := outcomeOf(e)
	if out == nil {
		return ""
	}
	o := b.op(id, e.Time)
	o.touch(e.Time)
	if o.outcome != nil {
		o.outcome.Repeated++
		return o.id
	}
	if o.kind == KindUnknown {
		o.kind = kindOfOutcome(e.Data.Type())
	}
	o.outcome = out
	return o.id
}

// Done reports, once, that the operation id is over as of now: its
// outcome is on the stream (or, for retire and forget, every named member
// answered), the resume that goes with a committed or failed checkpoint
// and a completed restore is too (or a later operation began), and no phase
// still waits for an ack before its deadline. It is how a live view knows
// when to print an operation.
func (b *Builder) Done(id string, now time.Time) bool {
	o := b.ops[id]
	if o == nil || o.done {
		return false
	}
	op := o.snapshot(now)
	if op.Status == StatusOpen {
		return false
	}
	if o.outcome != nil && resumes(o.outcome) && !b.later(o) {
		resumed := false
		for _, p := range o.phases {
			resumed = resumed || (p.Phase.Phase == events.PhaseResume && p.StreamSeq != 0)
		}
		if !resumed {
			return false
		}
	}
	for _, p := range op.Phases {
		for _, a := range p.Acks {
			if a.Status == AckPending {
				return false
			}
		}
	}
	o.done = true
	return true
}

// resumes tells whether the bridge publishes a resume after outcome o.
func resumes(o *Outcome) bool {
	switch o.Type {
	case events.TypeCheckpointCommitted:
		return !o.Stop
	case events.TypeCheckpointFailed, events.TypeRestoreCompleted:
		return true
	}
	return false
}

// later tells whether an operation began after o.
func (b *Builder) later(o *opState) bool {
	i := slices.Index(b.order, o.id)
	return i >= 0 && i < len(b.order)-1
}

// Open returns the ids of the operations Done has not reported, in the
// order they began.
func (b *Builder) Open() []string {
	var ids []string
	for _, id := range b.order {
		if !b.ops[id].done {
			ids = append(ids, id)
		}
	}
	return ids
}

// Op returns operation id as of now (deadlines that passed by now make
// missing acks), and whether it exists.
func (b *Builder) Op(id string, now time.Time) (Op, bool) {
	o := b.ops[id]
	if o == nil {
		return Op{}, false
	}
	return o.snapshot(now), true
}

// Ops returns every operation as of now, in the order they began.
func (b *Builder) Ops(now time.Time) []Op {
	out := make([]Op, 0, len(b.order))
	for _, id := range b.order {
		out = append(out, b.ops[id].snapshot(now))
	}
	return out
}

// Last is the time of the latest event added: the "now" of a run read
// back after it ended.
func (b *Builder) Last() time.Time { return b.last }

// Build folds events and returns the operations as of the last event's
// time.
func Build(evs []Event) []Op {
	var b Builder
	for _, e := range evs {
		b.Add(e)
	}
	return b.Ops(b.Last())
}

// expected returns the members phase h addresses, its roster's sandbox
// daemons among them when the roster was read; any is true when it was
// not (a follow that started after it, a roster aged out).
func (b *Builder) expected(h events.PhaseHeader) (ms []events.Member, any bool) {
	if h.Sandboxes == nil {
		return slices.Clone(h.Members), false
	}
	r, ok := b.rosters[h.Sandboxes.StreamSeq]
	if !ok {
		return slices.Clone(h.Members), true
	}
	ref, err := h.Sandboxes.Expand(r)
	if err != nil {
		return slices.Clone(h.Members), true
	}
	h.Sandboxes = &ref
	ms, _ = h.Expected()
	return ms, false
}

func (b *Builder) op(id string, t time.Time) *opState {
	o := b.ops[id]
	if o == nil {
		o = &opState{id: id, kind: KindUnknown, start: t, end: t}
		b.ops[id] = o
		b.order = append(b.order, id)
	}
	return o
}

func (o *opState) touch(t time.Time) {
	if t.After(o.end) {
		o.end = t
	}
}

// phase returns the phase of seq, adding it in seq order.
func (o *opState) phase(seq uint64, ph events.Phase) *phaseState {
	i, found := slices.BinarySearchFunc(o.phases, seq, func(p *phaseState, s uint64) int { return cmp.Compare(p.Seq, s) })
	if found {
		return o.phases[i]
	}
	p := &phaseState{Phase: Phase{Phase: ph, Seq: seq}, acks: map[events.Member]*Ack{}}
	o.phases = slices.Insert(o.phases, i, p)
	return p
}

func (o *opState) snapshot(now time.Time) Op {
	op := Op{ID: o.id, Kind: o.kind, Start: o.start, End: o.end, Status: StatusOpen}
	// The operation starts at its first phase's publish, when one was read.
	for _, p := range o.phases {
		if !p.Published.IsZero() {
			op.Start = p.Published
			break
		}
	}
	if o.outcome != nil {
		c := *o.outcome
		c.AfterMS = ms(c.Time.Sub(op.Start))
		op.Outcome, op.Status = &c, c.Status
	}
	if len(o.phases) > 0 {
		op.Epoch = o.phases[0].Epoch
	}
	members := map[events.Member]bool{}
	allOK := len(o.phases) > 0
	anyFailed := false
	for i, ps := range o.phases {
		p := ps.Phase
		p.Expected = slices.Clone(ps.Expected)
		// A phase is over once a later phase of the operation or its
		// outcome followed it, or its deadline passed.
		over := i < len(o.phases)-1 || (o.outcome != nil && ps.StreamSeq != 0 && ps.StreamSeq < o.outcome.StreamSeq) ||
			(!ps.Deadline.IsZero() && now.After(ps.Deadline))
		seen := map[events.Member]bool{}
		for _, m := range ps.Expected {
			members[m], seen[m] = true, true
			if a, ok := ps.acks[m]; ok {
				p.Acks = append(p.Acks, ps.ackAt(a))
				continue
			}
			// A prepare's record covers its sandbox daemons only (their
			// acks travel on core NATS); its other members store theirs.
			if hd := ps.Heard; hd != nil && (!hd.sandboxesOnly || m.Kind() == events.KindSandbox) {
				p.Acks = append(p.Acks, hd.ack(m, ps.Epoch))
				continue
			}
			st := AckPending
			if over {
				st = AckMissing
			}
			p.Acks = append(p.Acks, Ack{Member: m, Kind: m.Kind(), Status: st, Epoch: ps.Epoch})
		}
		for m, a := range ps.acks {
			if !seen[m] {
				members[m] = true
				c := ps.ackAt(a)
				c.Unexpected = ps.StreamSeq != 0 && !(ps.anySandbox && m.Kind() == events.KindSandbox)
				p.Acks = append(p.Acks, c)
			}
		}
		slices.SortFunc(p.Acks, slowestFirst)
		for _, a := range p.Acks {
			switch a.Status {
			case AckOK:
			case AckError, AckNotReady, AckMissing:
				allOK, anyFailed = false, true
			default:
				allOK = false
			}
		}
		op.Phases = append(op.Phases, p)
	}
	if o.outcome == nil && (o.kind == KindRetire || o.kind == KindForget) {
		switch {
		case anyFailed:
			op.Status = StatusFailed
		case allOK:
			op.Status = StatusCompleted
		}
	}
	for m := range members {
		op.Members = append(op.Members, m)
	}
	slices.Sort(op.Members)
	return op
}

// newHeard reads a record of acks heard on core NATS (events.ResumeAcked,
// events.PrepareAcked): its lists, complete when each count is its list's
// length.
func newHeard(e Event, expected, answered int, p50, maxMS float64, missing []events.Member, nMissing int,
	notReady []events.Member, nNotReady int, errs []events.MemberError, nErrs int, sandboxesOnly bool) *Heard {
	hd := &Heard{Time: e.Time, StreamSeq: e.StreamSeq, Expected: expected, Answered: answered, P50MS: p50, MaxMS: maxMS,
		missing: map[events.Member]bool{}, notReady: map[events.Member]bool{}, errors: map[events.Member]events.MemberError{},
		sandboxesOnly: sandboxesOnly, complete: nMissing == len(missing) && nNotReady == len(notReady) && nErrs == len(errs)}
	for _, m := range missing {
		hd.missing[m] = true
	}
	for _, m := range notReady {
		hd.notReady[m] = true
	}
	for _, me := range errs {
		hd.errors[me.Member] = me
	}
	return hd
}

// ack is member m's answer as the record says it: silent, failed, or
// answered (unknown when the record's lists are cut and do not name m).
func (hd *Heard) ack(m events.Member, epoch uint64) Ack {
	a := Ack{Member: m, Kind: m.Kind(), Epoch: epoch, Status: AckOK}
	switch e, failed := hd.errors[m]; {
	case hd.missing[m]:
		a.Status = AckMissing
	case hd.notReady[m]:
		a.Status = AckNotReady
	case failed:
		a.Status, a.Code, a.Detail = AckError, e.Code, e.Detail
	case !hd.complete:
		a.Status = AckUnknown
	}
	return a
}

// ackAt copies a with its latency from the phase's publish.
func (ps *phaseState) ackAt(a *Ack) Ack {
	c := *a
	if ps.StreamSeq != 0 {
		l := ms(a.Time.Sub(ps.Published))
		c.LatencyMS = &l
		c.BeforePhase = a.StreamSeq < ps.StreamSeq
	}
	return c
}

// rank orders the statuses for slowestFirst: no answer is the slowest.
func rank(s AckStatus) int {
	switch s {
	case AckMissing:
		return 0
	case AckPending:
		return 1
	}
	return 2
}

func slowestFirst(a, b Ack) int {
	if c := cmp.Compare(rank(a.Status), rank(b.Status)); c != 0 {
		return c
	}
	var la, lb float64
	if a.LatencyMS != nil {
		la = *a.LatencyMS
	}
	if b.LatencyMS != nil {
		lb = *b.LatencyMS
	}
	if c := cmp.Compare(lb, la); c != 0 {
		return c
	}
	return cmp.Compare(a.Member, b.Member)
}

func ms(d time.Duration) float64 {
	return float64(d.Microseconds()) / 1000
}
