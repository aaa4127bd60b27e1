package feed

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
)

// catchUp reads from the stream, by direct get of the next message on the
// feed's subjects after c.from, everything up to the stream's end, and
// delivers in stream order what was not delivered yet.
func (c *Core) catchUp(ctx context.Context) error {
	c.catchUps.Add(1)
	if c.scoped {
		return c.catchUpScoped(ctx)
	}
	filters := []string{events.PhaseFilter(c.runID)}
	if len(c.subjects) > 1 {
		filters = append(filters, c.subjects[1:]...)
	}
	next := make([]*natsjs.RawStreamMsg, len(filters))
	done := make([]bool, len(filters))
	for {
		for i, s := range filters {
			if next[i] != nil || done[i] {
				continue
			}
			gctx, cancel := context.WithTimeout(ctx, callTimeout)
			msg, err := c.next.GetMsg(gctx, c.from+1, natsjs.WithGetMsgSubject(s))
			cancel()
			switch {
			case ctx.Err() != nil:
				return errStopping
			case errors.Is(err, natsjs.ErrMsgNotFound):
				done[i] = true
			case err != nil:
				return fmt.Errorf("member: core feed: direct get of %s after %d: %w", s, c.from, err)
			default:
				next[i] = msg
			}
		}
		first := -1
		for i, msg := range next {
			if msg != nil && (first < 0 || msg.Sequence < next[first].Sequence) {
				first = i
			}
		}
		if first < 0 {
			return nil
		}
		msg := next[first]
		next[first] = nil
		c.from = msg.Sequence
		dl := newCoreDelivery(&nats.Msg{Subject: msg.Subject, Header: msg.Header, Data: msg.Data}, msg.Sequence, c.pos, c.again)
		if !c.deliver(dl) {
			return errStopping
		}
	}
}

// track keeps which operations the phases delivered opened (a prepare,
// a restore) and did not end (a resume): the member may hold one of them
// open, and a catch-up delivers what it finds of their end.
func (c *Core) track(dl *coreDelivery) {
	_, data, _ := dl.Event()
	pe, ok := data.(events.PhaseEvent)
	if !ok {
		return
	}
	id := pe.Header().CheckpointID
	switch pe.Phase() {
	case events.PhasePrepare, events.PhaseRestore:
		c.opened = append(slices.DeleteFunc(c.opened, func(o string) bool { return o == id }), id)
		if len(c.opened) > openedKept {
			c.opened = c.opened[1:]
		}
	case events.PhaseResume:
		c.opened = slices.DeleteFunc(c.opened, func(o string) bool { return o == id })
	}
}

// catchUpScoped is catchUp for a sandbox's own user (Config.NoPull), whose
// direct gets must name their subject and who makes no consumer
// (docs/PERMISSIONS.md): the server reads a next-by-subject request from
// its body, which no permission can limit to one run. The newest of the
// run's phases, by a direct get whose subject names the run's phases,
// tells whether anything was missed: nothing, or only that phase, in the
// common case. When more was missed, catchUpNewest reads the newest phase
// of each kind.
func (c *Core) catchUpScoped(ctx context.Context) error {
	if err := c.catchUpPhasesScoped(ctx); err != nil {
		return err
	}
	if len(c.subjects) == 1 {
		return nil
	}
	// A participant that parks: the newest committed outcome, which a
	// stop commit waits for (one delivered already is known by its id).
	msg, err := c.last(ctx, events.OutcomeSubject(c.runID, events.TypeCheckpointCommitted))
	if err != nil || msg == nil {
		return err
	}
	if !c.deliver(newCoreDelivery(&nats.Msg{Subject: msg.Subject, Header: msg.Header, Data: msg.Data}, msg.Sequence, c.pos, c.again)) {
		return errStopping
	}
	return nil
}

// last reads the last message on subject: nil when there is none.
func (c *Core) last(ctx context.Context, subject string) (*natsjs.RawStreamMsg, error) {
	gctx, cancel := context.WithTimeout(ctx, callTimeout)
	msg, err := c.stream.GetLastMsgForSubject(gctx, subject)
	cancel()
	switch {
	case ctx.Err() != nil:
		return nil, errStopping
	case errors.Is(err, natsjs.ErrMsgNotFound):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("member: core feed: direct get of the last of %s: %w", subject, err)
	}
	return msg, nil
}

func (c *Core) catchUpPhasesScoped(ctx context.Context) error {
	msg, err := c.last(ctx, events.PhaseFilter(c.runID))
	if err != nil || msg == nil || msg.Sequence <= c.from {
		return err
	}
	dl := newCoreDelivery(&nats.Msg{Subject: msg.Subject, Header: msg.Header, Data: msg.Data}, msg.Sequence, c.pos, c.again)
	q, _ := dl.phaseSeq()
	// What arrived meanwhile (held back while behind) may be all that was
	// missed: then flushPending delivers it, each phase as it was.
	for _, m := range c.take() {
		c.received(m, true)
	}
	switch {
	case q <= c.lastQ || c.based && q == c.lastQ+1:
		if !c.deliver(dl) {
			return errStopping
		}
		c.from = max(c.from, msg.Sequence)
		return nil
	case c.covered(q):
		return nil
	}
	return c.catchUpNewest(ctx)
}

