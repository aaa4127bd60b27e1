package owner

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/stillpoint/stillpoint/internal/poll"
)

// waitTurn waits until the provider's bounds (Bounded) let one more
// sandbox start: fewer than Starting starting and fewer than Live live
// (the sessions tracked, and those starting). A start waits its turn; it
// never fails for want of room. A service request (see noHoldKey) that
// finds admission closed while it waits is refused with
// ErrAdmissionClosed, as enter refuses it: the agent waits at its
// boundary for the resume, and the checkpoint does not wait for a queue.
// The caller calls done once the start ended, however it ended.
func (o *Owner) waitTurn(ctx context.Context, sessionID string) (done func(), err error) {
	return o.turn(ctx, sessionID, false)
}

// turn is waitTurn; a grade's sandbox (GradeSandboxes.Fresh) waits only
// for the bound of starts: the live sandboxes it would wait for are the
// sessions, which end after their grades. Grading sandboxes count among
// the live ones the starts of sessions wait for.
func (o *Owner) turn(ctx context.Context, sessionID string, grade bool) (done func(), err error) {
	if o.bounds.Starting == 0 && o.bounds.Live == 0 {
		return func() {}, nil
	}
	noHold := ctx.Value(noHoldKey{}) != nil
	began, said := time.Now(), false
	freed := func() <-chan struct{} {
		o.mu.Lock()
		defer o.mu.Unlock()
		return o.freed
	}
	err = poll.UntilWoken(ctx, poll.Every(turnLook), freed, func() (bool, error) {
		o.mu.Lock()
		if noHold && o.closed {
			o.mu.Unlock()
			return false, ErrAdmissionClosed
		}
		live := len(o.sessions) + o.starting + o.fresh
		if (o.bounds.Starting == 0 || o.starting < o.bounds.Starting) && (grade || o.bounds.Live == 0 || live < o.bounds.Live) {
			o.starting++
			o.mu.Unlock()
			if said {
				o.log.Info().Str("session", sessionID).Dur("waited", time.Since(began)).Msg("start: its turn came")
			}
			done = sync.OnceFunc(func() {
				o.mu.Lock()
				o.starting--
				o.freedLocked()
				o.mu.Unlock()
			})
			return true, nil
		}
		starting := o.starting
		o.mu.Unlock()
		if !said {
			said = true
			o.log.Info().Str("session", sessionID).Int("starting", starting).Int("live", live).
				Int("bound_starting", o.bounds.Starting).Int("bound_live", o.bounds.Live).Msg("start: waiting its turn")
		}
		return false, nil
	})
	switch {
	case errors.Is(err, ErrAdmissionClosed):
		return nil, err
	case err != nil:
		return nil, ctx.Err()
	}
	return done, nil
}

// turnLook is how often a start waiting its turn looks again without a
// wake-up: a session ended by a path that does not wake it.
const turnLook = time.Second

// freedLocked wakes the starts waiting their turn; the caller holds o.mu.
func (o *Owner) freedLocked() {
	close(o.freed)
	o.freed = make(chan struct{})
}
