package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// runState is what the stream says about the run: its last phase event.
type runState struct {
	seq       uint64 // protocol sequence of the last phase event
	streamSeq uint64 // its stream sequence, the fence of the next publish
	epoch     uint64
	last      events.PhaseEvent // nil before the first phase
	lastID    string            // its ce-id
	lastAt    time.Time
}

// view is the run's last phase as the machine takes it with an ask.
func (st runState) view() machine.View {
	return machine.View{Seq: st.seq, StreamSeq: st.streamSeq, Epoch: st.epoch, Last: st.last, LastID: st.lastID, LastAt: st.lastAt}
}

// state reads the run's last phase event back from the stream; when the
// stream no longer holds it (aged out), the head record keeps the run's
// sequence and epoch going.
func (b *Bridge) state(ctx context.Context) (runState, error) {
	var st runState
	p, ok, err := b.lastPhase(ctx, "")
	if err != nil {
		return st, err
	}
	if ok {
		h := p.Event.Header()
		st = runState{seq: h.Seq, streamSeq: p.StreamSeq, epoch: h.Epoch, last: p.Event, lastID: p.ID, lastAt: p.At}
	}
	e, err := b.cfg.Bus.Manifests.Get(ctx, events.HeadKey(b.cfg.Run))
	switch {
	case errors.Is(err, natsjs.ErrKeyNotFound):
	case err != nil:
		return st, fmt.Errorf("bridge: read the head of run %s: %w", b.cfg.Run, err)
	default:
		var h events.Head
		if err := json.Unmarshal(e.Value(), &h); err != nil {
			return st, fmt.Errorf("bridge: the head of run %s does not decode: %w", b.cfg.Run, err)
		}
		if h.Seq > st.seq {
			st.seq, st.epoch = h.Seq, max(st.epoch, h.Epoch)
			st.last, st.lastID = nil, "" // older than the head: not the run's last
		}
	}
	return st, nil
}

// lastPhase reads the last event published on one phase's subject, or
// with phase "" on any phase subject of the run; ok is false when there
// is none.
func (b *Bridge) lastPhase(ctx context.Context, phase events.Phase) (p machine.PhasePublished, ok bool, err error) {
	subject := events.PhaseFilter(b.cfg.Run)
	if phase != "" {
		subject = events.PhaseSubject(b.cfg.Run, phase)
	}
	// From the leader: the next phase is fenced on what this returns,
	// and a replica behind the bridge's last publish would fence it out.
	raw, err := jetstream.LeaderLastMsg(ctx, b.cfg.Conn, jetstream.StreamName, subject)
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return p, false, nil
	}
	if err != nil {
		return p, false, fmt.Errorf("bridge: read the last phase of run %s on %s: %w", b.cfg.Run, subject, err)
	}
	e, d, err := events.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
	if err != nil {
		return p, false, fmt.Errorf("bridge: the phase at stream sequence %d of run %s does not decode: %w", raw.Sequence, b.cfg.Run, err)
	}
	ev, isPhase := d.(events.PhaseEvent)
	if !isPhase {
		return p, false, fmt.Errorf("bridge: stream sequence %d on %s is a %s, not a phase", raw.Sequence, raw.Subject, d.Type())
	}
	return machine.PhasePublished{Event: ev, StreamSeq: raw.Sequence, ID: e.ID(), At: raw.Time}, true, nil
}
