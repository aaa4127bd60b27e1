package agentapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/stillpoint/stillpoint/events"
)

// BookmarkVersion is the bookmark format this package writes and reads.
const BookmarkVersion = 1

// Stage is where a rollout goes next (PROTOCOL §6, Bookmark v1).
type Stage string

// The stages, in order.
const (
	// StageSeed asks the owner for the session's sandbox.
	StageSeed Stage = "seed"
	// StageLaunch launches (or relaunches) the harness and waits for it.
	// Its wire value is "harness", as PROTOCOL §6 names it.
	StageLaunch Stage = "harness"
	// StageVerify asks the owner for the grade.
	StageVerify Stage = "verify"
	// StageReturn returns the stored result.
	StageReturn Stage = "return"
)

// ErrBadBookmark is wrapped by DecodeBookmark and Bookmark.Validate: the
// attempt fails with an error that names what is wrong.
var ErrBadBookmark = errors.New("agentapi: bad bookmark")

// Launch outcomes in the launch log.
const (
	LaunchRunning     = "running"
	LaunchFinished    = "finished"
	LaunchInterrupted = "interrupted"
	LaunchFailed      = "failed"
)

// LaunchRecord is one launch of a rollout's harness, as the launch log in
// the bookmark and in the result tells it.
type LaunchRecord struct {
	// ID is the launch id in the sandbox's daemon; Sandbox the sandbox.
	ID      string `json:"id"`
	Sandbox string `json:"sandbox"`
	// Attempt is the attempt that launched it.
	Attempt int `json:"attempt"`
	// Continued tells whether the launch continued a saved session, and
	// Why says why (or why it started over).
	Continued bool   `json:"continued"`
	Why       string `json:"why"`
	// Started is when it was launched; DurationMS how long it ran until it
	// ended (paused time included).
	Started    time.Time `json:"started"`
	DurationMS int64     `json:"duration_ms,omitempty"`
	// Ended is running, finished, interrupted or failed.
	Ended string `json:"ended"`
	// ExitCode is the harness's exit code once it finished.
	ExitCode int `json:"exit_code,omitempty"`
	// Pauses is how many checkpoints paused it in place.
	Pauses int `json:"pauses"`
	// Detail says how it ended, for an interrupted or failed launch.
	Detail string `json:"detail,omitempty"`
	// Relay is true when the harness reached the model through the
	// sandbox's relay on a provider whose snapshots keep processes: a
	// restore may then take the launch over in place.
	Relay bool `json:"relay,omitempty"`
	// Captured is true when the harness reached the model through the
	// sandbox's relay and the relay captured its calls (on any provider):
	// they are in the rollout's trajectory.
	Captured bool `json:"captured,omitempty"`
	// Held is the pause a checkpoint held the launch in, as its daemon
	// acknowledged it: what a restore checks the restored launch against.
	Held *HeldPause `json:"held,omitempty"`
	// Rebind is what a restore did with the launch its snapshot kept
	// (one of the Rebind constants), RebindWhy why, and Clock the clock
	// decision it applied.
	Rebind    string `json:"rebind,omitempty"`
	RebindWhy string `json:"rebind_why,omitempty"`
	Clock     string `json:"clock,omitempty"`
}

// HeldPause is a held launch's pause: pause N, the supervisor that held
// it, the sandbox's clocks when it acknowledged the pause (pause_wall,
// pause_uptime), and whether the hold froze the launch.
type HeldPause struct {
	Seq int `json:"seq"`
	// Identity is the supervisor's identity, "<pid>:<start>".
	Identity string    `json:"identity"`
	Wall     time.Time `json:"pause_wall"`
	Uptime   float64   `json:"pause_uptime"`
	Frozen   bool      `json:"frozen,omitempty"`
}

// The outcomes of re-binding a launch a process-keeping snapshot kept
// (LaunchRecord.Rebind; PROTOCOL §6, Restore of a process-keeping
// snapshot). Every one but RebindResumed and RebindCollected abandons the
// launch (KILL, no continue) and relaunches from the saved session.
const (
	// RebindResumed: taken over and continued in place.
	RebindResumed = "resumed_in_place"
	// RebindCollected: it had ended; its receipt was collected.
	RebindCollected = "ended_collected"
	// RebindRelayGone: the sandbox's relay is not up.
	RebindRelayGone = "relay_gone"
	// RebindIdentityChanged: another supervisor owns the launch.
	RebindIdentityChanged = "identity_changed"
	// RebindNotHolding: the launch is not held in the recorded pause (or
	// its daemon does not know it).
	RebindNotHolding = "not_holding"
	// RebindTakeoverFailed: a step of the take-over failed.
	RebindTakeoverFailed = "takeover_failed"
)

