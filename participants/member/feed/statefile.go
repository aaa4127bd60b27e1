package feed

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/atomicfile"
)

// ErrStateFile is returned (wrapped) by Run when the member's state file
// (member.Config.StateFile) is torn, truncated or of another version: the member
// does not start rather than guess where it was. The file is left as it
// is.
var ErrStateFile = errors.New("member: unusable state file")

// positionVersion is the version of the state file this build writes; a
// file without one was written before versions and is read as this one.
const positionVersion = 1

// position is what a member on the core feed keeps in its state file: the
// stream sequence below which every event is handled, and (as phases
// received on its subscription carry no stream sequence) the phase
// sequence below which every phase is. A file without a phase sequence is read as phase 0:
// nothing is known to be handled past the stream sequence.
type position struct {
	V         int    `json:"v,omitempty"`
	Run       string `json:"run"`
	Member    string `json:"member"`
	StreamSeq uint64 `json:"stream_seq"`
	PhaseSeq  uint64 `json:"phase_seq,omitempty"`
}

// loadPosition reads a state file; a missing file is position 0, and so is
// one that another member (or another run) wrote: the file of a sandbox
// daemon re-identified after a fork holds the position of the snapshot's
// member, and nothing before the new member registers can name it, so it
// reads from the stream's end (docs/MICROVM.md, Re-identification). A file
// that is torn or of an unknown version is ErrStateFile.
func loadPosition(path, run string, m events.Member) (pos position, other string, err error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return position{}, "", nil
	}
	if err != nil {
		return position{}, "", fmt.Errorf("member: state file: %w", err)
	}
	p, err := decodePosition(b)
	if err != nil {
		return position{}, "", fmt.Errorf("%w %s: %w", ErrStateFile, path, err)
	}
	if p.Run != run || p.Member != string(m) {
		return position{}, p.Run + "/" + p.Member, nil
	}
	return p, "", nil
}

// decodePosition checks a state file's bytes: one whole JSON object of a
// known version.
func decodePosition(b []byte) (position, error) {
	p, err := atomicfile.DecodeJSON[position](b)
	if err != nil {
		return position{}, err
	}
	if p.V != 0 && p.V != positionVersion {
		return position{}, fmt.Errorf("version %d, this build reads version %d", p.V, positionVersion)
	}
	return p, nil
}

// writePosition writes a feed's state file atomically, making its
// directory first; durable, it syncs the file and its directory.
func writePosition(path string, p position, durable bool) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("member: state file: %w", err)
	}
	f := atomicfile.JSON[position]{Path: path}
	write := f.Write
	if !durable {
		write = f.Replace
	}
	if err := write(p); err != nil {
		return fmt.Errorf("member: state file: %w", err)
	}
	return nil
}
