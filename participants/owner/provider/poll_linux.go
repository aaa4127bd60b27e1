//go:build linux

package provider

import (
	"context"
	"os"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
)

// pollWithin calls done (poll.Until, backing off from 100 µs to 20 ms
// between calls) until it reports true, an error, or timeout passes
// (os.ErrDeadlineExceeded) or ctx ends (its error).
func pollWithin(ctx context.Context, timeout time.Duration, done func() (bool, error)) error {
	ctx, cancel := context.WithTimeoutCause(ctx, timeout, os.ErrDeadlineExceeded)
	defer cancel()
	return poll.Until(ctx, poll.Backoff(100*time.Microsecond, 20*time.Millisecond), done)
}
