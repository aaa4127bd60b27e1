//go:build linux

package provider

import (
	"context"
	"os"
	"time"
)

// poll calls done until it reports true, an error, or timeout passes
// (os.ErrDeadlineExceeded), backing off from 100 µs to 20 ms between
// calls.
func poll(ctx context.Context, timeout time.Duration, done func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	wait := 100 * time.Microsecond
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return os.ErrDeadlineExceeded
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}