// Bookmark is a rollout's position, recorded before each stage; a
// checkpoint exports it and a restore continues from it.
type Bookmark struct {
	// V is the format version, BookmarkVersion.
	V int `json:"v"`
	// Next is the stage to run next.
	Next Stage `json:"next"`
	// Rollout, Attempt and Task are the request; Attempt is the attempt
	// that recorded the bookmark.
	Rollout string          `json:"rollout"`
	Attempt int             `json:"attempt"`
	Task    json.RawMessage `json:"task"`
	// Session is the owner's session id (the session cookie); Owner the
	// owner that lends its sandbox.
	Session string `json:"session,omitempty"`
	Owner   string `json:"owner,omitempty"`
	// VerifyMode is how the rollout is graded: "owner" (the owner's verify).
	VerifyMode string `json:"verify_mode,omitempty"`
	// Sandbox is the sandbox last lent (a hint: sandbox_access says which
	// is current) and Workdir its working directory.
	Sandbox string `json:"sandbox,omitempty"`
	Workdir string `json:"workdir,omitempty"`
	// Restart marks a rollout nothing can save: never parked, restarted
	// from its input after a crash.
	Restart bool `json:"restart,omitempty"`
	// State is the adapter's state (where the harness keeps its session).
	State json.RawMessage `json:"state,omitempty"`
	// Resume tells the next launch to continue the saved session, if the
	// adapter's resume decision agrees.
	Resume bool `json:"resume,omitempty"`
	// Launches is the launch log.
	Launches []LaunchRecord `json:"launches,omitempty"`
	// Answer is what the harness answered (set once a launch finished).
	Answer json.RawMessage `json:"answer,omitempty"`
	// Result is the result to return (at StageReturn).
	Result *Result `json:"result,omitempty"`
	// KeepsProcesses tells that the sandbox's provider keeps processes in
	// its snapshots and the last launch went through the sandbox's model
	// relay; RelayGen is the relay's upstream generation the agent set
	// last (PROTOCOL §6). A bookmark without them restores through the
	// relaunch path.
	KeepsProcesses bool   `json:"keeps_processes,omitempty"`
	RelayGen       uint64 `json:"relay_gen,omitempty"`
	// Trajectory is the rollout's trajectory, stored once its harness
	// finished (before the grade, which ends the sandbox); NoTrajectory
	// says why there is none. A restored attempt at verify grades with
	// them, the sandbox being gone by then.
	Trajectory   *TrajectoryRef `json:"trajectory,omitempty"`
	NoTrajectory string         `json:"no_trajectory,omitempty"`
	// Branch, on a branch's bookmark (PROTOCOL §5, Branch), says which
	// checkpointed episode it forks: its launches and relay re-points
	// label its model calls, and its trajectory names the branch point.
	// An added optional field: a bookmark without it is no branch's.
	Branch *BranchRef `json:"branch,omitempty"`
}

// BranchRef is what a branch's bookmark keeps of its branch: the parent's
// capture key, its number and seed, the checkpoint it was forked from,
// and its label on model calls.
type BranchRef struct {
	// Parent is the parent episode's capture key (events.Episode.String).
	Parent string `json:"parent"`
	// K is the branch's number, from 1.
	K int `json:"k"`
	// Seed is the branch's sampling seed.
	Seed uint64 `json:"seed"`
	// Source is the checkpoint the branch was forked from.
	Source string `json:"source_checkpoint_id"`
	// Label is "b<K>", the branch's label on its model calls.
	Label string `json:"label"`
}

