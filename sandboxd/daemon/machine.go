package daemon

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/sandboxd"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// ErrUnknownInput is returned by Step for an input it does not know.
var ErrUnknownInput = errors.New("daemon: unknown input")

// Machine is a sandbox daemon's checkpoint state, a pure core: Step takes
// an input and returns what the driver must do. It does no I/O, reads no
// clock and starts no goroutine. It holds the open checkpoint (admission
// is closed while there is one), which checkpoint paused each launch, the
// pauses and watches in flight (as numbered jobs), what each checkpoint's
// pauses confirmed or why one failed, the launches' episodes, the launches
// being registered or taken over, the take-overs answered, and whose the
// relay's hold is. The driver steps it under one lock.
type Machine struct {
	relay bool // the daemon has a model relay

	open        string                   // checkpoint id while admission is closed
	marks       map[string]string        // launch id -> checkpoint that paused it
	episodes    map[string]string        // launch id -> episode key, persisted
	nopause     map[string]bool          // launches checkpoints leave alone
	registering map[string]*registration // launches admitted and not yet registered
	resuming    map[string]string        // launches a take-over is continuing -> their mark before
	taken       map[string]takenOver     // launch id -> the take-over that continued it
	heldBy      string                   // the checkpoint whose prepare took the relay's hold ("": none of this daemon's)
	flushing    bool                     // a Flush job runs
	pausing     map[string]pauseJob      // launch id -> its pause in flight
	ending      map[string]uint64        // launch id -> the job watching for the end of its stop
	confirmed   map[string][]sandboxapi.PauseResult
	failed      map[string]error // checkpoint id -> why one of its pauses failed
	closing     bool             // Run is returning: no new job
	lastJob     uint64
}

// pauseJob is one launch's pause in flight for a checkpoint.
type pauseJob struct {
	checkpoint string
	job        uint64
}

// registration is a launch being registered, with what LaunchRecorded
// changed, to put back.
type registration struct {
	episode                 string
	hadEpisode, prevNopause bool
	prevEpisode             string
}

// takenOver is a take-over that continued a launch: what a Resume asked
// and what it answered, answered again to the same Resume.
type takenOver struct {
	seq      int
	identity sandboxapi.Identity
	rep      sandboxapi.PauseResult
}

// NewMachine returns the machine of a daemon with a model relay or not,
// with the episodes the last daemon kept.
func NewMachine(relay bool, episodes map[string]string) *Machine {
	eps := map[string]string{}
	maps.Copy(eps, episodes)
	return &Machine{relay: relay, marks: map[string]string{}, episodes: eps, nopause: map[string]bool{},
		registering: map[string]*registration{}, resuming: map[string]string{}, taken: map[string]takenOver{},
		pausing: map[string]pauseJob{}, ending: map[string]uint64{}, confirmed: map[string][]sandboxapi.PauseResult{},
		failed: map[string]error{}}
}

// Open returns the open checkpoint, "" when admission is open.
func (m *Machine) Open() string { return m.open }

// Mark returns the checkpoint that holds launch id paused, "" if none.
func (m *Machine) Mark(id string) string { return m.marks[id] }

// Pausing tells whether a pause of launch id is in flight.
func (m *Machine) Pausing(id string) bool { _, ok := m.pausing[id]; return ok }

// Episode returns launch id's episode key, "" if none.
func (m *Machine) Episode(id string) string { return m.episodes[id] }

