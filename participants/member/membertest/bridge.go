package membertest

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// Bridge plays the controller bridge in tests: it publishes phase events
// the way the bridge does (events.Marshal, jetstream.PublishDedup, ce-id
// <run>.<seq>.<phase> and a random part, events.MsgIDs) and reads the members' acks from the stream, and
// resume acks, which travel on core NATS (PROTOCOL §3), from a
// subscription it makes before its first resume. It is not safe for
// concurrent use.
type Bridge struct {
	// Env is the bus.
	Env *jstest.Env
	// Run is the run id.
	Run string
	// Name is the bridge's member name (default bridge.test).
	Name events.Member
	// Epoch is stamped on every phase built by Header.
	Epoch uint64
	// Timeout bounds every wait for an ack (default 10 s).
	Timeout time.Duration
	// LiveEvery publishes a live copy of every phase, not only of those
	// that name a sandbox daemon as the bridge does: for members of other
	// kinds on the core feed (Suite.CoreFeed).
	LiveEvery bool

	t   testing.TB
	seq uint64
	ids events.MsgIDs // the ids of Publish
	// commits maps a checkpoint to the sequence of its last commit, which
	// a restore of it names (events.Restore.SourceCommitSeq).
	commits map[string]uint64

	lastLive uint64 // the phase sequence of the last live copy published

	liveSub  *nats.Subscription
	liveMu   sync.Mutex // the subscription's goroutine files, the test reads
	liveAcks map[liveKey][]*nats.Msg
}

// liveKey names the acks on core NATS (events.LiveAck) of one member to
// one phase event.
type liveKey struct {
	seq    uint64
	phase  events.Phase
	member events.Member
}

// NewBridge returns a Bridge for run on env. Like the real bridge, it makes
// the own records stores of members with credentials of their own, and the
// own trajectories stores of such agents, when they ask
// (jetstream.ServeStores), until the test ends.
func NewBridge(t testing.TB, env *jstest.Env, run string) *Bridge {
	if env.JS != nil && env.Bus != nil {
		stop, err := jetstream.ServeStores(t.Context(), env.JS, env.Bus, run)
		if err != nil {
			t.Fatalf("membertest: serve stores: %v", err)
		}
		t.Cleanup(stop)
	}
	return &Bridge{Env: env, Run: run, Name: "bridge.test", Timeout: 10 * time.Second, t: t}
}

// Header returns the header of the next phase event: a new sequence, the
// bridge's epoch, a deadline `in` from now, addressed to members.
func (b *Bridge) Header(id string, in time.Duration, members ...events.Member) events.PhaseHeader {
	b.seq++
	return events.PhaseHeader{Run: b.Run, CheckpointID: id, Seq: b.seq, Epoch: b.Epoch,
		Deadline: time.Now().Add(in).UTC(), Members: members}
}

// Publish publishes a phase event and returns its sequence. Its id is
// <run>.<seq>.<phase> and a random part drawn once for that key
// (events.MsgIDs), as the bridge's: published again by this Bridge, it is
// a duplicate; no intruder can publish it first (Intruder).
func (b *Bridge) Publish(d events.PhaseEvent) uint64 {
	b.t.Helper()
	return b.PublishWithID(d, b.ids.For(b.Run+"."+strconv.FormatUint(d.Header().Seq, 10)+"."+string(d.Phase())))
}