// covered tells whether the live copies received past the last phase
// delivered lead one after the other up to phase q (the next sequence, or
// a copy that names the one before it as its previous): nothing between
// is missing.
func (c *Core) covered(q uint64) bool {
	if !c.based {
		return false
	}
	at := c.lastQ
	for at < q {
		next := uint64(0)
		for p, dl := range c.pending {
			if p > at && (next == 0 || p < next) && (p == at+1 || dl.follows(at)) {
				next = p
			}
		}
		if next == 0 {
			return false
		}
		at = next
	}
	return true
}

// catchUpNewest reads the newest phase of each kind (one direct get each,
// its subject naming it) and delivers, in phase order, those past what was
// delivered that the member must act on (PROTOCOL §3, Consumers): every
// phase of the run's newest operation (that of the newest phase), every
// retire, forget and release (each whole in itself: marks to keep, work to
// stop, nothing to delete for a member that holds nothing), and the
// resume, commit or renew of an operation the member opened (track). The
// rest belongs to operations that ended, whose other phases are gone
// (only the newest of each kind is kept by subject): acting on a prepare
// or a restore of those without what followed it would close admission
// for an operation long over. Before the first phase delivered of an
// operation it did not open, the loop hears that phases were missed
// (Missed): an operation still open on the member has ended by then,
// and its resume, if not among those read, is gone.
func (c *Core) catchUpNewest(ctx context.Context) error {
	var got []*coreDelivery
	stop := "" // the checkpoint of the newest commit, when it had stop
	for _, p := range events.Phases {
		msg, err := c.last(ctx, events.PhaseSubject(c.runID, p))
		if err != nil {
			return err
		}
		if msg == nil {
			continue
		}
		dl := newCoreDelivery(&nats.Msg{Subject: msg.Subject, Header: msg.Header, Data: msg.Data}, msg.Sequence, c.pos, c.again)
		_, data, _ := dl.Event()
		if cm, ok := data.(events.Commit); ok && cm.Stop {
			stop = cm.CheckpointID
		}
		if q, _ := dl.phaseSeq(); q != 0 && (c.based && q > c.lastQ || !c.based && msg.Sequence > c.from) {
			got = append(got, dl)
		}
	}
	if len(got) == 0 {
		return nil
	}
	slices.SortFunc(got, func(a, b *coreDelivery) int {
		qa, _ := a.phaseSeq()
		qb, _ := b.phaseSeq()
		return cmp.Compare(qa, qb)
	})
	header := func(dl *coreDelivery) (events.PhaseHeader, events.Phase) {
		_, data, _ := dl.Event()
		pe := data.(events.PhaseEvent)
		return pe.Header(), pe.Phase()
	}
	newest, _ := header(got[len(got)-1])
	c.log.Info().Uint64("last_seen", c.lastQ).Uint64("newest", newest.Seq).Str("newest_operation", newest.CheckpointID).
		Msg("more than one phase missed; acting on the newest of each kind")
	told := false
	for _, dl := range got {
		h, p := header(dl)
		opened := slices.Contains(c.opened, h.CheckpointID)
		switch {
		// A branch is acted on only as the newest operation: one that
		// ended has been completed or retired without this member.
		case h.CheckpointID == newest.CheckpointID, p == events.PhaseRetire, p == events.PhaseForget, p == events.PhaseRelease,
			opened && (p == events.PhaseResume || p == events.PhaseCommit || p == events.PhaseRenew):
		default:
			c.log.Debug().Uint64("seq", h.Seq).Str("phase", string(p)).Str("operation", h.CheckpointID).
				Msg("a phase of an operation that ended, without the phases after it: not acted on")
			c.from = max(c.from, dl.seq)
			continue
		}
		if !opened && !told {
			told = true
			select {
			case c.inbox <- Missed{Next: h.CheckpointID, Epoch: h.Epoch, StopCommit: stop}:
			case <-c.stopping:
				return errStopping
			}
		}
		if !c.deliver(dl) {
			return errStopping
		}
	}
	return nil
}

// flushPending delivers, in phase order, what the subscription received
// past a gap and the catch-up did not read. A gap that is still there is
// waited for (it reports gap), unless anyway: then what follows it is
// delivered as it is. ok is false when the feed stops first.
func (c *Core) flushPending(anyway bool) (gap, ok bool) {
	if dl := c.pending[0]; dl != nil {
		delete(c.pending, 0)
		if !c.deliver(dl) {
			return false, false
		}
	}
	qs := make([]uint64, 0, len(c.pending))
	for q := range c.pending {
		qs = append(qs, q)
	}
	slices.Sort(qs)
	for _, q := range qs {
		if q <= c.lastQ {
			delete(c.pending, q)
			continue
		}
		missing := c.based && q > c.lastQ+1 && !c.pending[q].follows(c.lastQ)
		if missing && !anyway {
			return true, true
		}
		if missing {
			c.log.Warn().Uint64("last_seen", c.lastQ).Uint64("seq", q).
				Msg("phases missing before this one are not in the stream; taking it as it is")
		}
		dl := c.pending[q]
		delete(c.pending, q)
		if !c.deliver(dl) {
			return false, false
		}
	}
	return false, true
}