// Step applies in and returns the effects, in order. An error refuses an
// ask; the effects returned with it are still to be done, before the
// refusal.
func (m *Machine) Step(in Input) ([]Effect, error) {
	switch in := in.(type) {
	case PrepareAsked:
		return m.prepare(in)
	case PauseEnded:
		return m.pauseEnded(in), nil
	case FallbackStopped:
		if in.Err != nil {
			m.fail(in.Checkpoint, fmt.Errorf("stop %s after an unconfirmed pause: %w", in.Launch, in.Err))
		} else {
			m.confirmed[in.Checkpoint] = append(m.confirmed[in.Checkpoint], in.Result)
		}
		return m.endPause(in.Job, in.Launch), nil
	case EndWatched:
		delete(m.ending, in.Launch)
		if in.Ended {
			return []Effect{Notify{}}, nil
		}
		return nil, nil
	case Flushed:
		m.flushing = false
		return []Effect{Notify{}}, nil
	case ReopenAsked:
		var jobs []uint64
		for _, p := range m.pausing {
			if p.checkpoint == in.Checkpoint || in.Checkpoint == "" {
				jobs = append(jobs, p.job)
			}
		}
		return cut(jobs), nil
	case PausesCut:
		return m.continueMarked(in.Checkpoint), nil
	case LaunchContinued:
		delete(m.marks, in.Launch)
		return nil, nil
	case Reopened:
		// After the launches are continued: the replies it kept reach
		// harnesses that run again. Only a hold this daemon's prepare took,
		// and only with admission still open (a prepare that came meanwhile
		// took the hold over): a restore's hold waits for its take-over.
		if m.open == "" && m.heldBy != "" && m.relay {
			m.heldBy = ""
			return []Effect{RelayRelease{}}, nil
		}
		return nil, nil
	case LaunchAsked:
		return m.admit(in)
	case LaunchRecorded:
		return m.record(in), nil
	case LaunchUnrecorded:
		return m.unrecord(in), nil
	case LaunchRegistered:
		delete(m.registering, in.Launch)
		return []Effect{Notify{}}, nil
	case TakeOverAsked:
		return m.takeOver(in)
	case TakeOverDone:
		return m.takenOver(in), nil
	case Collected:
		if m.open == "" {
			delete(m.marks, in.Launch) // no checkpoint of this daemon's is open: the mark is a restored one's
		}
		return m.releaseAfterRestore(in.Launch, "collected", in.Holding), nil
	case RepointAsked:
		if m.open != "" {
			// The take-over it belongs to waits for the resume.
			return nil, fmt.Errorf("%w: checkpoint %s", ErrAdmissionClosed, m.open)
		}
		return []Effect{RelayRepoint(in)}, nil
	case Closing:
		m.closing = true
		var jobs []uint64
		for _, j := range m.ending {
			jobs = append(jobs, j)
		}
		for _, p := range m.pausing {
			jobs = append(jobs, p.job)
		}
		return cut(jobs), nil
	}
	return nil, fmt.Errorf("%w: %T", ErrUnknownInput, in)
}

func cut(jobs []uint64) []Effect {
	if len(jobs) == 0 {
		return nil
	}
	slices.Sort(jobs)
	return []Effect{CutJobs{Jobs: jobs}}
}

func (m *Machine) job() uint64 {
	m.lastJob++
	return m.lastJob
}

