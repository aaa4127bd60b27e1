package daemon

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/sandboxd/sandboxapi"
)

// captureRelay is a relay that only names its capture file.
type captureRelay struct {
	slowHolding
	path string
}

func (r *captureRelay) Holding() bool       { return false }
func (r *captureRelay) CapturePath() string { return r.path }

// The trajectory endpoint reads the relay's capture file in chunks of at
// most MaxTrajectoryChunk, from any offset, and refuses what is not that
// file: a negative offset, a link the workload put in its place, a daemon
// without a relay or a capture.
func TestTrajectoryReadsTheCaptureFile(t *testing.T) {
	env := jstest.Start(t)
	s := newSubject(t, env, time.Second)
	if _, err := s.Trajectory(sandboxapi.TrajectoryRequest{}); !errors.Is(err, ErrNoRelay) {
		t.Fatalf("without a relay: %v, want ErrNoRelay", err)
	}
	rl := &captureRelay{}
	s.useRelay(rl)
	if _, err := s.Trajectory(sandboxapi.TrajectoryRequest{}); !errors.Is(err, ErrNoCapture) {
		t.Fatalf("without a capture: %v, want ErrNoCapture", err)
	}
	dir := t.TempDir()
	rl.path = filepath.Join(dir, "trajectory.jsonl")
	want := bytes.Repeat([]byte("0123456789abcdef"), (sandboxapi.MaxTrajectoryChunk*2+1000)/16)
	if err := os.WriteFile(rl.path, want, 0o600); err != nil {
		t.Fatal(err)
	}
	var got []byte
	for off := int64(0); ; {
		ch, err := s.Trajectory(sandboxapi.TrajectoryRequest{Offset: off})
		if err != nil {
			t.Fatal(err)
		}
		if ch.Size != int64(len(want)) || ch.Offset != off || len(ch.Data) > sandboxapi.MaxTrajectoryChunk {
			t.Fatalf("chunk at %d: offset %d, size %d, %d bytes", off, ch.Offset, ch.Size, len(ch.Data))
		}
		if len(ch.Data) == 0 {
			break
		}
		got = append(got, ch.Data...)
		off += int64(len(ch.Data))
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read %d bytes, not the file's %d", len(got), len(want))
	}
	if _, err := s.Trajectory(sandboxapi.TrajectoryRequest{Offset: -1}); !errors.Is(err, jetstream.ErrBadRequest) {
		t.Fatalf("offset -1: %v, want ErrBadRequest", err)
	}
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte("not a trajectory"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(rl.path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(secret, rl.path); err != nil {
		t.Fatal(err)
	}
	if ch, err := s.Trajectory(sandboxapi.TrajectoryRequest{}); err == nil {
		t.Fatalf("through a link: %q, want an error", ch.Data)
	}
}