// PublishWithID publishes a phase event with ce-id (and Nats-Msg-Id) id:
// the same event under another id is stored again, as after a bridge
// restart past the duplicate window. A restore that names no source
// commit sequence gets the one of the source's last commit, as the
// bridge's does.
func (b *Bridge) PublishWithID(d events.PhaseEvent, id string) uint64 {
	b.t.Helper()
	switch p := d.(type) {
	case events.Commit:
		if b.commits == nil {
			b.commits = map[string]uint64{}
		}
		b.commits[p.CheckpointID] = p.Seq
	case events.Restore:
		if p.SourceCommitSeq == 0 {
			p.SourceCommitSeq = b.commits[p.Source]
			d = p
		}
	}
	msg, err := events.Marshal(b.Name, d, events.WithID(id))
	if err != nil {
		b.t.Fatalf("membertest: bridge: %v", err)
	}
	b.listenLiveAcks()
	ack, err := jetstream.PublishDedup(b.t.Context(), b.Env.JS, msg)
	if err != nil {
		b.t.Fatalf("membertest: bridge: publish: %v", err)
	}
	// Its live copy, for sandbox daemons on the core feed, as the bridge
	// publishes one (PROTOCOL §3, live phases).
	h := d.Header()
	if b.LiveEvery || h.Sandboxes != nil || slices.ContainsFunc(h.Members, func(m events.Member) bool { return m.Kind() == events.KindSandbox }) {
		prev := b.lastLive
		if prev == 0 || prev >= h.Seq {
			prev = h.Seq - 1
		}
		if err := b.Env.Conn.PublishMsg(events.LiveCopy(msg, ack.Sequence, prev)); err != nil {
			b.t.Fatalf("membertest: bridge: publish the live copy: %v", err)
		}
		b.lastLive = h.Seq
	}
	return h.Seq
}

