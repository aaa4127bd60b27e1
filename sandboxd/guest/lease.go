package guest

import (
	"context"
	"sync"
	"time"
)

// Lease is how long the guest may run without word from its owner: when
// it runs out, Run calls the expiry func (the init's: sync and power off),
// so that a dead owner never leaks a running VM. Its timer is the
// monotonic clock, which a restored VM continues from the snapshot: a
// fork's lease goes on from what was left at the snapshot until the host
// renews it.
type Lease struct {
	mu      sync.Mutex
	renewed chan struct{}
	until   time.Time // zero: no lease
}

// NewLease returns a lease that runs out after d (0: none until Renew).
func NewLease(d time.Duration) *Lease {
	l := &Lease{renewed: make(chan struct{}, 1)}
	if d > 0 {
		l.until = time.Now().Add(d)
	}
	return l
}

// Renew moves the end of the lease to d from now.
func (l *Lease) Renew(d time.Duration) {
	l.mu.Lock()
	l.until = time.Now().Add(d)
	l.mu.Unlock()
	select {
	case l.renewed <- struct{}{}:
	default:
	}
}

// Left returns how long the lease has left, and false when there is none.
func (l *Lease) Left() (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.until.IsZero() {
		return 0, false
	}
	return time.Until(l.until), true
}

// Run waits until the lease runs out, then calls expired and returns
// true; or returns false when ctx ends first.
func (l *Lease) Run(ctx context.Context, expired func()) bool {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		left, ok := l.Left()
		switch {
		case ok && left <= 0:
			expired()
			return true
		case ok:
			t.Reset(left)
		default:
			t.Stop()
		}
		select {
		case <-ctx.Done():
			return false
		case <-l.renewed:
		case <-t.C:
		}
	}
}
