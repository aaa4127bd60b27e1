package bridge

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// withRoster puts the roster of phase p on the stream before p (PROTOCOL
// §3, Rosters) and returns p naming it. A phase addressed to no sandbox
// daemon is returned as it is; one of the operation whose sandbox daemons
// are those of the last roster this bridge published for it (a resume
// after its prepare) names that roster again. Another operation publishes
// its own: a roster named for days would leave the stream (MaxAge) under
// the phases that name it. The roster's id is drawn once by this process
// for the phase's sequence and the names (PROTOCOL §4), so a publish made
// again after an unanswered one lands once, and no one can publish the
// id first to have the phase name a stranger's message for its roster.
func (b *Bridge) withRoster(ctx context.Context, p events.PhaseEvent) (events.PhaseEvent, error) {
	h := p.Header()
	ref := h.Sandboxes
	if ref == nil || ref.StreamSeq != 0 {
		return p, nil
	}
	if last := b.roster; last != nil && last.Same(*ref) && b.rosterOf == h.CheckpointID {
		r := *ref
		r.Seq, r.StreamSeq = last.Seq, last.StreamSeq
		h.Sandboxes = &r
		return events.WithHeader(p, h), nil
	}
	names, _ := ref.Names()
	roster := events.Roster{Run: b.cfg.Run, CheckpointID: h.CheckpointID, Seq: h.Seq, Epoch: h.Epoch, Members: names}
	id := b.ids.For(b.cfg.Run + "." + fmt.Sprint(h.Seq) + ".roster." + ref.SHA256[:16])
	msg, err := events.Marshal(b.source, roster, events.WithID(id))
	if err != nil {
		return nil, fmt.Errorf("bridge: build the roster of %s seq %d: %w", p.Phase(), h.Seq, err)
	}
	var ack, pubErr = jetstream.PublishDedup(ctx, b.cfg.JS, msg)
	for attempt := 2; pubErr != nil && unanswered(ctx, pubErr) && attempt <= 3; attempt++ {
		b.log.Warn().Err(pubErr).Uint64("seq", h.Seq).Int("attempt", attempt).Msg("roster publish unanswered; publishing the same again")
		ack, pubErr = jetstream.PublishDedup(ctx, b.cfg.JS, msg)
	}
	if pubErr != nil {
		return nil, fmt.Errorf("bridge: publish the roster of %s seq %d (%d sandbox daemons): %w", p.Phase(), h.Seq, ref.Count, pubErr)
	}
	published := roster.Ref(ack.Sequence)
	b.roster, b.rosterOf = &published, h.CheckpointID
	h.Sandboxes = &published
	return events.WithHeader(p, h), nil
}

// expandRoster returns p with the names of the roster it names, read from
// the stream by its sequence and checked against the phase (its run,
// subject, count and digest). A phase without a roster, or one whose names
// are known, is returned as it is.
func (b *Bridge) expandRoster(ctx context.Context, p events.PhaseEvent) (events.PhaseEvent, error) {
	h := p.Header()
	if h.Sandboxes == nil {
		return p, nil
	}
	if _, ok := h.Sandboxes.Names(); ok {
		return p, nil
	}
	ref := *h.Sandboxes
	raw, err := b.cfg.Bus.Stream.GetMsg(ctx, ref.StreamSeq)
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return b.rosterFromView(ctx, p)
	}
	if err != nil {
		return nil, fmt.Errorf("bridge: the roster of %s seq %d at stream sequence %d: %w", p.Phase(), h.Seq, ref.StreamSeq, err)
	}
	if want := events.RosterSubject(b.cfg.Run, ref.Seq); raw.Subject != want {
		return nil, fmt.Errorf("%w: the roster of %s seq %d: stream sequence %d is on %s, not %s",
			events.ErrMismatch, p.Phase(), h.Seq, ref.StreamSeq, raw.Subject, want)
	}
	_, d, err := events.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
	if err != nil {
		return nil, fmt.Errorf("bridge: the roster of %s seq %d: %w", p.Phase(), h.Seq, err)
	}
	roster, ok := d.(events.Roster)
	if !ok {
		return nil, fmt.Errorf("%w: the roster of %s seq %d is a %s", events.ErrMismatch, p.Phase(), h.Seq, d.Type())
	}
	if roster.Run != b.cfg.Run {
		return nil, fmt.Errorf("%w: the roster of %s seq %d is of run %s", events.ErrMismatch, p.Phase(), h.Seq, roster.Run)
	}
	full, err := ref.Expand(roster)
	if err != nil {
		return nil, fmt.Errorf("bridge: the roster of %s seq %d: %w", p.Phase(), h.Seq, err)
	}
	h.Sandboxes = &full
	return events.WithHeader(p, h), nil
}

// sandboxCount is the number of sandbox daemons phase h addresses by its
// roster.
func sandboxCount(h events.PhaseHeader) int {
	if h.Sandboxes == nil {
		return 0
	}
	return h.Sandboxes.Count
}

// rosterFromView stands in for the roster of p gone from the stream (aged
// out under a checkpoint held prepared longer than the stream's MaxAge,
// or purged): p with the sandbox daemons alive now. Those are the roster's
// daemons less the ones gone since, which would be left out anyway, and
// plus the ones listed since, which take a phase with a roster too; the
// alternative, failing, would leave the run's open operation unrecoverable.
func (b *Bridge) rosterFromView(ctx context.Context, p events.PhaseEvent) (events.PhaseEvent, error) {
	h := p.Header()
	v, err := b.view(ctx)
	if err != nil {
		return nil, err
	}
	if err := v.sync(ctx, b); err != nil {
		return nil, err
	}
	var names []events.Member
	for _, info := range v.snapshot(b.cfg.Now()) {
		if info.Member.Kind() == events.KindSandbox {
			names = append(names, info.Member)
		}
	}
	ref := events.NewRosterRef(names)
	b.log.Warn().Str("phase", string(p.Phase())).Uint64("seq", h.Seq).Uint64("roster_stream_seq", h.Sandboxes.StreamSeq).
		Int("listed", h.Sandboxes.Count).Int("alive", ref.Count).
		Msg("the phase's roster is gone from the stream; taking the sandbox daemons alive now for it")
	h.Sandboxes = &ref
	return events.WithHeader(p, h), nil
}