// listenLiveAcks subscribes to the run's acks on core NATS
// (events.LiveAck: resumes', sandbox daemons' prepares'), once.
func (b *Bridge) listenLiveAcks() {
	if b.liveSub != nil {
		return
	}
	b.liveAcks = map[liveKey][]*nats.Msg{}
	sub, err := b.Env.Conn.Subscribe(events.LivePrefix+"."+b.Run+".ack.>", func(msg *nats.Msg) {
		_, d, err := events.Unmarshal(msg)
		a, ok := d.(events.Ack)
		if err != nil || !ok {
			return // Lookup finds none, and says so by its wait
		}
		b.liveMu.Lock()
		defer b.liveMu.Unlock()
		h := a.Header()
		k := liveKey{h.Seq, a.Answers(), h.Member}
		b.liveAcks[k] = append(b.liveAcks[k], msg)
	})
	if err != nil {
		b.t.Fatalf("membertest: bridge: subscribe to the acks on core NATS: %v", err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := b.Env.Conn.Flush(); err != nil {
		b.t.Fatalf("membertest: bridge: subscribe to the acks on core NATS: %v", err)
	}
	b.liveSub = sub
	b.t.Cleanup(func() { _ = sub.Unsubscribe() })
}

// Heard returns the acks on core NATS (events.LiveAck) heard of member m
// to phase event seq, oldest first.
func (b *Bridge) Heard(seq uint64, p events.Phase, m events.Member) []*nats.Msg {
	return slices.Clone(b.heardLive(seq, p, m))
}

// heardLive returns the acks on core NATS heard of (seq, p, m).
func (b *Bridge) heardLive(seq uint64, p events.Phase, m events.Member) []*nats.Msg {
	b.liveMu.Lock()
	defer b.liveMu.Unlock()
	return b.liveAcks[liveKey{seq, p, m}]
}

// PublishOutcome publishes an outcome (checkpoint.committed, ...).
func (b *Bridge) PublishOutcome(d events.Data) {
	b.t.Helper()
	msg, err := events.Marshal(b.Name, d)
	if err != nil {
		b.t.Fatalf("membertest: bridge: %v", err)
	}
	if _, err := jetstream.PublishDedup(b.t.Context(), b.Env.JS, msg); err != nil {
		b.t.Fatalf("membertest: bridge: publish: %v", err)
	}
}

// Lookup returns the ack of member m to phase event seq, if it is there.
func (b *Bridge) Lookup(seq uint64, p events.Phase, m events.Member) (events.Ack, bool) {
	b.t.Helper()
	if events.LiveAck(p, m) {
		heard := b.heardLive(seq, p, m)
		if len(heard) == 0 {
			return nil, false
		}
		_, d, err := events.Unmarshal(heard[0])
		if err != nil {
			b.t.Fatalf("membertest: bridge: %s ack of %s to %d does not decode: %v", p, m, seq, err)
		}
		return d.(events.Ack), true
	}
	raw, err := b.Env.Bus.Stream.GetLastMsgForSubject(b.t.Context(), events.AckSubject(b.Run, seq, p, m))
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return nil, false
	}
	if err != nil {
		b.t.Fatalf("membertest: bridge: read ack: %v", err)
	}
	_, d, err := events.Unmarshal(rawMsg(raw))
	if err != nil {
		b.t.Fatalf("membertest: bridge: ack of %s to %s %d does not decode: %v", m, p, seq, err)
	}
	a, ok := d.(events.Ack)
	if !ok {
		b.t.Fatalf("membertest: bridge: %T on an ack subject", d)
	}
	return a, true
}

// AckedAt waits for member m's ack to phase event seq and returns its
// time (ce-time, the member's clock when it answered): a member answers in
// the order it handles, so the times order its answers, stored or not.
func (b *Bridge) AckedAt(seq uint64, p events.Phase, m events.Member) time.Time {
	b.t.Helper()
	b.Ack(seq, p, m)
	var msg *nats.Msg
	if events.LiveAck(p, m) {
		msg = b.heardLive(seq, p, m)[0]
	} else {
		raw, err := b.Env.Bus.Stream.GetLastMsgForSubject(b.t.Context(), events.AckSubject(b.Run, seq, p, m))
		if err != nil {
			b.t.Fatalf("membertest: bridge: read ack: %v", err)
		}
		msg = rawMsg(raw)
	}
	e, _, err := events.Unmarshal(msg)
	if err != nil {
		b.t.Fatalf("membertest: bridge: ack of %s to %s %d does not decode: %v", m, p, seq, err)
	}
	return e.Time()
}

// Ack waits for member m's ack to phase event seq and returns it.
func (b *Bridge) Ack(seq uint64, p events.Phase, m events.Member) events.Ack {
	b.t.Helper()
	var d events.Ack
	poll.Wait(b.t, b.Timeout, fmt.Sprintf("the ack of %s to %s %d", m, p, seq), func() bool {
		var ok bool
		d, ok = b.Lookup(seq, p, m)
		return ok
	})
	return d
}

// AckCount returns how many acks the stream holds for (seq, p, m); of an
// ack on core NATS (events.LiveAck), how many the bridge heard.
func (b *Bridge) AckCount(seq uint64, p events.Phase, m events.Member) uint64 {
	b.t.Helper()
	if events.LiveAck(p, m) {
		return uint64(len(b.heardLive(seq, p, m)))
	}
	subj := events.AckSubject(b.Run, seq, p, m)
	info, err := b.Env.Bus.Stream.Info(b.t.Context(), natsjs.WithSubjectFilter(subj))
	if err != nil {
		b.t.Fatalf("membertest: bridge: stream info: %v", err)
	}
	return info.State.Subjects[subj]
}

// Barrier publishes a resume of a fresh id to m and waits for its answer.
// A member handles phase events in order, so once it answers, every event
// published before has been handled as far as it is handled at once.
func (b *Bridge) Barrier(m events.Member) {
	b.t.Helper()
	h := b.Header(fmt.Sprintf("barrier-%d", b.seq+1), 10*time.Second, m)
	b.Ack(b.Publish(events.Resume{PhaseHeader: h}), events.PhaseResume, m)
}

// Code returns an ack's error code, "" when it is ok.
func Code(a events.Ack) string {
	h := a.Header()
	if h.OK {
		return ""
	}
	return h.Error.Code
}

// rawMsg turns a stored stream message back into a NATS message.
func rawMsg(raw *natsjs.RawStreamMsg) *nats.Msg {
	return &nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}
}
