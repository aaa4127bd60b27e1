package member

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/member/feed"
)

// reply publishes an ack once and acknowledges the event it answers.
func (m *Member) reply(ctx context.Context, r Reply) {
	seq := r.Header.Seq
	hm := m.take(seq)
	log, took := plainLog(&m.log), time.Duration(0)
	if hm != nil {
		log, took = hm.log, m.cfg.Now().Sub(hm.received)
	}
	ack := r.Ack(took)
	if ra, ok := ack.(events.ResumeAck); ok {
		if rep := m.continued[r.Header.CheckpointID]; rep != nil {
			ra.Pause = rep
			ack = ra
			delete(m.continued, r.Header.CheckpointID)
		}
	}
	msg, err := events.Marshal(m.cfg.Member, ack, events.WithID(m.ackID(seq, r.Phase)), events.WithTime(m.cfg.Now()))
	if err != nil {
		log.Error().Err(err).Msg("cannot build the ack; event dropped")
		if hm != nil {
			for _, dl := range hm.dls {
				_ = dl.Term("member cannot build its ack")
			}
		}
		return
	}
	repeat := false
	if events.LiveAck(r.Phase, m.cfg.Member) {
		// A resume ack, and every ack of a sandbox daemon, go on core
		// NATS, not into the stream (PROTOCOL §3): the bridge never waits
		// for a resume ack, and takes the first ack it hears of each
		// daemon. Kept, they are said again to whoever asks on the alive
		// subject (one lost on the way); a phase answered already (but a
		// resume, handled again) is not said again unasked, so that a
		// daemon acks it once.
		if r.Phase != events.PhaseResume && m.liveAck(seq, r.Phase) != nil {
			repeat = true
		} else {
			err = m.cfg.JS.Conn().PublishMsg(msg)
			if err == nil {
				m.keepLiveAck(seq, r.Phase, msg)
			}
		}
	} else {
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		_, err = jetstream.PublishOnce(cctx, m.cfg.JS, msg)
		cancel()
	}
	if err != nil && !errors.Is(err, jetstream.ErrAlreadyDone) {
		log.Warn().Err(err).Msg("cannot publish the ack; the event will come again")
		if hm != nil {
			for _, dl := range hm.dls {
				_ = dl.Nak(time.Second)
			}
		}
		return
	}
	if err != nil && r.Phase == events.PhaseCommit && r.Header.OK {
		// Refused as a repeat: the ack recorded first is the manifest's
		// record. Another manifest there means another process of this
		// member committed other records (PROTOCOL §5, commit).
		var want *events.MemberManifest
		if ca, ok := ack.(events.CommitAck); ok {
			want = ca.Manifest
		}
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		cerr := CheckRecorded(cctx, m.stream, msg.Subject, want)
		cancel()
		if cerr != nil {
			log.Error().Err(cerr).Msg("the commit ack recorded first is not this process's: the checkpoint holds the other")
		}
	}
	ev := log.Info()
	if !r.Header.OK {
		ev = log.Warn().Str("code", r.Header.Error.Code).Str("detail", r.Header.Error.Detail)
	}
	ev.Str("state", string(r.Header.State)).Dur("took", took).Bool("repeat", repeat || err != nil).Msg("answered")
	if hm != nil {
		m.ackAll(hm.dls...)
	}
}

// ackID returns the id of the member's ack to phase p of sequence seq:
// <run>.<seq>.<phase>.<member> and a random part drawn once (PROTOCOL §4).
// An ack published again by this process (the phase delivered again after
// a publish that failed) is then the same publish to the server, and no
// one can publish the id first to have the ack dropped as a duplicate of
// theirs. A restarted process draws another; the once-only subject
// refuses its second ack all the same (PROTOCOL §3, acks).
func (m *Member) ackID(seq uint64, p events.Phase) string {
	return m.ackIDs.For(m.cfg.Run + "." + strconv.FormatUint(seq, 10) + "." + string(p) + "." + string(m.cfg.Member))
}

// liveAcksKept bounds the acks on core NATS a member keeps to say again:
// far more phases than a checkpoint has.
const liveAcksKept = 16

// liveAck is an ack the member published on core NATS.
type liveAck struct {
	seq   uint64
	phase events.Phase
	msg   *nats.Msg
}

// keepLiveAck keeps msg, the ack of phase seq published on core NATS, in
// place of one kept before for the same phase (a resume handled again).
func (m *Member) keepLiveAck(seq uint64, p events.Phase, msg *nats.Msg) {
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	m.liveAcks = slices.DeleteFunc(m.liveAcks, func(a liveAck) bool { return a.seq == seq && a.phase == p })
	m.liveAcks = append(m.liveAcks, liveAck{seq: seq, phase: p, msg: msg})
	if len(m.liveAcks) > liveAcksKept {
		m.liveAcks = slices.Delete(m.liveAcks, 0, len(m.liveAcks)-liveAcksKept)
	}
}

// liveAck returns the ack of phase seq published on core NATS, nil if
// none is kept.
func (m *Member) liveAck(seq uint64, p events.Phase) *nats.Msg {
	m.liveMu.Lock()
	defer m.liveMu.Unlock()
	for i := len(m.liveAcks) - 1; i >= 0; i-- {
		if a := m.liveAcks[i]; a.seq == seq && a.phase == p {
			return a.msg
		}
	}
	return nil
}

// sayAgain takes the body of a request on the alive subject
// (events.AliveQuery), publishes again the ack it names, if the member
// published it on core NATS and keeps it, and returns that ack (nil if
// none): the asker (the bridge, or an agent waiting for its sandbox's
// prepare ack) may have missed it, and the answer to the request carries
// it too, on the asker's own inbox, which a flood of the ack's subject does
// not reach. It runs on the subscription's goroutine.
func (m *Member) sayAgain(body []byte) *nats.Msg {
	if len(body) == 0 {
		return nil
	}
	var q events.AliveQuery
	if err := json.Unmarshal(body, &q); err != nil || q.Seq == 0 {
		return nil
	}
	msg := m.liveAck(q.Seq, q.Phase)
	if msg == nil {
		return nil
	}
	if err := m.cfg.JS.Conn().PublishMsg(msg); err != nil {
		m.log.Debug().Err(err).Uint64("seq", q.Seq).Str("phase", string(q.Phase)).Msg("cannot say the ack again")
	}
	return msg
}

// ackAll acknowledges deliveries, logging what fails.
func (m *Member) ackAll(dls ...feed.Delivery) {
	for _, dl := range dls {
		if err := dl.Ack(); err != nil {
			m.log.Warn().Err(err).Msg("ack")
		}
	}
}

// allHeld returns every delivery waiting for an answer.
func (m *Member) allHeld() []feed.Delivery {
	var out []feed.Delivery
	for _, hm := range m.held {
		out = append(out, hm.dls...)
	}
	return out
}

func (m *Member) inProgress(dls []feed.Delivery) {
	for _, dl := range dls {
		_ = dl.InProgress()
	}
}

// withProgress runs fn, a call that blocks the loop, and keeps every held
// delivery alive meanwhile. A delivery of the core feed has no ack wait
// to keep alive: a sandbox daemon's prepare and resume start no ticker
// (a goroutine and a timer per daemon per phase, for nothing).
func (m *Member) withProgress(fn func()) {
	dls := m.allHeld()
	if _, core := m.feed.(*feed.Core); core || len(dls) == 0 {
		fn()
		return
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(AckWait / 3)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				m.inProgress(dls)
			}
		}
	})
	defer wg.Wait()
	defer close(stop)
	fn()
}
