package trajectory

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// FileName is the capture file's name in the daemon's state directory
// inside the sandbox.
const FileName = "trajectory.jsonl"

// MaxRecord bounds one record (one line) of a capture file.
const MaxRecord = 256 << 20

// Recorder appends calls to a capture file. Record writes each record
// before it returns, so that what a snapshot copies of the sandbox (the
// file as any reader sees it, or a VM's memory with it) holds the call,
// and a goroutine fsyncs it soon after (within SyncDelay), a batch at a
// time: a harness does not wait for the disk, and calls close together
// share an fsync. Flush waits until every record written is durable, at
// once; the relay calls it when a checkpoint holds it, so a snapshot never
// precedes the fsync of a call it holds. It keeps the file's Index.
// Its methods are safe for concurrent use.
type Recorder struct {
	mu      sync.Mutex
	path    string
	f       *os.File
	x       *Index
	err     error // the first write or fsync that failed: the file records no more
	written uint64
	synced  uint64
	closing bool
	cond    *sync.Cond // signalled when synced or err changes
	kick    chan struct{}
	urgent  chan struct{} // a Flush waits: no delay
	stop    chan struct{}
	done    chan struct{}
}

// OpenRecorder opens (or creates) the capture file at path and loads its
// calls. A last line cut short (a crash mid-append) is cut off the file;
// any other line that does not read is an error naming it, and the file
// is left as it is.
func OpenRecorder(path string) (*Recorder, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("trajectory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("trajectory: %w", err)
	}
	x, good, err := read(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("trajectory: %s: %w", path, err)
	}
	if err := f.Truncate(good); err != nil {
		f.Close()
		return nil, fmt.Errorf("trajectory: %s: cutting a torn last record: %w", path, err)
	}
	if _, err := f.Seek(good, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("trajectory: %w", err)
	}
	r := &Recorder{path: path, f: f, x: x, kick: make(chan struct{}, 1), urgent: make(chan struct{}, 1), stop: make(chan struct{}),
		done: make(chan struct{})}
	r.cond = sync.NewCond(&r.mu)
	go r.syncer()
	return r, nil
}

// SyncDelay is how long the recorder waits after a record for others to
// share its fsync, unless a Flush waits: a record is durable within it.
const SyncDelay = 2 * time.Millisecond

// syncer fsyncs what was written, a batch at a time, until Close.
func (r *Recorder) syncer() {
	defer close(r.done)
	delay := time.NewTimer(SyncDelay)
	delay.Stop()
	for {
		now := false
		select {
		case <-r.kick:
		case <-r.urgent:
			now = true
		case <-r.stop:
			return
		}
		if !now {
			delay.Reset(SyncDelay)
			select {
			case <-delay.C:
			case <-r.urgent:
				delay.Stop()
			case <-r.stop:
				delay.Stop()
				return // Close syncs what is left
			}
		}
		r.mu.Lock()
		target, f := r.written, r.f
		r.mu.Unlock()
		if f == nil {
			continue
		}
		err := f.Sync()
		r.mu.Lock()
		if err != nil && r.err == nil {
			r.err = fmt.Errorf("trajectory: syncing %s: %w", r.path, err)
		}
		if err == nil && target > r.synced {
			r.synced = target
		}
		r.cond.Broadcast()
		r.mu.Unlock()
	}
}

func (r *Recorder) kickSync() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// Path returns the capture file's path.
func (r *Recorder) Path() string { return r.path }

// Record adds ex to the index and appends its record; it is durable once
// Flush returns.
func (r *Recorder) Record(ex Exchange) (*Call, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return nil, r.err
	}
	if r.f == nil {
		return nil, errors.New("trajectory: recorder closed")
	}
	c, err := r.x.Add(ex)
	if err != nil {
		return nil, err
	}
	b, err := c.record()
	if err != nil {
		return nil, fmt.Errorf("trajectory: call %s: %w", c.ID, err)
	}
	b = append(b, '\n')
	if _, err := r.f.Write(b); err != nil {
		r.err = fmt.Errorf("trajectory: appending %s: %w", c.ID, err)
		return nil, r.err
	}
	r.written++
	r.kickSync()
	return c, nil
}

// Flush waits until every record written so far is durable, and returns
// the error that stops the file recording, if any.
func (r *Recorder) Flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	target := r.written
	for r.synced < target && r.err == nil && r.f != nil {
		select {
		case r.urgent <- struct{}{}:
		default:
		}
		r.cond.Wait()
	}
	return r.err
}

// Durable tells whether every record written so far is durable (or the
// file records no more).
func (r *Recorder) Durable() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.synced >= r.written || r.err != nil || r.f == nil
}

// Err returns the error that stopped the file recording, nil while it
// records.
func (r *Recorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

// Next returns the number the next call of launch in episode takes: one
// past the highest the file holds.
func (r *Recorder) Next(episode, launch string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.x.Next(episode, launch)
}

// Calls returns every call the file holds, whole.
func (r *Recorder) Calls() []Whole {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.x.Calls()
}

// Len returns how many calls the file holds.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.x.Len()
}

// Close fsyncs what was written and closes the file.
func (r *Recorder) Close() error {
	r.mu.Lock()
	if r.f == nil || r.closing {
		r.mu.Unlock()
		return nil
	}
	r.closing = true
	r.mu.Unlock()
	close(r.stop)
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.f.Sync()
	if cerr := r.f.Close(); err == nil {
		err = cerr
	}
	r.f = nil
	r.synced = r.written
	r.cond.Broadcast()
	return err
}

// Read reads a capture file's records into an index. A last line cut
// short is left out; any other line that does not read is an error.
func Read(rd io.Reader) (*Index, error) {
	x, _, err := read(rd)
	return x, err
}

// read reads records and returns the index and the length of the part of
// the input that holds whole records.
func read(rd io.Reader) (*Index, int64, error) {
	x := NewIndex()
	br := bufio.NewReaderSize(rd, 64<<10)
	var good int64
	for n := 1; ; n++ {
		line, err := readLine(br)
		if errors.Is(err, io.EOF) {
			return x, good, nil // nothing, or a torn last line
		}
		if err != nil {
			return nil, 0, fmt.Errorf("record %d: %w", n, err)
		}
		var c Call
		d := json.NewDecoder(bytes.NewReader(line))
		d.DisallowUnknownFields()
		if err := d.Decode(&c); err != nil {
			return nil, 0, fmt.Errorf("%w: record %d: %v", ErrBadCall, n, err)
		}
		if err := x.Load(&c); err != nil {
			return nil, 0, fmt.Errorf("record %d: %w", n, err)
		}
		good += int64(len(line)) + 1
	}
}

// readLine returns the next line without its newline, io.EOF when no
// whole line is left, or an error for a line over MaxRecord.
func readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > MaxRecord {
			return nil, fmt.Errorf("%w: a record over %d bytes", ErrBadCall, MaxRecord)
		}
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF):
			return nil, io.EOF
		default:
			return nil, err
		}
	}
}
