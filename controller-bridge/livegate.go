package bridge

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	cloudevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/events"
)

// liveGate admits the acks of one phase that come on core NATS
// (events.LiveAck: the resume acks, and every ack of a sandbox daemon), on
// the goroutine of the subscription that hears them, before anything else
// reads them. A sandbox's workload can read its daemon's credentials and
// publish on its daemon's ack subjects as fast as it likes; the gate keeps
// what that costs the bridge bounded: it takes each member's first valid
// ack of the phase and drops every later message of that member
// undecoded, and it decodes at most liveGarbage messages of a member that
// are no valid ack before it drops that member's messages undecoded too.
// What a member sends takes only its own place: the subject names the
// member, the ack must name the same, and a sandbox's credentials publish
// on its own subjects alone.
type liveGate struct {
	prefix string // spl.<run>.ack.<seq>.<phase>.
	phase  events.Phase
	h      events.PhaseHeader
	log    zerolog.Logger

	mu      sync.Mutex
	taken   map[string]bool // by member: its first valid ack was taken
	refused map[string]int  // by member: messages that were no valid ack
	dropped int             // messages dropped undecoded
}

// liveGarbage is how many messages of one member that are no valid ack of
// the phase a gate decodes before it drops the rest undecoded. A daemon
// sends one ack a phase, and says it again when asked (events.AliveQuery);
// one whose messages are all refused is silent to the phase, as a
// workload that holds its credentials can make it anyway.
const liveGarbage = 16

// Pending limits of a subscription of acks on core NATS: well above a
// fleet's acks at once (10,000 daemons' are about 20 MB), so that none of
// those is dropped for a slow reader, and bounded, so that a flood the gate
// cannot keep up with costs the bridge this much memory at most. What
// nats.go drops past them (a slow consumer) the probe of the silent
// daemons asks for again (PROTOCOL §3, Liveness).
const (
	liveAcksPendingMsgs  = 1 << 18
	liveAcksPendingBytes = 256 << 20
)

// newLiveGate returns the gate of the acks of phase p, h, of run.
func newLiveGate(run string, p events.Phase, h events.PhaseHeader, log zerolog.Logger) *liveGate {
	return &liveGate{prefix: events.LivePrefix + "." + run + ".ack." + strconv.FormatUint(h.Seq, 10) + "." + string(p) + ".",
		phase: p, h: h, log: log, taken: map[string]bool{}, refused: map[string]int{}}
}

// filter returns the subject the gate's subscription hears: the acks of
// its phase of one kind of member (kind ""), every kind.
func (g *liveGate) filter(kind events.MemberKind) string {
	if kind == "" {
		return g.prefix + ">"
	}
	return g.prefix + string(kind) + ".*"
}

// admit returns the ack msg carries, and its event, if it is its member's
// first valid ack of the gate's phase; nil otherwise.
func (g *liveGate) admit(msg *nats.Msg) (events.Ack, cloudevent.Event) {
	member, ok := strings.CutPrefix(msg.Subject, g.prefix)
	g.mu.Lock()
	if !ok || g.taken[member] || g.refused[member] >= liveGarbage {
		g.dropped++
		g.mu.Unlock()
		return nil, cloudevent.Event{}
	}
	g.mu.Unlock()
	ev, ack, err := g.decode(msg)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.refused[member]++
		if g.refused[member] == 1 {
			g.log.Warn().Err(err).Str("subject", msg.Subject).Msg("refusing a message on an ack subject")
		}
		return nil, cloudevent.Event{}
	}
	if g.taken[member] {
		g.dropped++
		return nil, cloudevent.Event{}
	}
	g.taken[member] = true
	return ack, ev
}

// admitAsked is admit for msg, the answer of member m to a probe that
// named the phase (events.AliveQuery): the ack m keeps of it, which comes
// on the asker's inbox, not on m's ack subject. It is taken if it is m's
// first valid ack, whatever the gate dropped of m's subject: a flood there
// (m's workload holds its credentials) does not keep the daemon's own ack
// out. An answer that is no such ack (an instance) is ignored.
func (g *liveGate) admitAsked(m events.Member, msg *nats.Msg) (events.Ack, cloudevent.Event) {
	msg = &nats.Msg{Subject: g.prefix + string(m), Header: msg.Header, Data: msg.Data}
	ev, ack, err := g.decode(msg)
	if err != nil {
		return nil, cloudevent.Event{}
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.taken[string(m)] {
		return nil, cloudevent.Event{}
	}
	g.taken[string(m)] = true
	return ack, ev
}

// errNotThisPhase: an ack of another phase, sequence, checkpoint or epoch.
var errNotThisPhase = errors.New("bridge: not an ack of this phase")

// decode reads msg as an ack of the gate's phase.
func (g *liveGate) decode(msg *nats.Msg) (cloudevent.Event, events.Ack, error) {
	ev, d, err := events.Unmarshal(msg)
	if err != nil {
		return ev, nil, err
	}
	ack, ok := d.(events.Ack)
	if !ok {
		return ev, nil, fmt.Errorf("%w: a %s", errNotThisPhase, d.Type())
	}
	h := ack.Header()
	if ack.Answers() != g.phase || h.Seq != g.h.Seq || h.CheckpointID != g.h.CheckpointID || h.Epoch != g.h.Epoch {
		return ev, nil, fmt.Errorf("%w: %s seq %d of %s in epoch %d", errNotThisPhase, ack.Answers(), h.Seq, h.CheckpointID, h.Epoch)
	}
	if c, ok := ack.(events.CommitAck); ok && c.Manifest != nil && h.Member.Kind() == events.KindSandbox {
		// A daemon exports nothing (PROTOCOL §5, commit): a manifest in
		// its name would be in the member list, and a restore would need
		// a fresh daemon of that name.
		return ev, nil, fmt.Errorf("%w: a sandbox daemon's commit ack with a manifest", errNotThisPhase)
	}
	return ev, ack, nil
}

// report logs what the gate refused and dropped, if anything: once, as
// its subscription ends.
func (g *liveGate) report() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.refused) == 0 && g.dropped == 0 {
		return
	}
	ev := g.log.Warn()
	if len(g.refused) == 0 {
		ev = g.log.Debug() // repeats: a daemon asked by a probe says its ack again
	}
	var who []string
	n := 0
	for m, c := range g.refused {
		n += c
		who = append(who, m)
	}
	slices.Sort(who)
	if len(who) > 10 {
		who = who[:10]
	}
	ev.Str("phase", string(g.phase)).Uint64("seq", g.h.Seq).Int("refused", n).Int("members_refused", len(g.refused)).
		Strs("first", who).Int("dropped", g.dropped).Msg("messages on the phase's ack subjects that were no first valid ack: dropped")
}
