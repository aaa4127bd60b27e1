package bridgeapi

import (
	"errors"
	"fmt"

	"github.com/stillpoint/stillpoint/events"
)

// CheckpointRequest asks for a checkpoint.
type CheckpointRequest struct {
	// ID is the checkpoint id; empty picks one (c-<UTC time>). Asking again
	// for an id that already committed or failed returns that result.
	ID string `json:"checkpoint_id,omitempty"`
	// Episodes are the controller's episodes; those no member reports as a
	// restart continue. Empty means every episode the members hold.
	Episodes []string `json:"episodes,omitempty"`
	// Unfinished, when not nil, are the controller's unfinished episodes
	// (dispatched, no result yet). An episode the last checkpoint held
	// whose members are gone is carried forward (PROTOCOL §5, Progress
	// only moves forward) if it is among them, and named retired if not:
	// the controller has its result, or gave it up. Nil: the controller
	// does not say, and every such episode is carried. omitzero, not
	// omitempty: an empty list says "none", a missing one says nothing.
	Unfinished []string `json:"unfinished,omitzero"`
	// Stop parks (kills) the exported work once the checkpoint is durable,
	// and does not resume the fleet.
	Stop bool `json:"stop,omitempty"`
	// TimeoutMS is each phase's deadline from its publish (0: the bridge's
	// default).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Hold stops after prepare with the fleet parked and returns status
	// "prepared"; the bridge renews the lease until Commit or Abort. This is
	// the window for a slow outer save.
	Hold bool `json:"hold,omitempty"`
}

// Validate returns nil for a valid request, else an error wrapping
// ErrBadRequest that names every field that is wrong.
func (r CheckpointRequest) Validate() error {
	var errs []error
	if r.ID != "" {
		if err := events.ValidateCheckpointID(r.ID); err != nil {
			errs = append(errs, err)
		}
	}
	for i, e := range r.Episodes {
		if _, err := events.ParseEpisode(e); err != nil {
			errs = append(errs, fmt.Errorf("episodes[%d]: %w", i, err))
			break
		}
	}
	if len(r.Unfinished) > events.MaxListLen {
		errs = append(errs, fmt.Errorf("unfinished: %d entries, limit %d", len(r.Unfinished), events.MaxListLen))
	}
	for i, e := range r.Unfinished {
		if _, err := events.ParseEpisode(e); err != nil {
			errs = append(errs, fmt.Errorf("unfinished[%d]: %w", i, err))
			break
		}
	}
	if r.TimeoutMS < 0 {
		errs = append(errs, errors.New("timeout_ms: negative"))
	}
	if r.Hold && r.Stop {
		errs = append(errs, errors.New("hold and stop: a held checkpoint is committed with its own stop flag"))
	}
	return badRequest(errs...)
}

// CommitRequest is the body of a held checkpoint's commit.
type CommitRequest struct {
	// Stop parks the fleet as in CheckpointRequest.
	Stop bool `json:"stop"`
}

// RestoreRequest asks for a restore into a fresh fleet.
type RestoreRequest struct {
	// Source is the checkpoint to restore; empty means LATEST.
	Source string `json:"source_checkpoint_id,omitempty"`
	// ID is the restore operation's id; empty picks restore-e<epoch>.
	ID string `json:"restore_id,omitempty"`
	// TimeoutMS is the restore phase's deadline (0: the default).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Rejoin asks for a rejoin (PROTOCOL §5, Rejoin): LATEST restored
	// into the agents and owners that came back fresh while the rest of
	// the fleet served on, in the run's epoch. Its scope is what LATEST
	// holds by those members alone; the members that served are left as
	// they are. Source must be empty or LATEST.
	Rejoin bool `json:"rejoin,omitempty"`
	// Episodes narrows a rejoin's scope to these episode ids (rollout +
	// attempt), the ones the controller still wants continued; empty:
	// all. One LATEST holds by a member that served is left out.
	Episodes []string `json:"episodes,omitempty"`
}

