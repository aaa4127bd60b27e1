package bridge

import (
	"context"
	"encoding/json"
	"slices"
	"strconv"
	"time"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// prepareRecord gathers, beside the machine, what the sandbox daemons
// answered a prepare this bridge published, for the stream's record of
// it (events.PrepareAcked): their acks travel on core NATS (PROTOCOL §3,
// acks), so the audit log holds this one event instead of an ack per
// daemon. It is fed on the driver's goroutine.
type prepareRecord struct {
	h        events.PhaseHeader
	began    time.Time
	expected []events.Member // the daemons addressed, sorted
	want     map[events.Member]bool
	acks     map[events.Member]events.PrepareAck
	notable  []events.HeardAck // the first MaxListed notable acks, in the order heard
	nNotable int
	pauses   map[pauseKey]*events.PauseTally
	took     []float64
}

// pauseKey is a kind of pause (events.PauseTally).
type pauseKey struct {
	mode             string
	frozen, fallback bool
}

// newPrepareRecord starts the record of prepare h, published about
// began, to members; nil when no sandbox daemon is among them.
func newPrepareRecord(h events.PhaseHeader, members []events.Member, began time.Time) *prepareRecord {
	r := &prepareRecord{h: h, began: began, want: map[events.Member]bool{}, acks: map[events.Member]events.PrepareAck{},
		pauses: map[pauseKey]*events.PauseTally{}}
	for _, m := range members {
		if m.Kind() == events.KindSandbox && !r.want[m] {
			r.want[m] = true
			r.expected = append(r.expected, m)
		}
	}
	if len(r.expected) == 0 {
		return nil
	}
	slices.Sort(r.expected)
	return r
}

// add notes ack, heard at at, if it is an addressed daemon's first
// answer to this prepare.
func (r *prepareRecord) add(ack events.Ack, at time.Time) {
	a, ok := ack.(events.PrepareAck)
	if !ok || !r.want[a.Member] || a.Seq != r.h.Seq || a.CheckpointID != r.h.CheckpointID || a.Epoch != r.h.Epoch {
		return
	}
	if _, dup := r.acks[a.Member]; dup {
		return
	}
	r.acks[a.Member] = a
	r.took = append(r.took, float64(at.Sub(r.began).Microseconds())/1000)
	if a.Notable() {
		r.nNotable++
		if len(r.notable) < events.MaxListed {
			r.notable = append(r.notable, events.HeardAck{At: at, Ack: a})
		}
	}
	if p := a.Pause; p != nil {
		k := pauseKey{p.Mode, p.Frozen, p.Fallback != ""}
		t := r.pauses[k]
		switch {
		case t == nil && len(r.pauses) >= events.MaxListed:
			// More kinds than a record lists: counted as not still, so
			// that no checker takes what it cannot see for still.
			k = pauseKey{"other", false, true}
			if t = r.pauses[k]; t == nil {
				t = &events.PauseTally{Mode: k.mode, Fallback: true, PIDsMin: p.PIDCount, PIDsMax: p.PIDCount}
				r.pauses[k] = t
			}
		case t == nil:
			t = &events.PauseTally{Mode: p.Mode, Frozen: p.Frozen, Fallback: k.fallback, Still: p.Still(), PIDsMin: p.PIDCount, PIDsMax: p.PIDCount}
			r.pauses[k] = t
		}
		t.Count++
		t.PIDsMin, t.PIDsMax, t.TookMaxMS = min(t.PIDsMin, p.PIDCount), max(t.PIDsMax, p.PIDCount), max(t.TookMaxMS, p.TookMS)
	}
}

// partBytes bounds the acks of one part of a record, encoded: well under
// NATS's default 1 MB payload, with the part's counts and lists beside.
const partBytes = 512 << 10

// record returns what was heard, its notable acks in parts of at most
// partBytes.
func (r *prepareRecord) record(run string) []events.PrepareAcked {
	sum := r.summary(run)
	var parts [][]events.HeardAck
	var cur []events.HeardAck
	size := 0
	for _, h := range r.notable {
		n := partBytes // an ack that does not encode is not added to a part
		if b, err := json.Marshal(h); err == nil {
			n = len(b) + 1
		}
		if n > partBytes {
			continue
		}
		if size+n > partBytes && len(cur) > 0 {
			parts, cur, size = append(parts, cur), nil, 0
		}
		cur, size = append(cur, h), size+n
	}
	if len(cur) > 0 || len(parts) == 0 {
		parts = append(parts, cur)
	}
	out := make([]events.PrepareAcked, len(parts))
	for i, acks := range parts {
		out[i] = sum
		out[i].Part, out[i].Parts, out[i].Acks = i+1, len(parts), acks
	}
	return out
}

// summary returns the counts and lists of what was heard.
func (r *prepareRecord) summary(run string) events.PrepareAcked {
	rec := events.PrepareAcked{Run: run, CheckpointID: r.h.CheckpointID, Seq: r.h.Seq, Epoch: r.h.Epoch,
		Expected: len(r.expected), Answered: len(r.acks)}
	for _, m := range r.expected {
		a, ok := r.acks[m]
		switch {
		case !ok:
			rec.MissingCount++
			if len(rec.Missing) < events.MaxListed {
				rec.Missing = append(rec.Missing, m)
			}
		case a.Error != nil:
			rec.ErrorCount++
			if len(rec.Errors) < events.MaxListed {
				rec.Errors = append(rec.Errors, events.MemberError{Member: m, Code: a.Error.Code, Detail: a.Error.Detail})
			}
		case !a.OK || !a.Ready:
			rec.NotReadyCount++
			if len(rec.NotReady) < events.MaxListed {
				rec.NotReady = append(rec.NotReady, m)
			}
		default:
			rec.Ready++
		}
	}
	if len(r.took) > 0 {
		took := slices.Clone(r.took)
		slices.Sort(took)
		rec.P50MS, rec.MaxMS = took[len(took)/2], took[len(took)-1]
	}
	rec.NotableCount = r.nNotable
	for _, t := range r.pauses {
		rec.Pauses = append(rec.Pauses, *t)
	}
	slices.SortFunc(rec.Pauses, func(a, b events.PauseTally) int { return b.Count - a.Count })
	return rec
}

// recordPrepare publishes the record of a prepare's daemons' acks, its
// parts in order (deterministic ids: a repeat is dropped as a duplicate).
// It runs before the phase that follows the prepare is published, so that
// a checkpoint that commits has its record in the stream, whatever
// happens to the bridge after; a record that cannot be published is
// logged, and the checkpoint goes on.
func (b *Bridge) recordPrepare(ctx context.Context, r *prepareRecord) {
	if r == nil {
		return
	}
	for _, rec := range r.record(b.cfg.Run) {
		id := b.cfg.Run + "." + strconv.FormatUint(rec.Seq, 10) + ".prepare.acked." + strconv.Itoa(rec.Part)
		msg, err := events.Marshal(b.source, rec, events.WithID(id))
		if err == nil {
			pctx, cancel := context.WithTimeout(ctx, publishAttemptTimeout)
			_, err = jetstream.PublishDedup(pctx, b.cfg.JS, msg)
			cancel()
		}
		if err != nil {
			b.log.Warn().Err(err).Str("checkpoint", rec.CheckpointID).Int("part", rec.Part).Int("parts", rec.Parts).
				Msg("cannot record the prepare's sandbox acks in the stream")
			return
		}
	}
}
