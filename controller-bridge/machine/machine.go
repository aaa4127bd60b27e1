package machine

import (
	"fmt"
	"strconv"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/events"
)

// Config configures a machine. The bridge's Config carries the defaults.
type Config struct {
	// Run is the run id.
	Run string
	// PhaseTimeout is the deadline of a phase from its publish when the
	// request names none (and always for retire, forget and release).
	// Positive.
	PhaseTimeout time.Duration
	// ResumeTimeout is the deadline of a resume. Positive.
	ResumeTimeout time.Duration
}

// Machine is the bridge's checkpoint and restore machine: pure, no I/O,
// time passed in. It holds the operation open in the run (at most one),
// what the run's last phase is as far as it knows, the tally of the phase
// whose acks it gathers, and what answer it waits for. One goroutine at a
// time may step it.
type Machine struct {
	cfg   Config
	state State

	// The run's last phase event as far as the machine knows: its
	// sequence, the stream sequence that fences the next publish, the
	// epoch, the event, its ce-id and time.
	seq, fence, epoch uint64
	last              events.PhaseEvent
	lastID            string
	lastAt            time.Time

	op      *operation        // the open operation; nil when idle
	want    want              // the answer the machine waits for
	pending events.PhaseEvent // the phase it asked to publish
	g       *gathering        // the phase whose acks it gathers
}

// want is the answer the machine waits for.
type want uint8

const (
	wantNothing want = iota
	wantPublished
	wantGatherStarted
	wantAcks
	wantMemberList
	wantManifestCreated
	wantManifestFound
	wantLatestMoved
	wantOutcomePublished
	wantOutcomeSeen
	wantCheckpointsListed
	wantCheckpointsDeleted
	wantTick
	wantReleasedMarked
)

var wantNames = [...]string{"nothing", "PhasePublished", "GatherStarted", "acks", "MemberListWritten",
	"ManifestCreated", "ManifestFound", "LatestMoved", "OutcomePublished", "OutcomeSeen", "CheckpointsListed",
	"CheckpointsDeleted", "Tick", "ReleasedMarked"}

func (w want) String() string { return wantNames[w] }

// New returns an idle machine.
func New(cfg Config) *Machine { return &Machine{cfg: cfg} }

// State returns the current state.
func (m *Machine) State() State { return m.state }

// Held returns the id of the checkpoint held prepared, "" when none.
func (m *Machine) Held() string {
	if m.state == StateHeld {
		return m.op.id
	}
	return ""
}

// Step feeds one input to the machine at time now and returns what the
// driver must do, in order. An error means the input was refused (an ask
// that cannot start, an answer to nothing asked) and the machine is as it
// was.
func (m *Machine) Step(now time.Time, in Input) ([]Effect, error) {
	switch in := in.(type) {
	case CheckpointAsked:
		return m.askCheckpoint(now, in)
	case CommitAsked:
		return m.askCommit(now, in)
	case AbortAsked:
		return m.askAbort(now, in)
	case Shutdown:
		return m.shutdown(now, in)
	case RestoreAsked:
		return m.askRestore(now, in)
	case RetireAsked:
		return m.askRetire(now, in)
	case ForgetAsked:
		return m.askForget(now, in)
	case ReleaseAsked:
		return m.askRelease(now, in)
	case BranchAsked:
		return m.askBranch(now, in)
	case Recover:
		return m.recover(in)
	case Replayed:
		return m.replayed(now)
	case PhasePublished:
		return m.published(now, in)
	case GatherStarted:
		return m.gatherStarted(now, in)
	case AckSeen:
		return m.ackSeen(now, in)
	case MemberGone:
		return m.memberGone(now, in)
	case MemberListWritten:
		return m.memberListWritten(in)
	case ManifestCreated:
		return m.manifestCreated(now, in)
	case ManifestFound:
		return m.manifestFound(in)
	case LatestMoved:
		return m.latestMoved(now, in)
	case OutcomePublished:
		return m.outcomePublished(now, in)
	case OutcomeSeen:
		return m.outcomeSeen(in)
	case CheckpointsListed:
		return m.checkpointsListed(in)
	case CheckpointsDeleted:
		return m.checkpointsDeleted(in)
	case ReleasedMarked:
		return m.releasedMarked(in)
	case Tick:
		return m.tick(now)
	case EffectFailed:
		return m.effectFailed(in)
	}
	return nil, fmt.Errorf("%w: %T in state %s", ErrUnexpected, in, m.state)
}

