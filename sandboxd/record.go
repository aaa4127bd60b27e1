package sandboxd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

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

// ReadRecord reads the record of launch id in stateDir; a missing record
// is ErrUnknownLaunch.
func ReadRecord(stateDir, id string) (sandboxapi.Record, error) {
	if err := ValidateID(id); err != nil {
		return sandboxapi.Record{}, err
	}
	b, err := os.ReadFile(filepath.Join(LaunchDir(stateDir, id), RecordFile))
	if errors.Is(err, fs.ErrNotExist) {
		return sandboxapi.Record{}, fmt.Errorf("%w: %s", ErrUnknownLaunch, id)
	}
	if err != nil {
		return sandboxapi.Record{}, fmt.Errorf("sandboxd: read record %s: %w", id, err)
	}
	var r sandboxapi.Record
	if err := json.Unmarshal(b, &r); err != nil {
		return sandboxapi.Record{}, fmt.Errorf("sandboxd: record %s: %w", id, err)
	}
	if r.V != recordVersion || r.ID != id {
		return sandboxapi.Record{}, fmt.Errorf("sandboxd: record %s: version %d, id %q (want version %d)", id, r.V, r.ID, recordVersion)
	}
	return r, nil
}

// writeRecord replaces the record atomically (write, rename). With sync it
// also fsyncs the file and the directory, so that a final receipt survives
// a crash of the machine; the in-between states are rewritten often and a
// lost one is harmless.
func writeRecord(dir string, r *sandboxapi.Record, sync bool) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("sandboxd: encode record %s: %w", r.ID, err)
	}
	b = append(b, '\n')
	tmp := filepath.Join(dir, RecordFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("sandboxd: write record %s: %w", r.ID, err)
	}
	_, err = f.Write(b)
	if err == nil && sync {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, RecordFile))
	}
	if err == nil && sync {
		if d, derr := os.Open(dir); derr == nil {
			err = d.Sync()
			_ = d.Close()
		}
	}
	if err != nil {
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
