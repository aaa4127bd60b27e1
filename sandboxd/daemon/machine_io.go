package daemon

import (
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// Input is something that happens to a daemon's checkpoint state: an ask
// (a prepare, a reopen, a launch, a take-over), the end of a job the
// machine started, or what the driver saw of the relay and the launches.
// Only this package's types implement it.
type Input interface{ input() }

// Launch is one launch as the supervisor lists it.
type Launch struct {
	ID    string
	State sandboxapi.State
}

// PrepareAsked is the member's Prepare of Checkpoint (asked again until
// it is ready, and once more at its commit). Launches is the supervisor's
// list; Holding and Durable are the relay's (false and true without one).
type PrepareAsked struct {
	Checkpoint string
	Launches   []Launch
	Holding    bool
	Durable    bool
}

// PauseEnded is the end of a StartPause: Cut when the job was cut short
// (a resume or the end of Run), else the supervisor's answer.
type PauseEnded struct {
	Job        uint64
	Checkpoint string
	Launch     string
	Cut        bool
	Result     sandboxapi.PauseResult
	Err        error
}

// FallbackStopped is the end of a StopLaunch: the stop's error, if any.
type FallbackStopped struct {
	Job        uint64
	Checkpoint string
	Launch     string
	Result     sandboxapi.PauseResult
	Err        error
}

// EndWatched is the end of a WatchEnd: Ended when the launch has ended.
type EndWatched struct {
	Job    uint64
	Launch string
	Ended  bool
}

// Flushed is the end of a Flush.
type Flushed struct{}

// ReopenAsked is the member's Continue of Checkpoint ("": every one):
// first its pauses in flight are cut.
type ReopenAsked struct{ Checkpoint string }

// PausesCut says the pauses a ReopenAsked cut have ended: the launches
// the checkpoint paused can be continued.
type PausesCut struct{ Checkpoint string }

// LaunchContinued says one launch of a ContinueLaunches was continued
// (or its continue failed and stopped it): it is no longer marked.
type LaunchContinued struct{ Launch string }

// Reopened says every launch of a ContinueLaunches was continued.
type Reopened struct{}

// LaunchAsked is a launch request that passed its checks (spec, retire
// marks). Holding is the relay's.
type LaunchAsked struct {
	Launch  string
	Episode string
	Holding bool
	// Edits are the relay edits the launch names, Branch its branch
	// label (RelayLabel).
	Edits  []string
	Branch *sandboxapi.BranchLabel
}

// LaunchRecorded records a launch's episode and whether checkpoints leave
// it alone, before the supervisor starts it.
type LaunchRecorded struct {
	Launch  string
	Episode string
	NoPause bool
}

// LaunchUnrecorded puts back what LaunchRecorded changed: the supervisor
// refused the launch (Save: write the episodes again), or the write of
// LaunchRecorded failed (no Save).
type LaunchUnrecorded struct {
	Launch string
	Save   bool
}

// LaunchRegistered says a LaunchAsked is over, started or not.
type LaunchRegistered struct{ Launch string }

// TakeOverAsked is a Resume of a launch a restored snapshot kept held:
// Verdict and Reason are Held's, RecordSeq the launch's pause sequence now
// (-1: no record).
type TakeOverAsked struct {
	Launch    string
	PauseSeq  int
	Identity  sandboxapi.Identity
	Verdict   sandboxapi.Verdict
	Reason    string
	RecordSeq int
}

// TakeOverDone is the end of a ContinueTakeOver: the continue's result
// and error. Holding is the relay's.
type TakeOverDone struct {
	Launch   string
	PauseSeq int
	Identity sandboxapi.Identity
	Result   sandboxapi.PauseResult
	Err      error
	Holding  bool
}

// Collected is a Collect of a launch that ended while held, its checks
// passed. Holding is the relay's.
type Collected struct {
	Launch  string
	Holding bool
}

// RepointAsked is a relay_repoint request.
type RepointAsked struct {
	URL        string
	Generation uint64
}

// Closing says Run is returning: every job is cut short and no new one
// starts.
type Closing struct{}

func (PrepareAsked) input()     {}
func (PauseEnded) input()       {}
func (FallbackStopped) input()  {}
func (EndWatched) input()       {}
func (Flushed) input()          {}
func (ReopenAsked) input()      {}
func (PausesCut) input()        {}
func (LaunchContinued) input()  {}
func (Reopened) input()         {}
func (LaunchAsked) input()      {}
func (LaunchRecorded) input()   {}
func (LaunchUnrecorded) input() {}
func (LaunchRegistered) input() {}
func (TakeOverAsked) input()    {}
func (TakeOverDone) input()     {}
func (Collected) input()        {}
func (RepointAsked) input()     {}
func (Closing) input()          {}

// Effect is something the driver must do for the machine, in order. Only
// this package's types implement it.
type Effect interface{ effect() }

// Report answers a PrepareAsked.
type Report struct{ Report member.Report }

// StartPause starts job Job: pause Launch for Checkpoint (default mode),
// then feed PauseEnded. Cutting the job cancels the pause.
type StartPause struct {
	Job        uint64
	Checkpoint string
	Launch     string
}

// StopLaunch stops Launch, whose pause in job Job did not confirm and was
// undone (Result), then feed FallbackStopped: the agent relaunches it from
// its saved session.
type StopLaunch struct {
	Job        uint64
	Checkpoint string
	Launch     string
	Result     sandboxapi.PauseResult
}

// WatchEnd starts job Job: wait for Launch, being stopped, to end, then
// feed EndWatched.
type WatchEnd struct {
	Job    uint64
	Launch string
}

// Flush starts job Job: wait until the relay's capture is durable, then
// feed Flushed.
type Flush struct{ Job uint64 }

// CutJobs cuts the jobs short and waits until each has ended (fed its
// end). Jobs the driver no longer runs are skipped.
type CutJobs struct{ Jobs []uint64 }

// ContinueLaunches continues each launch in order, feeding LaunchContinued
// after each, then Reopened. CountHeld: the report counts the relay's held
// calls (read before Reopened releases them).
type ContinueLaunches struct {
	Launches  []string
	CountHeld bool
}

// ContinueTakeOver continues Launch for a take-over, then feeds
// TakeOverDone.
type ContinueTakeOver struct{ Launch string }

// WaitTakeOver answers a TakeOverAsked: the take-over of Launch in flight
// has to end first; ask again then.
type WaitTakeOver struct{ Launch string }

// AnswerAgain answers a TakeOverAsked with what the same take-over
// answered before.
type AnswerAgain struct{ Result sandboxapi.PauseResult }

// SaveEpisodes writes the launches' episodes (episodes.json).
type SaveEpisodes struct{ Episodes map[string]string }

// Notify tells the member that a prepare may be ready now.
type Notify struct{}

// RelayHold holds the relay: no model call starts or is answered.
type RelayHold struct{}

// RelayRelease releases the relay's hold; Launch and Why, when set, say
// which take-over it ends.
type RelayRelease struct{ Launch, Why string }

// RelayDrop drops what the relay holds (Relay.Drop), for Launch.
type RelayDrop struct{ Launch, Why string }

// RelayLabel names the launch the relay's calls belong to from now on,
// and the relay edits applied to them.
type RelayLabel struct {
	Episode, Launch string
	Edits           []string
	// Branch is the launch's branch label (LaunchRequest.Branch), nil
	// for none.
	Branch *sandboxapi.BranchLabel
}

// RelayRepoint re-points the relay.
type RelayRepoint struct {
	URL        string
	Generation uint64
}

func (Report) effect()           {}
func (StartPause) effect()       {}
func (StopLaunch) effect()       {}
func (WatchEnd) effect()         {}
func (Flush) effect()            {}
func (CutJobs) effect()          {}
func (ContinueLaunches) effect() {}
func (ContinueTakeOver) effect() {}
func (WaitTakeOver) effect()     {}
func (AnswerAgain) effect()      {}
func (SaveEpisodes) effect()     {}
func (Notify) effect()           {}
func (RelayHold) effect()        {}
func (RelayRelease) effect()     {}
func (RelayDrop) effect()        {}
func (RelayLabel) effect()       {}
func (RelayRepoint) effect()     {}
