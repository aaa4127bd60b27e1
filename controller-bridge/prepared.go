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
		// A daemon's report is counted as it is only where the record can
		// say it: a mode the record would refuse, or more kinds than it
		// lists, go to one kind that is not still, so that no checker takes
		// what it cannot see for still, and one daemon cannot void the
		// record.
		pids, took := max(p.PIDCount, 0), max(p.TookMS, 0)
		k := pauseKey{p.Mode, p.Frozen, p.Fallback != ""}
		t := r.pauses[k]
		if t == nil && (p.Mode == "" || len(p.Mode) > 64 || len(r.pauses) >= events.MaxListed-1) {
			k = pauseKey{"other", false, true}
			t = r.pauses[k]
		}
		if t == nil {
			still := k.mode != "other" && p.Still()
			t = &events.PauseTally{Mode: k.mode, Frozen: k.frozen, Fallback: k.fallback, Still: still, PIDsMin: pids, PIDsMax: pids}
			r.pauses[k] = t
		}
		t.Count++
		t.PIDsMin, t.PIDsMax, t.TookMaxMS = min(t.PIDsMin, pids), max(t.PIDsMax, pids), max(t.TookMaxMS, took)
	}
}

// partBytes bounds the acks of one part of a record, encoded: well under
// NATS's default 1 MB payload, with the part's counts and lists beside
// (less when those are large: long error details).
const partBytes = 512 << 10

// record returns what was heard, its notable acks in parts of at most
// partBytes, and fewer when the counts and lists every part repeats are
// large, so that each part stays under events.MaxDataSize.
func (r *prepareRecord) record(run string) []events.PrepareAcked {
	sum := r.summary(run)
	budget := partBytes
	if b, err := json.Marshal(sum); err == nil {
		budget = min(partBytes, max(events.MaxDataSize-len(b)-(32<<10), 32<<10))
	}
	var parts [][]events.HeardAck
	var cur []events.HeardAck
	size := 0
	for _, h := range r.notable {
		n := budget + 1 // an ack that does not encode is not added to a part
		if b, err := json.Marshal(h); err == nil {
			n = len(b) + 1
		}
		if n > budget {
			continue
		}
		if size+n > budget && len(cur) > 0 {
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
// parts in order (each part's id drawn once, PROTOCOL §4: a repeat is
// dropped as a duplicate, and no one can publish the id first).
// It runs before the phase that follows the prepare is published, so that
// a checkpoint that commits has its record in the stream, whatever
// happens to the bridge after; a record that cannot be published is
// logged, and the checkpoint goes on.
func (b *Bridge) recordPrepare(ctx context.Context, r *prepareRecord) {
	if r == nil {
		return
	}
	for _, rec := range r.record(b.cfg.Run) {
		id := b.ids.For(b.cfg.Run + "." + strconv.FormatUint(rec.Seq, 10) + ".prepare.acked." + strconv.Itoa(rec.Part))
		msg, err := events.Marshal(b.source, rec, events.WithID(id))
		// An unanswered publish is tried again: the id makes a second
		// copy a duplicate the stream drops.
		for try := 0; err == nil && try < 3; try++ {
			pctx, cancel := context.WithTimeout(ctx, publishAttemptTimeout)
			_, err = jetstream.PublishDedup(pctx, b.cfg.JS, msg)
			cancel()
			if err == nil || ctx.Err() != nil {
				break
			}
			if try < 2 {
				err = nil
			}
		}
		if err != nil {
			b.log.Warn().Err(err).Str("checkpoint", rec.CheckpointID).Int("part", rec.Part).Int("parts", rec.Parts).
				Msg("cannot record the prepare's sandbox acks in the stream")
			return
		}
	}
}
