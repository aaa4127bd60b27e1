package sandboxd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/stillpoint/stillpoint/internal/atomicfile"
)

// Files in a launch's directory, <StateDir>/<id>/.
const (
	// RecordFile is the launch record, JSON, replaced atomically.
	RecordFile = "record.json"
	// OutputFile receives the harness's stdout and stderr.
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

// PauseStats counts a launch's pauses.
type PauseStats struct {
	// Count is how many pauses took hold (including a hold before the
	// start).
	Count int `json:"count"`
	// Seq is the number of the current or last pause (pause N).
	Seq int `json:"seq"`
	// Total is the time spent paused, which never counts against the
	// launch's deadline.
	Total time.Duration `json:"total_ns"`
	// Since is when the current pause took hold (zero when not paused).
	Since time.Time `json:"since,omitzero"`
	// Mode is the mode of the current or last pause.
	Mode Mode `json:"mode,omitzero"`
	// Fallbacks is how many pauses could not be confirmed.
	Fallbacks int `json:"fallbacks,omitzero"`
}

// Receipt is how a launch ended: the harness's own exit code or signal, the
// outcome, and whether everything it left behind was confirmed gone.
type Receipt struct {
	// ID is the launch id.
	ID string `json:"id"`
	// Started is false for a launch that never started (stop file, stop
	// before start, start failure).
	Started bool `json:"started"`
	// ExitCode is the harness's exit code, -1 when it was killed by a
	// signal or never started.
	ExitCode int `json:"exit_code"`
	// Signal names the signal that killed the harness ("SIGKILL"), if one
	// did.
	Signal string `json:"signal,omitempty"`
	// Outcome is finished, interrupted or failed.
	Outcome Outcome `json:"outcome"`
	// StopReason is why the launch was stopped, if it was.
	StopReason StopReason `json:"stop_reason,omitzero"`
	// TimedOut is true when the deadline stopped the launch.
	TimedOut bool `json:"timed_out,omitempty"`
	// CleanupConfirmed is true when no process of the launch was found
	// after it ended.
	CleanupConfirmed bool `json:"cleanup_confirmed"`
	// Error says what went wrong, for a failed launch.
	Error string `json:"error,omitempty"`
	// Ended is when the harness exited (or the launch was given up).
	Ended time.Time `json:"ended"`
	// OutputTail is the last OutputTailBytes of the launch's output, so that
	// a caller outside the sandbox can read a harness's answer.
	OutputTail string `json:"output_tail,omitempty"`
	// Pauses counts the launch's pauses.
	Pauses PauseStats `json:"pauses"`
}

// Record is a launch's record, <StateDir>/<id>/record.json: what was
// launched, by which supervisor, where it stands, and its receipt once it
// has ended. Status returns it.
type Record struct {
	// V is the record format version (1).
	V int `json:"v"`
	// ID is the launch id.
	ID string `json:"id"`
	// Command is the shell command (run as /bin/sh -c Command), or empty
	// when Argv is given.
	Command string `json:"command,omitempty"`
	// Argv is the argument vector that was (or will be) executed.
	Argv []string `json:"argv"`
	// Dir is the working directory.
	Dir string `json:"dir,omitempty"`
	// Created is when the launch was accepted.
	Created time.Time `json:"created"`
	// Started is when the harness started (zero before).
	Started time.Time `json:"started,omitzero"`
	// Supervisor is the identity of the supervisor that owns the launch.
	Supervisor Identity `json:"supervisor"`
	// State is the launch's state.
	State State `json:"state"`
	// Mode is the launch's default pause mode.
	Mode Mode `json:"mode"`
	// Cgroup is the launch's cgroup v2 directory, if it has one.
	Cgroup string `json:"cgroup,omitempty"`
	// PID is the harness's process id (the root of the launch's tree, the
	// leader of its session and process group) and PIDStart its start
	// time.
	PID      int    `json:"pid,omitempty"`
	PIDStart uint64 `json:"pid_start,omitempty"`
	// Output is the file that holds the harness's stdout and stderr.
	Output string `json:"output"`
	// Timeout is the launch's time budget (0: none); paused time does not
	// count.
	Timeout time.Duration `json:"timeout_ns,omitzero"`
	// Deadline is when the launch will be stopped, given its pauses so far
	// (zero when none applies right now).
	Deadline time.Time `json:"deadline,omitzero"`
	// Pauses counts the launch's pauses.
	Pauses PauseStats `json:"pauses"`
	// Receipt is set once the launch has ended.
	Receipt *Receipt `json:"receipt,omitempty"`
	// Updated is when the record was written.
	Updated time.Time `json:"updated"`
}

// LaunchDir returns the directory of launch id in stateDir.
func LaunchDir(stateDir, id string) string { return filepath.Join(stateDir, id) }

// ReadRecord reads the record of launch id in stateDir; a missing record
// is ErrUnknownLaunch.
func ReadRecord(stateDir, id string) (Record, error) {
	if err := ValidateID(id); err != nil {
		return Record{}, err
	}
	b, err := os.ReadFile(filepath.Join(LaunchDir(stateDir, id), RecordFile))
	if errors.Is(err, fs.ErrNotExist) {
		return Record{}, fmt.Errorf("%w: %s", ErrUnknownLaunch, id)
	}
	if err != nil {
		return Record{}, fmt.Errorf("sandboxd: read record %s: %w", id, err)
	}
	var r Record
	if err := json.Unmarshal(b, &r); err != nil {
		return Record{}, fmt.Errorf("sandboxd: record %s: %w", id, err)
	}
	if r.V != recordVersion || r.ID != id {
		return Record{}, fmt.Errorf("sandboxd: record %s: version %d, id %q (want version %d)", id, r.V, r.ID, recordVersion)
	}
	return r, nil
}

// writeRecord replaces the record durably (atomicfile.Write: fsync,
// rename, fsync of the directory), so that a reader or a supervisor
// restarted after a crash of the machine sees one whole record, never a
// torn one or an older state than the last one written.
func writeRecord(dir string, r *Record) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("sandboxd: encode record %s: %w", r.ID, err)
	}
	if err := atomicfile.Write(filepath.Join(dir, RecordFile), append(b, '\n'), 0o644); err != nil {
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