// Validate returns nil for a valid request, else an error wrapping
// ErrBadRequest that names every field that is wrong.
func (r RestoreRequest) Validate() error {
	var errs []error
	if r.Source != "" {
		if err := events.ValidateCheckpointID(r.Source); err != nil {
			errs = append(errs, err)
		}
	}
	if r.ID != "" {
		if err := events.ValidateCheckpointID(r.ID); err != nil {
			errs = append(errs, fmt.Errorf("restore_id: %w", err))
		}
	}
	if r.TimeoutMS < 0 {
		errs = append(errs, errors.New("timeout_ms: negative"))
	}
	if len(r.Episodes) > 0 && !r.Rejoin {
		errs = append(errs, errors.New("episodes: only a rejoin narrows its scope"))
	}
	if len(r.Episodes) > events.MaxListLen {
		errs = append(errs, fmt.Errorf("episodes: %d, limit %d", len(r.Episodes), events.MaxListLen))
	}
	for i, k := range r.Episodes {
		if _, err := events.ParseEpisode(k); err != nil {
			errs = append(errs, fmt.Errorf("episodes[%d]: %w", i, err))
		}
	}
	return badRequest(errs...)
}

// RetireRequest is the body of a retire.
type RetireRequest struct {
	// Episodes are the attempts to refuse (and earlier ones of the same
	// rollouts); at least one.
	Episodes []string `json:"episodes"`
}

// Parse returns the episodes, or an error wrapping ErrBadRequest that
// names the first one that does not parse.
func (r RetireRequest) Parse() ([]events.Episode, error) {
	if len(r.Episodes) == 0 {
		return nil, badRequest(errors.New("retire needs at least one episode"))
	}
	out := make([]events.Episode, 0, len(r.Episodes))
	for i, k := range r.Episodes {
		e, err := events.ParseEpisode(k)
		if err != nil {
			return nil, badRequest(fmt.Errorf("episodes[%d]: %w", i, err))
		}
		out = append(out, e)
	}
	return out, nil
}

// ForgetRequest is the body of a forget.
type ForgetRequest struct {
	// Rollouts are the rollouts whose refusal marks are dropped; at least
	// one.
	Rollouts []string `json:"rollouts"`
}

// Validate returns nil for a valid request, else an error wrapping
// ErrBadRequest naming the first rollout id that is wrong.
func (r ForgetRequest) Validate() error {
	if len(r.Rollouts) == 0 {
		return badRequest(errors.New("forget needs at least one rollout"))
	}
	for i, ro := range r.Rollouts {
		if err := events.ValidateRollout(fmt.Sprintf("rollouts[%d]", i), ro); err != nil {
			return badRequest(err)
		}
	}
	return nil
}

// ReleaseRequest asks the fleet and the bridge to delete what no kept
// checkpoint names.
type ReleaseRequest struct {
	// Keep lists checkpoint ids to keep.
	Keep []string `json:"keep,omitempty"`
	// KeepLatest keeps the newest N committed checkpoints as well.
	KeepLatest int `json:"keep_latest,omitempty"`
}

// Validate returns nil for a valid request, else an error wrapping
// ErrBadRequest naming the first field that is wrong.
func (r ReleaseRequest) Validate() error {
	for i, id := range r.Keep {
		if err := events.ValidateToken(fmt.Sprintf("keep[%d]", i), id); err != nil {
			return badRequest(err)
		}
	}
	if r.KeepLatest < 0 {
		return badRequest(errors.New("keep_latest: negative"))
	}
	return nil
}

// Final reports whether the release keeps nothing: the run's last.
func (r ReleaseRequest) Final() bool { return len(r.Keep) == 0 && r.KeepLatest == 0 }

// badRequest joins errs under ErrBadRequest; nil when there are none.
func badRequest(errs ...error) error {
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return nil
}
