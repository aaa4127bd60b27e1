package member

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/atomicfile"
	"github.com/stillpoint/stillpoint/jetstream"
)

// ErrStateFile is returned (wrapped) by Run when the member's state file
// (Config.StateFile) is torn, truncated or of another version: the member
// does not start rather than guess where it was. The file is left as it
// is.
var ErrStateFile = errors.New("member: unusable state file")

// positionVersion is the version of the state file this build writes; a
// file without one was written before versions and is read as this one.
const positionVersion = 1

// position is what a member that reads through an ordered consumer, or the
// core feed, keeps in its state file: the stream sequence below which every
// event is handled, and (the core feed's, whose phases received on its
// subscription carry no stream sequence) the phase sequence below which
// every phase is. A file without a phase sequence is read as phase 0:
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

// orderedFeed makes the member's ordered consumer, which keeps no state on
// the server (PROTOCOL §3: thousands of sandbox daemons), starting after
// the position its state file holds (or with what is published from now
// on). The server never redelivers its messages: one given back comes
// again locally (redeliver).
func (m *Member) orderedFeed(ctx context.Context) (*feed, error) {
	saved, other, err := loadPosition(m.cfg.StateFile, m.cfg.Run, m.cfg.Member)
	if err != nil {
		return nil, err
	}
	if other != "" {
		m.log.Info().Str("state_file", m.cfg.StateFile).Str("written_by", other).Msg("position of another member: reading from the stream's end")
	}
	pos := saved.StreamSeq
	// The consumer's name is drawn here from crypto/rand (never nats.go's
	// process-wide nuid, which forks of one VM snapshot share).
	cfg := natsjs.OrderedConsumerConfig{FilterSubjects: subjects(m.cfg.Run), DeliverPolicy: natsjs.DeliverNewPolicy,
		NamePrefix: "sp_" + events.NewID()}
	if pos > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = natsjs.DeliverByStartSequencePolicy, pos+1
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	cons, err := m.cfg.JS.OrderedConsumer(cctx, jetstream.StreamName, cfg)
	if err != nil {
		return nil, fmt.Errorf("member: ordered consumer: %w", err)
	}
	fl := &floor{path: m.cfg.StateFile, run: m.cfg.Run, member: string(m.cfg.Member), pending: map[uint64]bool{}, saved: pos, high: pos}
	m.inbox = make(chan Delivery)
	r := &redeliverer{inbox: m.inbox, stopping: make(chan struct{})}
	f := m.consume("ordered, position in "+m.cfg.StateFile, cons, func(msg natsjs.Msg) Delivery {
		return newOrderedDelivery(msg, fl, r)
	}, r.stop)
	// nats.go makes an ordered consumer that disappears again by itself,
	// from the event after the last it delivered: nothing to do.
	f.recreate = func(context.Context) (uint64, error) { return 0, nil }
	return f, nil
}

// floor tracks which delivered events are handled, and keeps the state
// file (when path is set) at the highest stream sequence below which all
// are.
type floor struct {
	mu      sync.Mutex // the consumer's goroutine delivers, the loop handles
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

// done marks seq handled and saves the floor, durably, if it moved.
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
	if f.path == "" {
		f.saved = at
		return nil
	}
	if err := writePosition(f.path, position{V: positionVersion, Run: f.run, Member: f.member, StreamSeq: at}, true); err != nil {
		return err
	}
	f.saved = at
	return nil
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

// next returns the first stream sequence not known to be handled, and the
// highest sequence delivered.
func (f *floor) next() (from, high uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	at := max(f.high, f.saved)
	for s := range f.pending {
		at = min(at, s-1)
	}
	return at + 1, f.high
}

// orderedDelivery is a message of an ordered consumer: acknowledging it
// (or refusing it) moves the member's saved position, and giving it back
// delivers it again locally after the delay.
type orderedDelivery struct {
	msg       *nats.Msg
	seq       uint64
	delivered uint64
	floor     *floor
	again     *redeliverer
}

// newOrderedDelivery is a message of the pull feed's consumer.
func newOrderedDelivery(msg natsjs.Msg, fl *floor, again *redeliverer) *orderedDelivery {
	var seq uint64
	if md, err := msg.Metadata(); err == nil {
		seq = md.Sequence.Stream
	}
	return newDelivery(&nats.Msg{Subject: msg.Subject(), Header: msg.Headers(), Data: msg.Data()}, seq, fl, again)
}

func newDelivery(msg *nats.Msg, seq uint64, fl *floor, again *redeliverer) *orderedDelivery {
	d := &orderedDelivery{msg: msg, seq: seq, delivered: 1, floor: fl, again: again}
	if seq != 0 {
		fl.delivered(seq)
	}
	return d
}

func (o *orderedDelivery) Subject() string { return o.msg.Subject }
func (o *orderedDelivery) Event() (cloudevent.Event, events.Data, error) {
	return events.Unmarshal(o.msg)
}
func (o *orderedDelivery) Sequence() uint64  { return o.seq }
func (o *orderedDelivery) Delivered() uint64 { return o.delivered }
func (o *orderedDelivery) InProgress() error { return nil }
func (o *orderedDelivery) Term(string) error { return o.Ack() }

// Ack moves the saved position past the event once every event before it
// is handled too. A message without metadata is not tracked.
func (o *orderedDelivery) Ack() error {
	if o.seq == 0 {
		return nil
	}
	return o.floor.done(o.seq)
}

// Nak delivers the event again, locally, after delay (at least 100 ms);
// the count of deliveries goes up, so the loop checks its ack subject.
func (o *orderedDelivery) Nak(delay time.Duration) error {
	o.delivered++
	o.again.after(o, max(delay, 100*time.Millisecond))
	return nil
}
