package events

import (
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// SubjectPrefix is the first token of every Stillpoint subject; the
// STILLPOINT stream captures "sp.>".
const SubjectPrefix = "sp"

// PhaseSubject returns sp.<run>.phase.<phase>.
func PhaseSubject(run string, p Phase) string {
	return SubjectPrefix + "." + run + ".phase." + string(p)
}

// PhaseFilter returns the filter a member consumes phases with,
// sp.<run>.phase.>.
func PhaseFilter(run string) string { return SubjectPrefix + "." + run + ".phase.>" }

// LivePrefix is the first token of the subjects on which the STILLPOINT
// stream republishes each phase it stored (PROTOCOL §3, Consumers): a
// phase the stream refused (a zombie bridge's, fenced) is never
// republished. It is outside "sp.>", so not captured again.
const LivePrefix = "spl"

// LivePhaseFilter returns spl.<run>.phase.>, the phases of run the stream
// stored that address sandbox daemons, as the bridge publishes them again
// for core subscribers (LiveCopy).
func LivePhaseFilter(run string) string { return LivePrefix + "." + run + ".phase.>" }

// HeaderLivePrev is the header of a live copy (LiveCopy) that names the
// phase sequence of the live copy the bridge published before it: a
// subscriber that has seen that one missed nothing, though phase
// sequences in between (phases that address no sandbox daemon) it never
// sees.
const HeaderLivePrev = "Sp-Live-Prev"

// LiveCopy returns the live copy of a phase the stream stored as msg at
// stream sequence streamSeq (PROTOCOL §3, live phases): the same headers
// and data on spl.<run>.phase.<phase>, with the stream sequence
// (Nats-Sequence), the subject it is stored on (Nats-Subject), and prev,
// the phase sequence of the bridge's live copy before it (HeaderLivePrev).
func LiveCopy(msg *nats.Msg, streamSeq, prev uint64) *nats.Msg {
	out := &nats.Msg{Subject: LivePrefix + strings.TrimPrefix(msg.Subject, SubjectPrefix), Header: make(nats.Header, len(msg.Header)+3), Data: msg.Data}
	for k, v := range msg.Header {
		out.Header[k] = v
	}
	out.Header.Set("Nats-Sequence", strconv.FormatUint(streamSeq, 10))
	out.Header.Set("Nats-Subject", msg.Subject)
	out.Header.Set(HeaderLivePrev, strconv.FormatUint(prev, 10))
	return out
}

// AckSubject returns sp.<run>.ack.<seq>.<phase>.<member>: one subject per
// (phase event, member), written once (PROTOCOL §3).
func AckSubject(run string, seq uint64, p Phase, m Member) string {
	return SubjectPrefix + "." + run + ".ack." + strconv.FormatUint(seq, 10) + "." + string(p) + "." + string(m)
}

// AckFilter returns the filter for every ack of one phase event,
// sp.<run>.ack.<seq>.>.
func AckFilter(run string, seq uint64) string {
	return SubjectPrefix + "." + run + ".ack." + strconv.FormatUint(seq, 10) + ".>"
}

// LiveAckSubject returns spl.<run>.ack.<seq>.<phase>.<member>: an ack
// published on core NATS, outside the stream (LiveAck says which): a
// fleet's acks stored would be a persisted write per sandbox daemon per
// phase.
func LiveAckSubject(run string, seq uint64, p Phase, m Member) string {
	return LivePrefix + "." + run + ".ack." + strconv.FormatUint(seq, 10) + "." + string(p) + "." + string(m)
}

// LiveAck tells whether member m's ack of phase p travels on core NATS
// (LiveAckSubject) rather than into the stream (PROTOCOL §3, acks): every
// resume ack, and every ack of a sandbox daemon. A sandbox's workload can
// read its daemon's credentials, which therefore publish nothing into the
// stream: the bridge hears a daemon's acks while it waits for them, takes
// the first valid one of each daemon, and records them (AckRecorded); a
// daemon asked whether it is there with the phase named (AliveQuery) says
// its answer again.
func LiveAck(p Phase, m Member) bool {
	return p == PhaseResume || m.Kind() == KindSandbox
}

// AckRecorded tells whether member m's ack of phase p is kept in the
// stream on its ack subject (AckSubject), where a member that sees the
// phase again, a replaying bridge and the audit log find it: every ack
// but a resume's and a sandbox daemon's prepare's, which the bridge
// records in summary (ResumeAcked, PrepareAcked). A daemon's other acks
// travel on core NATS (LiveAck), and the bridge stores the first valid one
// it hears of each daemon on its ack subject, as the daemon's event.
func AckRecorded(p Phase, m Member) bool {
	return p != PhaseResume && !(p == PhasePrepare && m.Kind() == KindSandbox)
}

// AliveQuery is the optional body of a request on a member's alive
// subject: a member that answered phase Seq (Phase) with an ack that
// travels on core NATS (LiveAck) publishes that ack again, so that one the
// asker missed (core NATS delivers at most once) is heard, and answers with
// it (its headers and data) instead of its instance: the answer comes on
// the asker's own inbox, which a flood of the ack's subject does not
// reach. An empty body asks nothing more.
type AliveQuery struct {
	Seq   uint64 `json:"seq"`
	Phase Phase  `json:"phase"`
}

// LiveAckFilter returns spl.<run>.ack.*.<phase>.>, every core-NATS ack of
// one phase kind in a run (what the bridge subscribes to).
func LiveAckFilter(run string, p Phase) string {
	return LivePrefix + "." + run + ".ack.*." + string(p) + ".>"
}

// OutcomeSubject returns sp.<run>.outcome.<noun>.<verb> for an outcome type.
func OutcomeSubject(run string, t Type) string {
	return SubjectPrefix + "." + run + ".outcome." + t.Noun()
}

// MemberSubject returns sp.<run>.member.<member>.
func MemberSubject(run string, m Member) string {
	return SubjectPrefix + "." + run + ".member." + string(m)
}

// RunFilter returns sp.<run>.>, everything one run said.
func RunFilter(run string) string { return SubjectPrefix + "." + run + ".>" }

// ServicePrefix is the first token of every participant's request/reply
// service subject. Services are outside the audit stream: the stream
// captures sp.> only.
const ServicePrefix = "spsvc"

// ServiceSubject returns spsvc.<run>.<kind>.<name>, the subject prefix of
// member m's micro service (an agent's run endpoint, an owner's sessions,
// a sandbox daemon's launches); endpoints are one token below it.
func ServiceSubject(run string, m Member) string {
	return ServicePrefix + "." + run + "." + string(m.Kind()) + "." + m.Name()
}

// AliveSubject returns spsvc.<run>.<kind>.<name>.alive, on which member m's
// runtime answers with its instance for as long as it runs (PROTOCOL §3,
// Liveness): requests there that find no responder for AliveUnanswered
// find the member gone, however long its heartbeat still lives.
func AliveSubject(run string, m Member) string { return ServiceSubject(run, m) + ".alive" }

// AliveUnanswered is how long a member's alive subject must find no
// responder, asked again in between, before the member is taken for gone
// (PROTOCOL §3, Liveness): one such answer may be a member reconnecting
// (a server restarted, a link flapping), which a client does in a second
// or two.
const AliveUnanswered = 5 * time.Second

// ServiceName returns the NATS micro service name of a member kind's
// service, what `nats micro ls` lists and the $SRV discovery subjects carry:
// stillpoint-agent, stillpoint-owner, stillpoint-sandboxd ("" for another
// kind). A member's credentials answer discovery under its kind's name only.
func ServiceName(kind MemberKind) string {
	switch kind {
	case KindAgent:
		return "stillpoint-agent"
	case KindOwner:
		return "stillpoint-owner"
	case KindSandbox:
		return "stillpoint-sandboxd"
	}
	return ""
}

// ServiceFilter returns spsvc.<run>.<kind>.*.>, every endpoint of every
// member of one kind in a run (what a role's permissions name).
func ServiceFilter(run string, kind MemberKind) string {
	return ServicePrefix + "." + run + "." + string(kind) + ".*.>"
}