// to moves the machine to state s, if successors allows it.
func (m *Machine) to(s State) error {
	if err := CheckTransition(m.state, s); err != nil {
		return err
	}
	m.state = s
	return nil
}

// expect refuses an answer the machine does not wait for.
func (m *Machine) expect(w want, in Input) error {
	if m.want != w {
		return fmt.Errorf("%w: %T in state %s, which waits for %s", ErrUnexpected, in, m.state, m.want)
	}
	m.want = wantNothing
	return nil
}

// refuseBusy refuses an ask while an operation is open.
func (m *Machine) refuseBusy() error {
	switch m.state {
	case StateIdle:
		return nil
	case StateHeld:
		return fmt.Errorf("%w: checkpoint %s is held prepared", bridgeapi.ErrBusy, m.op.id)
	}
	return fmt.Errorf("%w: %s is %s", bridgeapi.ErrBusy, m.op.id, m.state)
}

// view takes the run's last phase from what the driver read.
func (m *Machine) view(v View) {
	m.seq, m.fence, m.epoch = v.Seq, v.StreamSeq, v.Epoch
	m.last, m.lastID, m.lastAt = v.Last, v.LastID, v.LastAt
}

// timeout is the deadline length a request asks for.
func (m *Machine) timeout(ms int64) time.Duration {
	if ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return m.cfg.PhaseTimeout
}

// header builds the header of the run's next phase event, addressed to
// members: the sandbox daemons among them by a roster (PROTOCOL §3,
// Rosters), which the driver publishes before the phase.
func (m *Machine) header(now time.Time, id string, epoch uint64, members []events.Member, timeout time.Duration) events.PhaseHeader {
	return events.PhaseHeader{Run: m.cfg.Run, CheckpointID: id, Seq: m.seq + 1, Epoch: epoch,
		Deadline: now.Add(timeout).UTC().Truncate(time.Millisecond)}.Address(members)
}

// expected returns the members phase h waits for (Members and its
// roster's sandbox daemons); the driver expands every roster before a
// phase reaches the machine (PhasePublished, Recover).
func expected(h events.PhaseHeader) []events.Member {
	ms, _ := h.Expected()
	return ms
}

// opID is the id of a retire, forget or release: its phase and sequence.
func (m *Machine) opID(p events.Phase) string {
	return string(p) + "-" + strconv.FormatUint(m.seq+1, 10)
}

// publish asks for p to be published, fenced on the run's last phase.
func (m *Machine) publish(p events.PhaseEvent) []Effect {
	m.pending, m.want = p, wantPublished
	return []Effect{PublishPhase{Event: p, Fence: m.fence}}
}

// lastIs reports whether the run's last phase is phase p of operation id.
func (m *Machine) lastIs(p events.Phase, id string) bool {
	return m.last != nil && m.last.Phase() == p && m.last.Header().CheckpointID == id
}

// finish ends the operation with f.
func (m *Machine) finish(f Finish) ([]Effect, error) {
	if err := m.to(StateIdle); err != nil {
		return nil, err
	}
	m.op, m.g, m.pending, m.want = nil, nil, nil, wantNothing
	return []Effect{f}, nil
}

// published takes a phase the machine asked for, now on the stream.
func (m *Machine) published(now time.Time, in PhasePublished) ([]Effect, error) {
	if err := m.expect(wantPublished, in); err != nil {
		return nil, err
	}
	h, p := in.Event.Header(), in.Event.Phase()
	if want := m.pending; want.Phase() != p || want.Header().Seq != h.Seq || want.Header().CheckpointID != h.CheckpointID {
		m.want = wantPublished
		return nil, fmt.Errorf("%w: %s seq %d published, %s seq %d asked", ErrUnexpected, p, h.Seq, want.Phase(), want.Header().Seq)
	}
	if _, ok := h.Expected(); !ok {
		m.want = wantPublished
		return nil, fmt.Errorf("%w: %s seq %d published with its roster's names unknown", ErrUnexpected, p, h.Seq)
	}
	m.pending = nil
	m.seq, m.fence, m.epoch = h.Seq, in.StreamSeq, h.Epoch
	m.last, m.lastID, m.lastAt = in.Event, in.ID, in.At
	switch e := in.Event.(type) {
	case events.Prepare:
		m.op.prepare = &e
		return m.gatherPublished(now, e), nil
	case events.Renew:
		m.want = wantTick
		return []Effect{SetTimer{After: m.renewEvery()}, Note{Level: LevelDebug, Msg: "lease renewed"}}, nil
	case events.Commit:
		m.op.commit = &e
		return m.gatherPublished(now, e), nil
	case events.Resume:
		m.op.resume = &e
		return m.resumed(now, e)
	case events.Retire:
		if m.op.kind == opRestore || m.op.kind == opBranch {
			m.op.retire = &e
		}
		return m.gatherPublished(now, e), nil
	case events.Branch:
		m.op.branch = &e
		return m.gatherPublished(now, e), nil
	case events.Restore, events.Forget, events.Release:
		return m.gatherPublished(now, in.Event), nil
	}
	return nil, fmt.Errorf("%w: a %s published", ErrUnexpected, p)
}