// prepare closes admission and starts pausing every launch in its mode. It
// reports ready once each launch is paused, ended, or stopped after a
// pause that did not confirm; until then the launches still pausing are
// its blockers (their episode, or their id). A launch being stopped is
// not paused (the pause would fail at once): it is a blocker until it has
// ended. A pause that failed fails the next prepare.
func (m *Machine) prepare(in PrepareAsked) ([]Effect, error) {
	var effs []Effect
	cp := in.Checkpoint
	if m.open != cp && m.relay {
		// Before any launch is paused: no model call starts or is answered
		// from now on until the resume. A relay already holding is either
		// this daemon's hold of the checkpoint before (the resume of this
		// one releases it now) or the hold a restore left, which only a
		// take-over, a collect or a drop resolves: this checkpoint's
		// resume must not release it.
		switch {
		case !in.Holding:
			effs = append(effs, RelayHold{})
			m.heldBy = cp
		case m.heldBy != "":
			m.heldBy = cp
		}
	}
	m.open = cp
	if err := m.failed[cp]; err != nil {
		return effs, err
	}
	if len(m.registering) > 0 {
		// A launch admitted before the checkpoint closed admission is still
		// registering: wait for it, or it would escape the pause.
		return append(effs, Report{member.Report{Blockers: []string{"launch-registering"}}}), nil
	}
	var blockers []string
	for _, rec := range in.Launches {
		if rec.State == sandboxapi.StateEnded || m.nopause[rec.ID] {
			// Ended, or its agent stops it or lets it run (a restart-only
			// rollout).
			continue
		}
		if rec.State == sandboxapi.StateStopping {
			// It ends by itself, within the stop's grace.
			if _, ok := m.ending[rec.ID]; !ok && !m.closing {
				j := m.job()
				m.ending[rec.ID] = j
				effs = append(effs, WatchEnd{Job: j, Launch: rec.ID})
			}
			blockers = append(blockers, m.blocker(rec.ID))
			continue
		}
		if _, ok := m.resuming[rec.ID]; ok {
			// A take-over is continuing it: paused now, running in a
			// moment. Pause it once that is done (TakeOverDone notifies).
			blockers = append(blockers, m.blocker(rec.ID))
			continue
		}
		mark := m.marks[rec.ID]
		if mark == "" && rec.State == sandboxapi.StatePaused {
			// Paused by the agent, not by a checkpoint: it is still, and its
			// continue is the agent's to send.
			continue
		}
		if mark != cp {
			if m.closing {
				return effs, errors.New("daemon: stopping")
			}
			// Marked before the pause: a pause cut short by a resume may
			// still complete, and the resume must then continue it.
			m.marks[rec.ID] = cp
			j := m.job()
			m.pausing[rec.ID] = pauseJob{checkpoint: cp, job: j}
			effs = append(effs, StartPause{Job: j, Checkpoint: cp, Launch: rec.ID})
		}
		if _, ok := m.pausing[rec.ID]; ok {
			blockers = append(blockers, m.blocker(rec.ID))
		}
	}
	if len(blockers) > 0 {
		sort.Strings(blockers)
		return append(effs, Report{member.Report{Blockers: blockers, Counts: map[string]int{"pausing": len(blockers)}}}), nil
	}
	if m.relay && !in.Durable {
		// Every launch is still; the calls they made are captured, and the
		// snapshot must not come before the disk has them.
		if !m.flushing && !m.closing {
			m.flushing = true
			effs = append(effs, Flush{Job: m.job()})
		}
		return append(effs, Report{member.Report{Blockers: []string{"capture-sync"}}}), nil
	}
	reports := m.confirmed[cp]
	return append(effs, Report{member.Report{Ready: true, Pause: summarize(reports), Counts: map[string]int{"launches": len(reports)}}}), nil
}

// blocker names launch id as a blocker: its episode, or its id.
func (m *Machine) blocker(id string) string {
	if ep := m.episodes[id]; ep != "" {
		return ep
	}
	return id
}

// pauseEnded records how a pause went.
func (m *Machine) pauseEnded(in PauseEnded) []Effect {
	cp, id, err := in.Checkpoint, in.Launch, in.Err
	switch {
	case in.Cut:
		// Cut short: the mark stays, and whoever cut it continues the
		// launch, in case the pause completed after all.
	case errors.Is(err, sandboxd.ErrUnconfirmed):
		// Unconfirmed, and undone: never leave it running through a
		// snapshot. Stop it; the agent relaunches from its session. The
		// pause is in flight until the stop is done.
		delete(m.marks, id)
		return []Effect{StopLaunch{Job: in.Job, Checkpoint: cp, Launch: id, Result: in.Result}}
	case errors.Is(err, sandboxd.ErrStopping):
		delete(m.marks, id) // being stopped: it ends by itself
	case err != nil:
		m.fail(cp, fmt.Errorf("pause %s: %w", id, err))
	case in.Result.State == sandboxapi.StateEnded:
		delete(m.marks, id) // ended just before the pause: it keeps its result
	default:
		m.confirmed[cp] = append(m.confirmed[cp], in.Result)
	}
	return m.endPause(in.Job, id)
}

// endPause ends pause job j of launch id: a prepare may be ready now.
func (m *Machine) endPause(j uint64, id string) []Effect {
	if p, ok := m.pausing[id]; ok && p.job == j {
		delete(m.pausing, id)
	}
	return []Effect{Notify{}}
}

func (m *Machine) fail(cp string, err error) {
	m.failed[cp] = errors.Join(m.failed[cp], err)
}

