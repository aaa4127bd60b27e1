package ownerapi

import "encoding/json"

// RecordData is the data of a record an owner exports: one session.
type RecordData struct {
	// Session is the session id.
	Session string `json:"session"`
	// Sandbox names the snapshot the session's sandbox was captured as.
	Sandbox SandboxRef `json:"sandbox"`
	// Workdir is the working directory inside the sandbox.
	Workdir string `json:"workdir"`
	// Data is the session data, {} when the setup returned none.
	Data json.RawMessage `json:"data"`
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
	// Checkpoints are the checkpoint ids that name the snapshot.
	Checkpoints []string `json:"checkpoints"`
}
