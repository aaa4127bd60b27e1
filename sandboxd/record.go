package sandboxd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/stillpoint/stillpoint/internal/atomicfile"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// Files in a launch's directory, <StateDir>/<id>/.
const (
	// RecordFile is the launch record, JSON, replaced atomically.
	RecordFile = "record.json"
	// OutputFile receives the launch process's stdout and stderr.
	OutputFile = "output.log"
	// StopFileName, when present before the launch starts, keeps it from
	// ever starting. Stop and Cancel create it for a launch they do not
	// know yet.
	StopFileName = "stop"
	// PauseFileName, when present before the launch starts, holds it until
	// continue (or until the file is removed). Pause creates it for a
	// launch that has not started; Continue removes it.
	PauseFileName = "pause"
	// recordVersion is the record format version.
	recordVersion = 1
)

// LaunchDir returns the directory of launch id in stateDir.
func LaunchDir(stateDir, id string) string { return filepath.Join(stateDir, id) }

// ErrBadRecord is returned (wrapped, naming the file and what is wrong)
// by ReadRecord for a launch record that is torn, truncated, of an unknown
// version or another launch's. The file is left as it is.
var ErrBadRecord = errors.New("sandboxd: unusable launch record")

// ReadRecord reads the record of launch id in stateDir; a missing record
// is ErrUnknownLaunch, one that does not decode ErrBadRecord.
func ReadRecord(stateDir, id string) (sandboxapi.Record, error) {
	if err := ValidateID(id); err != nil {
		return sandboxapi.Record{}, err
	}
	path := filepath.Join(LaunchDir(stateDir, id), RecordFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return sandboxapi.Record{}, fmt.Errorf("%w: %s", ErrUnknownLaunch, id)
	}
	if err != nil {
		return sandboxapi.Record{}, fmt.Errorf("sandboxd: read record %s: %w", id, err)
	}
	r, err := decodeRecord(b, id)
	if err != nil {
		return sandboxapi.Record{}, fmt.Errorf("%w %s: %w", ErrBadRecord, path, err)
	}
	return r, nil
}

// decodeRecord checks a launch record's bytes: one whole JSON object, of
// this build's version, of launch id. The version is read first, so that a
// record of another version is named as such whatever its fields.
func decodeRecord(b []byte, id string) (sandboxapi.Record, error) {
	head, err := atomicfile.DecodeJSON[struct {
		V *int `json:"v"`
	}](b)
	switch {
	case err != nil:
		return sandboxapi.Record{}, err
	case head.V == nil:
		return sandboxapi.Record{}, errors.New(`no version field "v"`)
	case *head.V != recordVersion:
		return sandboxapi.Record{}, fmt.Errorf("version %d, this build reads version %d", *head.V, recordVersion)
	}
	var r sandboxapi.Record
	if err := json.Unmarshal(b, &r); err != nil {
		return sandboxapi.Record{}, fmt.Errorf("does not decode: %w", err)
	}
	if r.ID != id {
		return sandboxapi.Record{}, fmt.Errorf("it is the record of launch %q, not %q", r.ID, id)
	}
	return r, nil
}

// writeRecord replaces the record atomically, so that a reader or a
// restarted supervisor sees one whole record, never a torn one. A durable
// write (the launch accepted, its final receipt) also survives a crash of
// the machine (atomicfile.Write); the states in between (paused, running
// again) are rewritten at every pause and continue, and after a crash of
// the machine every launch is dead and recovered as lost whatever state its
// record shows, so they are only replaced (atomicfile.Replace), keeping
// fsyncs off the path of every pause and continue.
func writeRecord(dir string, r *sandboxapi.Record, durable bool) error {
	f := atomicfile.JSON[*sandboxapi.Record]{Path: filepath.Join(dir, RecordFile), Indent: true}
	write := f.Replace
	if durable {
		write = f.Write
	}
	if err := write(r); err != nil {
		return fmt.Errorf("sandboxd: write record %s: %w", r.ID, err)
	}
	return nil
}

// OutputTailBytes is how much of a launch's output its receipt carries.
const OutputTailBytes = 4096

// readTail returns the last n bytes of the file at path ("" when it cannot
// be read).
func readTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(st.Size()-n, 0)
	b := make([]byte, st.Size()-off)
	if _, err := f.ReadAt(b, off); err != nil {
		return ""
	}
	return string(b)
}

func fileExists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}
