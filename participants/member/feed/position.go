package feed

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
)

// phaseFloor is the core feed's position: the phase sequence below which
// every phase is handled, and the stream sequence below which every event
// is (only a phase read from the stream carries one). A restarted member
// catches up from the stream sequence and skips the phases up to the
// phase sequence.
//
// It is written durably at most every positionEvery and when the feed
// stops, as a write per phase costs a fleet of daemons more than their
// acks. A position that lags is safe: the phases after it are read again,
// and one answered is known by its ack or is idempotent (PROTOCOL §5,
// Idempotence). A daemon's prepare ack is not on the stream, so past a
// prepare the position is written at once, in place and without fsyncs
// (positionFile): a process crash keeps it, a machine crash takes the
// sandbox with it.
type phaseFloor struct {
	mu      sync.Mutex // run delivers, the loop handles, the timer flushes
	run     string
	member  string
	log     zerolog.Logger
	pending map[uint64]bool   // phase sequences delivered, not handled
	at      map[uint64]uint64 // stream sequence of a phase read from the stream
	high    uint64
	saved   position  // as written last
	synced  bool      // saved was written durably
	next    position  // as it is now: saved, or one waiting for the timer
	wrote   time.Time // the last durable write
	file    positionFile
	timer   *time.Timer // a write of next, due; nil when none is
	stopped bool
}

// positionEvery is how often at most the core feed writes its position: a
// restarted member reads at most that much of the stream again.
const positionEvery = 30 * time.Second

func newPhaseFloor(path, run string, m events.Member, pos position, log zerolog.Logger) *phaseFloor {
	return &phaseFloor{run: run, member: string(m), log: log, pending: map[uint64]bool{}, at: map[uint64]uint64{},
		high: pos.PhaseSeq, saved: pos, synced: true, next: pos, file: positionFile{path: path}}
}

func (f *phaseFloor) delivered(q, seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending[q] = true
	if seq != 0 {
		f.at[q] = seq
	}
	f.high = max(f.high, q)
}

// done marks phase q handled and saves the position, durably, if it moved:
// at once when the last write is positionEvery old or now is set, else
// when it is.
func (f *phaseFloor) done(q uint64, now bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.pending[q] {
		return nil // handled already (given back, then delivered again)
	}
	delete(f.pending, q)
	floor := f.high
	for p := range f.pending {
		floor = min(floor, p-1)
	}
	next := f.next
	if floor > next.PhaseSeq {
		next.PhaseSeq = floor
	}
	for p, seq := range f.at {
		if p <= floor {
			next.StreamSeq = max(next.StreamSeq, seq)
			delete(f.at, p)
		}
	}
	if next == f.next {
		return nil
	}
	next.V, next.Run, next.Member = positionVersion, f.run, f.member
	f.next = next
	wait := positionEvery - time.Since(f.wrote)
	switch {
	case wait <= 0 || f.stopped:
		return f.writeLocked(true)
	case now:
		// Past a prepare: written at once for a process started after a
		// crash of this one, but not synced. A crash of the machine takes
		// the daemon's sandbox with it, and so the prepare it answered;
		// the timer makes the position durable within positionEvery.
		if err := f.writeLocked(false); err != nil {
			return err
		}
	}
	if f.timer == nil {
		f.timer = time.AfterFunc(wait, f.due)
	}
	return nil
}

// due writes the position a timer waited for.
func (f *phaseFloor) due() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.timer = nil
	if err := f.writeLocked(true); err != nil {
		f.log.Warn().Err(err).Msg("cannot write the position; trying again at the next phase")
	}
}

// flush writes a position still waiting for its timer, and writes each
// one at once from then on: the feed stops.
func (f *phaseFloor) flush() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.stopped = true
	if f.timer != nil {
		f.timer.Stop()
		f.timer = nil
	}
	err := f.writeLocked(true)
	f.file.close()
	return err
}

// writeLocked writes the position if it moved since the last write (or,
// durable, since the last durable one).
func (f *phaseFloor) writeLocked(durable bool) error {
	if f.next == f.saved && (f.synced || !durable) {
		return nil
	}
	if err := f.file.write(f.next, durable); err != nil {
		return err
	}
	f.saved, f.synced = f.next, durable
	if durable {
		f.wrote = time.Now()
	}
	return nil
}

// positionFile writes the core feed's state file: durably by a replace
// (writePosition), and otherwise in place, into the file kept open (one
// pwrite, where a replace is six system calls and two directory changes), the
// JSON padded with spaces to the file's length (decodePosition trims
// them). One write of a few hundred bytes at offset 0 is whole or absent
// after a crash of the process; a crash of the machine may bring back the
// older content, as a replace without its fsyncs may.
type positionFile struct {
	path string
	f    *os.File // open for writes in place; nil before the first and after a replace
	size int      // the file's length as last written
}

func (w *positionFile) write(p position, durable bool) error {
	if durable || w.f == nil {
		// A replace puts a new file at the path: the one open is not it.
		w.close()
		if err := writePosition(w.path, p, durable); err != nil {
			return err
		}
		if durable {
			return nil // the next write in place opens the new file
		}
		f, err := os.OpenFile(w.path, os.O_WRONLY, 0)
		if err != nil {
			return nil // written; the next write replaces it again
		}
		st, err := f.Stat()
		if err != nil {
			_ = f.Close()
			return nil
		}
		w.f, w.size = f, int(st.Size())
		return nil
	}
	b, err := json.Marshal(p)
	if err != nil {
		return fmt.Errorf("member: state file: %w", err)
	}
	b = append(b, '\n')
	if n := w.size - len(b); n > 0 {
		b = append(b, bytes.Repeat([]byte{' '}, n)...)
	}
	if _, err := w.f.WriteAt(b, 0); err != nil {
		w.close()
		return fmt.Errorf("member: state file %s: %w", w.path, err)
	}
	w.size = len(b)
	return nil
}

func (w *positionFile) close() {
	if w.f != nil {
		_ = w.f.Close()
		w.f = nil
	}
}
