package sandboxapi

import (
	"errors"
	"fmt"
	"regexp"

	"github.com/stillpoint/stillpoint/events"
)

// ErrBadBranch is wrapped by BranchLabel.Validate's error: a label that
// is not "b<k>" with k from 1.
var ErrBadBranch = errors.New("sandboxapi: bad branch label")

// branchLabel is what BranchLabel.Label may be: b<k>, k ≥ 1, no leading
// zero (events.BranchRollout's suffix).
var branchLabel = regexp.MustCompile(`^b[1-9][0-9]{0,8}$`)

// Validate returns nil for a label "b<k>" (k ≥ 1), else an error
// wrapping ErrBadBranch that names the label.
func (b BranchLabel) Validate() error {
	if !branchLabel.MatchString(b.Label) {
		return fmt.Errorf("%w: %q (want b<k>, k from 1)", ErrBadBranch, b.Label)
	}
	if b.Episode != "" {
		if _, err := events.ParseEpisode(b.Episode); err != nil {
			return fmt.Errorf("%w: episode: %w", ErrBadBranch, err)
		}
	}
	return nil
}
