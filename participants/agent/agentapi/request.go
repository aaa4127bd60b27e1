package agentapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/stillpoint/stillpoint/events"
)

// Request asks for one rollout.
type Request struct {
	RolloutID string          `json:"rollout_id"`
	Attempt   int             `json:"attempt"`
	Task      json.RawMessage `json:"task"`
}

// Validate checks the request's ids and task; the errors, joined, wrap
// events.ErrInvalid.
func (r Request) Validate() error {
	var errs []error
	if err := events.ValidateRollout("rollout_id", r.RolloutID); err != nil {
		errs = append(errs, err)
	}
	if r.Attempt < 0 {
		errs = append(errs, fmt.Errorf("%w: attempt %d is negative", events.ErrInvalid, r.Attempt))
	}
	if t := bytes.TrimSpace(r.Task); len(t) == 0 || bytes.Equal(t, []byte("null")) || !json.Valid(t) {
		errs = append(errs, fmt.Errorf("%w: task: required, a JSON value", events.ErrInvalid))
	}
	return errors.Join(errs...)
}

// Result is a verified rollout.
type Result struct {
	RolloutID string `json:"rollout_id"`
	Attempt   int    `json:"attempt"`
	// Episode is the episode key, <rollout> or <rollout>-a<attempt>.
	Episode string `json:"episode"`
	// Adapter names the harness adapter.
	Adapter string `json:"adapter"`
	// Answer is what the harness answered; Verdict the owner's grade.
	Answer  json.RawMessage `json:"answer,omitempty"`
	Verdict json.RawMessage `json:"verdict,omitempty"`
	// Restart tells a rollout nothing could save (restarted from its input
	// after a crash); Restored one that continued from a checkpoint.
	Restart  bool `json:"restart,omitempty"`
	Restored bool `json:"restored,omitempty"`
	// Launches is the launch log.
	Launches []LaunchRecord `json:"launches"`
}
