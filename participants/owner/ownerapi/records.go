package ownerapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/stillpoint/stillpoint/events"
)

// RecordData is the data of a record an owner exports: one session, or
// the verdict of one that a verify ended (Verdict set, no sandbox).
type RecordData struct {
	// Session is the session id.
	Session string `json:"session"`
	// Sandbox names the snapshot the session's sandbox was captured as.
	Sandbox SandboxRef `json:"sandbox,omitzero"`
	// Workdir is the working directory inside the sandbox.
	Workdir string `json:"workdir,omitempty"`
	// Data is the session data, {} when the setup returned none.
	Data json.RawMessage `json:"data,omitempty"`
	// Verdict is the grade of a session its verify ended before the
	// checkpoint: a restored owner answers a verify of the session with it
	// (PROTOCOL §6, Sandbox owner).
	Verdict json.RawMessage `json:"verdict,omitempty"`
}

// SandboxRef names a session's snapshot and the sandbox it was taken of.
type SandboxRef struct {
	// Provider is the provider's name.
	Provider string `json:"provider"`
	// Snapshot is the snapshot id.
	Snapshot string `json:"snapshot"`
	// SandboxID is the id of the sandbox the snapshot was taken of.
	SandboxID string `json:"sandbox_id"`
}

// IndexEntry is the value of a snapshot's key in the sp_snapshots bucket.
type IndexEntry struct {
	// Run is the run id.
	Run string `json:"run"`
	// Snapshot is the snapshot id (the key).
	Snapshot string `json:"snapshot"`
	// Owner is the name of the owner that took the snapshot, the one that
	// releases it: a run's owners share the bucket. Empty in entries
	// written before it was recorded, which any owner of the run releases.
	Owner string `json:"owner,omitempty"`
	// Checkpoints are the checkpoint ids that name the snapshot.
	Checkpoints []string `json:"checkpoints"`
	// Size is the bytes of file data the snapshot copied, as the provider
	// reported when it was taken (0 in entries written before it was
	// recorded).
	Size int64 `json:"size,omitempty"`
}

// DecodeIndexEntry decodes and checks the value of snapshot id's key in
// the sp_snapshots bucket: one JSON object naming a run, that snapshot,
// and valid checkpoint ids. The error says what is wrong.
func DecodeIndexEntry(b []byte, id string) (IndexEntry, error) {
	t := bytes.TrimSpace(b)
	if len(t) == 0 {
		return IndexEntry{}, fmt.Errorf("index entry %s: empty", id)
	}
	dec := json.NewDecoder(bytes.NewReader(t))
	var e IndexEntry
	if err := dec.Decode(&e); err != nil {
		return IndexEntry{}, fmt.Errorf("index entry %s: torn or not JSON (%d bytes): %w", id, len(b), err)
	}
	if dec.More() {
		return IndexEntry{}, fmt.Errorf("index entry %s: trailing data after the JSON object", id)
	}
	errs := []error{events.ValidateRun(e.Run)}
	if e.Snapshot != id {
		errs = append(errs, fmt.Errorf("snapshot %q under the key of %q", e.Snapshot, id))
	}
	for i, c := range e.Checkpoints {
		if err := events.ValidateCheckpointID(c); err != nil {
			errs = append(errs, fmt.Errorf("checkpoints[%d]: %w", i, err))
			break
		}
	}
	if err := errors.Join(errs...); err != nil {
		return IndexEntry{}, fmt.Errorf("index entry %s: %w", id, err)
	}
	return e, nil
}