// resumed carries on once the operation's resume is published: a resume
// is watched in the background, never waited for.
func (m *Machine) resumed(now time.Time, r events.Resume) ([]Effect, error) {
	watch := WatchResume{Event: r}
	var (
		effs []Effect
		err  error
	)
	switch m.state {
	case StateCommitted, StateAborting:
		effs, err = m.finish(Finish{Checkpoint: m.op.result()})
	case StateRestored:
		effs, err = m.finish(Finish{Restore: m.op.rres})
	case StateRestoreFailing:
		effs, err = m.publishRestoreFailed()
	default:
		return nil, fmt.Errorf("%w: a resume published in state %s", ErrUnexpected, m.state)
	}
	return append([]Effect{watch}, effs...), err
}

// resume asks for the resume of the operation, to members.
func (m *Machine) resume(now time.Time, members []events.Member, aborted bool) []Effect {
	return m.publish(events.Resume{PhaseHeader: m.header(now, m.op.id, m.epoch, members, m.cfg.ResumeTimeout), Aborted: aborted})
}

// outcomePublished carries on once an outcome is on the stream.
func (m *Machine) outcomePublished(now time.Time, in OutcomePublished) ([]Effect, error) {
	if err := m.expect(wantOutcomePublished, in); err != nil {
		return nil, err
	}
	switch in.Type {
	case events.TypeCheckpointCommitted:
		return m.afterCommitted(now)
	case events.TypeCheckpointFailed:
		return m.afterFailed(now)
	case events.TypeRestoreCompleted:
		return m.afterRestoreCompleted(now)
	case events.TypeRestoreFailed:
		return m.finish(Finish{Restore: m.op.rres})
	case events.TypeReleaseCompleted, events.TypeReleaseFailed:
		return m.finish(Finish{Op: m.op.ores})
	case events.TypeBranchCompleted, events.TypeBranchFailed:
		return m.finish(Finish{Branch: m.op.bres})
	}
	return nil, fmt.Errorf("%w: outcome %s in state %s", ErrUnexpected, in.Type, m.state)
}

// tick takes the passing of time: a held checkpoint's renew is due, or a
// gathered phase's deadline may have passed.
func (m *Machine) tick(now time.Time) ([]Effect, error) {
	switch {
	case m.state == StateHeld && m.want == wantTick:
		return m.renew(now), nil
	case m.want == wantAcks && m.g.watch:
		return m.deadline(now)
	case m.want == wantAcks:
		g := m.g
		effs, err := m.gathered(now, g.tally.Decide(now))
		note := Note{Level: LevelWarn, Msg: fmt.Sprintf("reading back the acks of %s seq %d: the last recorded one never came; going on with %d",
			g.event.Phase(), g.event.Header().Seq, len(g.tally.Acks()))}
		return append([]Effect{note}, effs...), err
	}
	return nil, nil // a timer of something already decided
}

// effectFailed ends the operation with the driver's error; a held
// checkpoint stays held and renews again.
func (m *Machine) effectFailed(in EffectFailed) ([]Effect, error) {
	if m.state == StateHeld && m.want == wantPublished {
		m.pending, m.want = nil, wantTick
		return []Effect{Note{Level: LevelError, Msg: "renewing the held checkpoint " + m.op.id + ": " + in.Err.Error()},
			SetTimer{After: m.renewEvery()}}, nil
	}
	if m.state == StateIdle {
		return nil, fmt.Errorf("%w: EffectFailed with no operation open: %w", ErrUnexpected, in.Err)
	}
	return m.finish(Finish{Err: in.Err})
}
