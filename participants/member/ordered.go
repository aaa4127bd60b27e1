package member

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
)

// position is what a member that reads through an ordered consumer keeps in
// its state file: the stream sequence below which every event is handled.
type position struct {
	Run       string `json:"run"`
	Member    string `json:"member"`
	StreamSeq uint64 `json:"stream_seq"`
}

// loadPosition reads a state file; a missing file is position 0.
func loadPosition(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("member: state file: %w", err)
	}
	var p position
	if err := json.Unmarshal(b, &p); err != nil {
		return 0, fmt.Errorf("member: state file %s does not decode: %w", path, err)
	}
	return p.StreamSeq, nil
}

// floor tracks which delivered events are handled, and keeps the state
// file at the highest stream sequence below which all are.
type floor struct {
	mu      sync.Mutex
	path    string
	run     string
	member  string
	pending map[uint64]bool
	high    uint64 // highest sequence delivered
	saved   uint64
}

func (f *floor) delivered(seq uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending[seq] = true
	f.high = max(f.high, seq)
}

// done marks seq handled and saves the floor if it moved.
func (f *floor) done(seq uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.pending, seq)
	at := f.high
	for s := range f.pending {
		at = min(at, s-1)
	}
	if at <= f.saved {
		return nil
	}
	b, _ := json.Marshal(position{Run: f.run, Member: f.member, StreamSeq: at})
	tmp := f.path + ".tmp"
	if err := os.MkdirAll(filepath.Dir(f.path), 0o755); err != nil {
		return fmt.Errorf("member: state file: %w", err)
	}
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("member: state file: %w", err)
	}
	if err := os.Rename(tmp, f.path); err != nil {
		return fmt.Errorf("member: state file: %w", err)
	}
	f.saved = at
	return nil
}

// orderedMsg is a message of an ordered consumer, which the server never
// redelivers: acknowledging it moves the member's saved position, and
// giving it back (Nak) delivers it again locally after the delay.
type orderedMsg struct {
	natsjs.Msg
	seq       uint64
	delivered int
	floor     *floor
	again     func(*orderedMsg, time.Duration)
}

func (o *orderedMsg) Ack() error                      { return o.floor.done(o.seq) }
func (o *orderedMsg) DoubleAck(context.Context) error { return o.Ack() }
func (o *orderedMsg) Term() error                     { return o.Ack() }
func (o *orderedMsg) TermWithReason(string) error     { return o.Ack() }
func (o *orderedMsg) InProgress() error               { return nil }
func (o *orderedMsg) Nak() error                      { return o.NakWithDelay(0) }
func (o *orderedMsg) NakWithDelay(d time.Duration) error {
	o.again(o, max(d, 100*time.Millisecond))
	return nil
}

// Metadata counts local redeliveries, so that a message given back is
// checked against its ack subject when it comes again.
func (o *orderedMsg) Metadata() (*natsjs.MsgMetadata, error) {
	md, err := o.Msg.Metadata()
	if err != nil {
		return nil, err
	}
	c := *md
	c.NumDelivered = uint64(o.delivered)
	return &c, nil
}
