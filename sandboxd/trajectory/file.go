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
)

// FileName is the capture file's name in the daemon's state directory
// inside the sandbox.
const FileName = "trajectory.jsonl"

// MaxRecord bounds one record (one line) of a capture file.
const MaxRecord = 256 << 20

// Recorder appends calls to a capture file: each record is written and
// fsync'd before Record returns, so a snapshot taken after a call's reply
// reached its harness holds the call. It keeps the file's Index. Its
// methods are safe for concurrent use.
type Recorder struct {
	mu   sync.Mutex
	path string
	f    *os.File
	x    *Index
	err  error // the first write that failed: the file ends before it
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
	return &Recorder{path: path, f: f, x: x}, nil
}

// Path returns the capture file's path.
func (r *Recorder) Path() string { return r.path }

// Record adds ex to the index and appends its record, durably.
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
	b, err := json.Marshal(c)
	if err != nil {
		return nil, fmt.Errorf("trajectory: %w", err)
	}
	b = append(b, '\n')
	if _, err := r.f.Write(b); err != nil {
		r.err = fmt.Errorf("trajectory: appending %s: %w", c.ID, err)
		return nil, r.err
	}
	if err := r.f.Sync(); err != nil {
		r.err = fmt.Errorf("trajectory: syncing %s: %w", c.ID, err)
		return nil, r.err
	}
	return c, nil
}

// Len returns how many calls the file holds.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.x.Len()
}

// Close closes the file.
func (r *Recorder) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return nil
	}
	err := r.f.Close()
	r.f = nil
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