// validate checks b as the branch of rollout: its label "b<k>" with k from
// 1, its parent a capture key whose rollout rollout branches, its source a
// token.
func (b *BranchRef) validate(rollout string) error {
	var errs []error
	if b.K < 1 {
		errs = append(errs, fmt.Errorf("k: %d, want 1 or more", b.K))
	}
	if want := "b" + strconv.Itoa(b.K); b.Label != want {
		errs = append(errs, fmt.Errorf("label %.20q: branch %d's is %q", b.Label, b.K, want))
	}
	parent, err := events.ParseEpisode(b.Parent)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("parent: %w", err))
	case events.BranchRollout(parent.Rollout, b.K) != rollout:
		errs = append(errs, fmt.Errorf("parent %s: branch %d of it is %s, not %s", b.Parent, b.K, events.BranchRollout(parent.Rollout, b.K), rollout))
	}
	if err := events.ValidateToken("source_checkpoint_id", b.Source); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Validate checks b: its version, its stage and what that stage needs.
func (b *Bookmark) Validate() error {
	if b.V != BookmarkVersion {
		return fmt.Errorf("%w: version %d, this agent reads version %d", ErrBadBookmark, b.V, BookmarkVersion)
	}
	var errs []error
	if err := events.ValidateRollout("bookmark.rollout", b.Rollout); err != nil {
		errs = append(errs, err)
	}
	if b.Attempt < 0 {
		errs = append(errs, fmt.Errorf("bookmark.attempt: %d is negative", b.Attempt))
	}
	need := func(ok bool, field string) {
		if !ok {
			errs = append(errs, fmt.Errorf("bookmark.%s: required at stage %s", field, b.Next))
		}
	}
	switch b.Next {
	case StageSeed:
	case StageLaunch:
		need(b.Session != "", "session")
		need(len(b.State) > 0, "state")
	case StageVerify:
		need(b.Session != "", "session")
	case StageReturn:
		need(b.Result != nil, "result")
	default:
		errs = append(errs, fmt.Errorf("bookmark.next: unknown stage %q (want seed, harness, verify or return)", b.Next))
	}
	if b.Session != "" {
		if err := events.ValidateRollout("bookmark.session", b.Session); err != nil {
			errs = append(errs, err)
		}
	}
	if b.Trajectory != nil {
		if err := b.Trajectory.validate(b.Rollout); err != nil {
			errs = append(errs, fmt.Errorf("bookmark.trajectory: %w", err))
		}
	}
	if b.Branch != nil {
		if err := b.Branch.validate(b.Rollout); err != nil {
			errs = append(errs, fmt.Errorf("bookmark.branch: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrBadBookmark, err)
	}
	return nil
}

// DecodeBookmark decodes and validates a bookmark; the error names what is
// wrong.
func DecodeBookmark(raw []byte) (Bookmark, error) {
	var b Bookmark
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || t[0] != '{' {
		return b, fmt.Errorf("%w: not a JSON object: %.40q", ErrBadBookmark, t)
	}
	var head struct {
		V *int `json:"v"`
	}
	if err := json.Unmarshal(t, &head); err != nil {
		return b, fmt.Errorf("%w: %v", ErrBadBookmark, err)
	}
	if head.V == nil {
		return b, fmt.Errorf("%w: no version field \"v\"", ErrBadBookmark)
	}
	if *head.V != BookmarkVersion {
		return b, fmt.Errorf("%w: version %d, this agent reads version %d", ErrBadBookmark, *head.V, BookmarkVersion)
	}
	if err := json.Unmarshal(t, &b); err != nil {
		return b, fmt.Errorf("%w: %v", ErrBadBookmark, err)
	}
	return b, b.Validate()
}

// Clone returns a copy of b that shares no slice with it.
func (b Bookmark) Clone() Bookmark {
	b.Task = bytes.Clone(b.Task)
	b.State = bytes.Clone(b.State)
	b.Answer = bytes.Clone(b.Answer)
	b.Launches = cloneLaunches(b.Launches)
	if b.Result != nil {
		r := *b.Result
		r.Launches = cloneLaunches(r.Launches)
		r.Trajectory = r.Trajectory.clone()
		b.Result = &r
	}
	b.Trajectory = b.Trajectory.clone()
	if b.Branch != nil {
		br := *b.Branch
		b.Branch = &br
	}
	return b
}

// cloneLaunches copies a launch log, its held pauses too.
func cloneLaunches(ls []LaunchRecord) []LaunchRecord {
	out := append([]LaunchRecord(nil), ls...)
	for i := range out {
		if out[i].Held != nil {
			h := *out[i].Held
			out[i].Held = &h
		}
	}
	return out
}
