package bridge

import (
	"context"
	"time"

	"github.com/stillpoint/stillpoint/controller-bridge/machine"
)

// hold is a checkpoint held prepared for an outer save: its machine, which
// stays in machine.StateHeld, and the goroutine that renews the lease.
type hold struct {
	m    *machine.Machine
	id   string
	stop context.CancelFunc
	done chan struct{}
}

// startHold keeps m, held prepared, and renews its lease every `every`
// (the timer the machine set) until takeHold. Once Run is ending it keeps
// nothing and returns false: the caller abandons the checkpoint. The
// caller holds the operation slot.
func (b *Bridge) startHold(m *machine.Machine, every time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return false
	}
	ctx, cancel := context.WithCancel(b.bgCtx)
	h := &hold{m: m, id: m.Held(), stop: cancel, done: make(chan struct{})}
	b.held = h
	b.bg.Go(func() {
		defer close(h.done)
		b.renewLoop(ctx, h, every)
	})
	b.log.Info().Str("checkpoint", h.id).Dur("renew_every", every).Msg("checkpoint held prepared")
	return true
}

// takeHold ends the hold and returns it (nil if there is none): no renew
// runs after it returns. The caller holds the operation slot, so the
// renewer is never in the middle of a renew.
func (b *Bridge) takeHold() *hold {
	b.mu.Lock()
	h := b.held
	b.held = nil
	b.mu.Unlock()
	if h != nil {
		h.stop()
		<-h.done
	}
	return h
}

// heldID is the id of the checkpoint held prepared, "" when none.
func (b *Bridge) heldID() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held == nil {
		return ""
	}
	return b.held.id
}

// renewLoop renews the held checkpoint's lease each time the machine's
// timer runs out: a renew is an operation of its own, one at a time with
// the others. A renew that fails is logged and tried again (a Note).
func (b *Bridge) renewLoop(ctx context.Context, h *hold, every time.Duration) {
	timer := time.NewTimer(every)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		if b.lock(ctx) != nil {
			return
		}
		d := b.newDriving(h.m)
		err := d.step(ctx, machine.Tick{})
		d.close()
		b.unlock()
		if err != nil {
			b.log.Error().Err(err).Str("checkpoint", h.id).Msg("renewing the held checkpoint")
		}
		if d.after > 0 {
			every = d.after
		}
		timer.Reset(every)
	}
}
