package membertest

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
)

// Intruder plays a hostile client of the bus (PROTOCOL §4): one that reads
// every Nats-Msg-Id the stream holds, tells from them the ids that a
// scheme derived from what the bus shows would give the publishes to
// come, and publishes those ids first, on a subject of another run.
// Deduplication spans the whole stream: a publisher whose id it told has
// its publish answered as a duplicate of the intruder's and not stored.
type Intruder struct {
	env *jstest.Env
	t   testing.TB
	// Subject is where its messages go (default sp.intruder.ack.1.prepare.sandbox.x,
	// a sandbox daemon's own ack subject in another run).
	Subject string
}

// NewIntruder returns an Intruder on env.
func NewIntruder(t testing.TB, env *jstest.Env) *Intruder {
	return &Intruder{env: env, t: t, Subject: events.AckSubject("intruder", 1, events.PhasePrepare, "sandbox.x")}
}

// Seen returns every Nats-Msg-Id the stream holds, but the intruder's own,
// oldest first.
func (in *Intruder) Seen() []string {
	in.t.Helper()
	ctx := in.t.Context()
	info, err := in.env.Bus.Stream.Info(ctx)
	if err != nil {
		in.t.Fatalf("membertest: intruder: stream info: %v", err)
	}
	if info.State.Msgs == 0 {
		return nil
	}
	cons, err := in.env.Bus.Stream.OrderedConsumer(ctx, natsjs.OrderedConsumerConfig{HeadersOnly: true})
	if err != nil {
		in.t.Fatalf("membertest: intruder: read the stream: %v", err)
	}
	var ids []string
	// As many as it held: a batch is answered as soon as it is full.
	for last, left := uint64(0), info.State.Msgs; last < info.State.LastSeq && left > 0; {
		batch, err := cons.Fetch(int(min(left, 1000)), natsjs.FetchMaxWait(10*time.Second))
		if err != nil {
			in.t.Fatalf("membertest: intruder: read the stream: %v", err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			md, err := msg.Metadata()
			if err != nil {
				in.t.Fatalf("membertest: intruder: read the stream: %v", err)
			}
			last = md.Sequence.Stream
			if id := msg.Headers().Get(nats.MsgIdHdr); id != "" && msg.Subject() != in.Subject {
				ids = append(ids, id)
			}
		}
		left -= uint64(n)
		if err := batch.Error(); err != nil || n == 0 {
			in.t.Fatalf("membertest: intruder: read the stream to %d, at %d: %v", info.State.LastSeq, last, err)
		}
	}
	return ids
}

// phases are every phase, for Guesses.
var phases = []events.Phase{events.PhasePrepare, events.PhaseRenew, events.PhaseCommit, events.PhaseResume,
	events.PhaseRestore, events.PhaseRetire, events.PhaseForget, events.PhaseRelease, events.PhaseBranch}

// Guesses returns the ids of run's publishes to come, as told from the
// ids seen: each seen id, and each of its beginnings (an id whose last
// part is a nonce or drawn at random, less that part), with its sequence
// (the number after the run) moved on by 0 to ahead, a phase it names
// swapped for any phase, and a checkpoint it names (one of old) swapped
// for any of next; and every outcome's <run>.<checkpoint>.<noun>.<verb>
// of each of next. Against ids derived from run, sequence, phase, member,
// checkpoint and a nonce the bus shows, these are the ids to come; an id
// with a part drawn at random for it is never among them. The ids seen
// are not: they are published already.
func Guesses(run string, seen []string, ahead uint64, old []string, next ...string) map[string]bool {
	out := map[string]bool{}
	for _, id := range seen {
		f := strings.Split(id, ".")
		for l := 2; l <= len(f); l++ {
			for _, g := range swapped(f[:l], ahead, old, next) {
				out[strings.Join(g, ".")] = true
			}
		}
	}
	for _, c := range next {
		for _, typ := range events.Types() {
			if strings.HasPrefix(typ.Noun(), "checkpoint.") || strings.HasPrefix(typ.Noun(), "restore.") || strings.HasPrefix(typ.Noun(), "release.") {
				out[run+"."+c+"."+typ.Noun()] = true
			}
		}
	}
	for _, id := range seen {
		delete(out, id) // published already
	}
	return out
}

// swapped returns fields f with the sequence (f[1], if a number) moved
// on, each phase swapped and each checkpoint of old swapped for one of
// next, in every combination.
func swapped(f []string, ahead uint64, old, next []string) [][]string {
	variants := [][]string{slices.Clone(f)}
	for i := range f {
		var alts []string
		if n, err := strconv.ParseUint(f[i], 10, 64); err == nil && i == 1 {
			for k := uint64(1); k <= ahead; k++ {
				alts = append(alts, strconv.FormatUint(n+k, 10))
			}
		}
		if slices.Contains(phases, events.Phase(f[i])) {
			for _, p := range phases {
				if string(p) != f[i] {
					alts = append(alts, string(p))
				}
			}
		}
		if slices.Contains(old, f[i]) {
			alts = append(alts, next...)
		}
		var more [][]string
		for _, v := range variants {
			for _, a := range alts {
				w := slices.Clone(v)
				w[i] = a
				more = append(more, w)
			}
		}
		variants = append(variants, more...)
	}
	return variants
}

// Claim publishes a message carrying each of ids on the intruder's
// subject, and returns how many the stream stored (an id it holds already
// is a duplicate).
func (in *Intruder) Claim(ids map[string]bool) int {
	in.t.Helper()
	var futures []natsjs.PubAckFuture
	for id := range ids {
		msg := nats.NewMsg(in.Subject)
		msg.Header.Set(nats.MsgIdHdr, id)
		f, err := in.env.JS.PublishMsgAsync(msg)
		if err != nil {
			in.t.Fatalf("membertest: intruder: publish: %v", err)
		}
		futures = append(futures, f)
	}
	stored := 0
	for _, f := range futures {
		select {
		case ack := <-f.Ok():
			if !ack.Duplicate {
				stored++
			}
		case err := <-f.Err():
			in.t.Fatalf("membertest: intruder: publish: %v", err)
		case <-in.t.Context().Done():
			in.t.Fatal("membertest: intruder: the test ended before its publishes were answered")
		}
	}
	return stored
}
