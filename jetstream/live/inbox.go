package live

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
)

// Inbox is what listens for the answers to one phase; Close ends it.
type Inbox interface {
	Close()
}

// Inboxes holds one inbox a phase, by the phase's sequence. An inbox is
// opened before its phase is published (Open), so that every answer to the
// phase finds it; what hears the answers files each in the inbox of the
// sequence it names (File); the one that gathers the phase takes it (Take)
// and closes it when done (Close). An inbox that nothing takes (the phase's
// operation ended first, a publish was lost) is closed once later phases
// open theirs, beyond Spare. The zero value is ready to use; it is safe for
// concurrent use.
type Inboxes[I Inbox] struct {
	// Spare is how many untaken inboxes of earlier sequences Open keeps,
	// the newest; it closes the others. A taken inbox is kept until it is
	// closed.
	Spare int

	mu    sync.Mutex
	inbox map[uint64]*filed[I]
}

type filed[I Inbox] struct {
	in    I
	taken bool
}

// Open opens the inbox of phase seq with open, unless one is open already,
// and closes the untaken inboxes of earlier sequences beyond Spare. open
// runs under the lock: nothing is filed meanwhile. An error of open is
// returned, and no inbox opened.
func (s *Inboxes[I]) Open(seq uint64, open func() (I, error)) error {
	var drop []I
	defer func() {
		for _, in := range drop {
			in.Close()
		}
	}()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.inbox == nil {
		s.inbox = map[uint64]*filed[I]{}
	}
	if _, ok := s.inbox[seq]; !ok {
		in, err := open()
		if err != nil {
			return err
		}
		s.inbox[seq] = &filed[I]{in: in}
	}
	var earlier []uint64
	for q, f := range s.inbox {
		if q < seq && !f.taken {
			earlier = append(earlier, q)
		}
	}
	slices.Sort(earlier)
	for _, q := range earlier[:max(len(earlier)-s.Spare, 0)] {
		drop = append(drop, s.inbox[q].in)
		delete(s.inbox, q)
	}
	return nil
}

// File returns the inbox of phase seq, for an answer that names it; false
// when none is open.
func (s *Inboxes[I]) File(seq uint64) (I, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.inbox[seq]; ok {
		return f.in, true
	}
	var zero I
	return zero, false
}

// Take returns the inbox of phase seq and keeps it until Close; false when
// none is open.
func (s *Inboxes[I]) Take(seq uint64) (I, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if f, ok := s.inbox[seq]; ok {
		f.taken = true
		return f.in, true
	}
	var zero I
	return zero, false
}

// Untaken returns how many open inboxes nothing took.
func (s *Inboxes[I]) Untaken() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, f := range s.inbox {
		if !f.taken {
			n++
		}
	}
	return n
}

// Close forgets the inbox of phase seq and closes it; answers that name
// seq find none from now on.
func (s *Inboxes[I]) Close(seq uint64) {
	s.mu.Lock()
	f, ok := s.inbox[seq]
	delete(s.inbox, seq)
	s.mu.Unlock()
	if ok {
		f.in.Close()
	}
}

// CloseAll closes every inbox; later phases open new ones.
func (s *Inboxes[I]) CloseAll() {
	s.mu.Lock()
	all := slices.Collect(maps.Values(s.inbox))
	s.inbox = nil
	s.mu.Unlock()
	for _, f := range all {
		f.in.Close()
	}
}

// listenWait bounds Listen's wait for the server under a ctx without a
// deadline, as nats.Conn.Flush does.
const listenWait = 10 * time.Second

// Listen subscribes handler to subject on nc, with room for pendingMsgs
// messages and pendingBytes bytes not yet handled (a fleet answers at
// once: none is dropped for a slow reader, up to a bound on a flood's
// cost), and returns once the server has the subscription: made before a
// publish, no answer to it comes before it. It waits for the server until
// ctx ends, or for listenWait if ctx has no deadline.
func Listen(ctx context.Context, nc *nats.Conn, subject string, handler nats.MsgHandler, pendingMsgs, pendingBytes int) (*nats.Subscription, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, listenWait)
		defer cancel()
	}
	sub, err := nc.Subscribe(subject, handler)
	if err != nil {
		return nil, fmt.Errorf("live: subscribe to %s: %w", subject, err)
	}
	_ = sub.SetPendingLimits(pendingMsgs, pendingBytes)
	if err := nc.FlushWithContext(ctx); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("live: subscribe to %s: %w", subject, err)
	}
	return sub, nil
}