// continueMarked reopens admission once checkpoint cp's pauses are cut,
// and continues what it paused ("": every checkpoint).
func (m *Machine) continueMarked(cp string) []Effect {
	delete(m.confirmed, cp)
	delete(m.failed, cp)
	var ids []string
	for l, c := range m.marks {
		if c == cp || cp == "" {
			ids = append(ids, l)
		}
	}
	sort.Strings(ids)
	if m.open == cp {
		m.open = ""
	}
	// This reopen lets the relay's held calls go (Reopened): only then
	// does its report count them.
	return []Effect{ContinueLaunches{Launches: ids, CountHeld: m.open == "" && m.heldBy != "" && m.relay}}
}

// admit admits a launch unless a checkpoint is open or the id is being
// launched. Admission is open, so a relay that still holds holds what the
// snapshot of a restored sandbox kept, whose held launch its agent
// abandoned (or never took over): its calls are dropped, never sent on
// (the relaunched harness makes its own), and the new launch's calls
// flow. Decided in one step with admission: a prepare's hold cannot come
// between.
func (m *Machine) admit(in LaunchAsked) ([]Effect, error) {
	if m.open != "" {
		return nil, fmt.Errorf("%w: checkpoint %s", ErrAdmissionClosed, m.open)
	}
	if _, ok := m.registering[in.Launch]; ok {
		return nil, fmt.Errorf("%w: %s is being launched", sandboxd.ErrLaunchExists, in.Launch)
	}
	m.registering[in.Launch] = &registration{}
	var effs []Effect
	if m.relay && in.Holding {
		effs = append(effs, RelayDrop{Launch: in.Launch, Why: "a new launch " + in.Launch + " replaces the held one"})
	}
	if m.relay && in.Episode != "" {
		effs = append(effs, RelayLabel{Episode: in.Episode, Launch: in.Launch, Edits: in.Edits, Branch: in.Branch})
	}
	return effs, nil
}

// record records a launch's episode (persisted) and no-pause, keeping
// what they were to put back.
func (m *Machine) record(in LaunchRecorded) []Effect {
	r := m.registering[in.Launch]
	if r == nil {
		r = &registration{}
		m.registering[in.Launch] = r
	}
	r.episode = in.Episode
	r.prevEpisode, r.hadEpisode = m.episodes[in.Launch]
	r.prevNopause = m.nopause[in.Launch]
	if in.NoPause {
		m.nopause[in.Launch] = true
	}
	if in.Episode == "" {
		return nil
	}
	m.episodes[in.Launch] = in.Episode
	return []Effect{SaveEpisodes{Episodes: maps.Clone(m.episodes)}}
}

func (m *Machine) unrecord(in LaunchUnrecorded) []Effect {
	r := m.registering[in.Launch]
	if r == nil {
		return nil
	}
	if r.hadEpisode {
		m.episodes[in.Launch] = r.prevEpisode
	} else {
		delete(m.episodes, in.Launch)
	}
	if !r.prevNopause {
		delete(m.nopause, in.Launch)
	}
	if !in.Save || r.episode == "" {
		return nil
	}
	return []Effect{SaveEpisodes{Episodes: maps.Clone(m.episodes)}}
}

// takeOver decides a take-over: wait for the one in flight, answer again
// what the same one answered, refuse, or continue the launch.
func (m *Machine) takeOver(in TakeOverAsked) ([]Effect, error) {
	if _, ok := m.resuming[in.Launch]; ok {
		return []Effect{WaitTakeOver{Launch: in.Launch}}, nil
	}
	if t, ok := m.taken[in.Launch]; ok && t.seq == in.PauseSeq && t.identity == in.Identity &&
		(in.Verdict == sandboxapi.VerdictNotHolding || in.Verdict == sandboxapi.VerdictEnded) && in.RecordSeq == in.PauseSeq {
		// Continued by the same take-over, and not paused since (running, or
		// ended after it): an answer the agent did not get (its request
		// timed out), answered again.
		return []Effect{AnswerAgain{Result: t.rep}}, nil
	}
	switch in.Verdict {
	case sandboxapi.VerdictHeld:
	case sandboxapi.VerdictUnknownLaunch:
		return nil, fmt.Errorf("%w: %s", sandboxd.ErrUnknownLaunch, in.Launch)
	case sandboxapi.VerdictIdentityChanged:
		return nil, fmt.Errorf("%w: %s", ErrIdentityChanged, in.Reason)
	default:
		return nil, fmt.Errorf("%w: %s", ErrNotHolding, in.Reason)
	}
	if m.open != "" {
		return nil, fmt.Errorf("%w: checkpoint %s", ErrAdmissionClosed, m.open)
	}
	// From here until the continue is done a prepare counts the launch as
	// a blocker and leaves it alone: it would otherwise take the held
	// launch for one its agent paused, or pause it under a mark that the
	// end of the take-over then clears.
	m.resuming[in.Launch] = m.marks[in.Launch]
	return []Effect{ContinueTakeOver{Launch: in.Launch}}, nil
}

// takenOver ends a take-over: a prepare that found the launch resuming
// asks again. A continue that failed has stopped the launch: what the
// relay held for its harness must not reach the model server.
func (m *Machine) takenOver(in TakeOverDone) []Effect {
	old := m.resuming[in.Launch]
	delete(m.resuming, in.Launch)
	if old != "" && m.marks[in.Launch] == old {
		delete(m.marks, in.Launch) // the snapshot's checkpoint's mark, if this daemon had it
	}
	effs := []Effect{Notify{}}
	if in.Err != nil {
		return append(effs, m.dropAfterRestore(in.Launch, "take-over failed: "+in.Err.Error(), in.Holding)...)
	}
	m.taken[in.Launch] = takenOver{seq: in.PauseSeq, identity: in.Identity, rep: in.Result}
	return append(effs, m.releaseAfterRestore(in.Launch, "taken over", in.Holding)...)
}

// releaseAfterRestore releases the relay a restored snapshot kept held,
// unless a checkpoint of this daemon's is open: that checkpoint's resume
// releases it then, as if its prepare had taken the hold.
func (m *Machine) releaseAfterRestore(id, why string, holding bool) []Effect {
	if !m.relay || !holding {
		return nil
	}
	if m.open != "" {
		m.heldBy = m.open
		return nil
	}
	return []Effect{RelayRelease{Launch: id, Why: why}}
}

// dropAfterRestore drops what the relay a restored snapshot kept holds:
// the launch it held them for is gone. A checkpoint of this daemon's that
// is open holds the relay again at once, and its resume releases it.
func (m *Machine) dropAfterRestore(id, why string, holding bool) []Effect {
	if !m.relay || !holding {
		return nil
	}
	effs := []Effect{RelayDrop{Launch: id, Why: why}}
	if m.open != "" {
		effs = append(effs, RelayHold{})
		m.heldBy = m.open
	}
	return effs
}

// summarize folds the results of a pause or continue of every launch into
// the one events.PauseReport an ack carries: nil when no launch was
// touched.
func summarize(results []sandboxapi.PauseResult) *events.PauseReport {
	if len(results) == 0 {
		return nil
	}
	results = slices.Clone(results)
	slices.SortFunc(results, func(a, b sandboxapi.PauseResult) int { return strings.Compare(a.Launch, b.Launch) })
	out := &events.PauseReport{Mode: results[0].Mode.String(), PauseSeq: results[0].PauseSeq,
		Identity: results[0].Identity.String(), Wall: results[0].Wall, Uptime: results[0].Uptime}
	var fallbacks []string
	for _, r := range results {
		out.PIDCount += r.PIDCount
		if len(out.PIDs) < 16 {
			out.PIDs = append(out.PIDs, r.PIDs[:min(len(r.PIDs), 16-len(out.PIDs))]...)
		}
		out.Pending = append(out.Pending, r.Pending...)
		if r.Fallback != "" {
			fallbacks = append(fallbacks, r.Launch+": "+r.Fallback)
		}
		out.TookMS += r.TookMS
		out.PauseSeq = max(out.PauseSeq, r.PauseSeq)
	}
	out.Fallback = strings.Join(fallbacks, "; ")
	out.Frozen = true
	for _, r := range results {
		out.Frozen = out.Frozen && r.Frozen
	}
	if len(out.Pending) > 100 {
		out.Pending = out.Pending[:100]
	}
	return out
}
