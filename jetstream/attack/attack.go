package attack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
)

// Outcome is what the server did with one attack: Refused when it refused
// every attempt (a permissions violation, or an error of the JetStream
// API); otherwise Detail says what got through, which the run must then
// show harmless.
type Outcome struct {
	// Attack names the attack (one of Names).
	Attack string `json:"attack"`
	// Refused is true when nothing of the attack was accepted.
	Refused bool `json:"refused"`
	// Detail says what was tried and what the server answered.
	Detail string `json:"detail"`
}

// String formats the outcome for a log line.
func (o Outcome) String() string {
	v := "got through"
	if o.Refused {
		v = "refused"
	}
	return o.Attack + ": " + v + ": " + o.Detail
}

// The attacks, by name, in the order All runs them: issue 29's list.
const (
	// Dedupe publishes, on the attacker's own ack subject, messages whose
	// Nats-Msg-Id is each id the run's publishers could use next as far as
	// anything readable predicts it: the ids of the newest phase and
	// committed outcome (their headers), their sequence numbers advanced,
	// every phase name and the victims' names put in. A stored one would
	// make the real publish a duplicate.
	Dedupe = "dedupe"
	// ConsumerUpdate creates, with the victims' durable consumer names
	// (member.ConsumerName) and the filter of the run's phases, consumers
	// configured to starve them: a create on an existing name updates it.
	ConsumerUpdate = "consumer-update"
	// Durables creates durable consumers of its own.
	Durables = "durables"
	// Rollup puts the attacker's own heartbeat key with Nats-Rollup: all,
	// which purges every key of the bucket where rollups are allowed: in its
	// kind's bucket (a sandbox's, sp_daemons) and in sp_members; an owner
	// also a key of the snapshot index (sp_snapshots), which a run's owners
	// share and any of them may write.
	Rollup = "rollup"
	// Metadata asks the stream's info with a subject filter of ">", which
	// lists every subject of the stream.
	Metadata = "metadata"
	// Flood publishes FloodBytes on the attacker's own ack subjects (a
	// sandbox's on core NATS, where its acks travel).
	Flood = "flood"
)

// Names are the attacks All runs, in order.
var Names = []string{Dedupe, ConsumerUpdate, Durables, Rollup, Metadata, Flood}

// FloodBytes is how much one Flood publishes.
const FloodBytes = 16 << 20

// Target is what the attacks aim at: the run and member whose credentials
// the connection has, and the victims whose names they borrow.
type Target struct {
	Run     string
	Self    events.Member
	Victims []events.Member
}

// Attacker runs attacks on one connection, made with Connect, which
// counts the server's permissions violations.
type Attacker struct {
	nc *nats.Conn
	t  Target

	mu         sync.Mutex
	violations []string
}

// Connect connects with cfg (the attacker's credentials) as t.Self.
func Connect(ctx context.Context, cfg jetstream.ConnConfig, t Target) (*Attacker, error) {
	a := &Attacker{t: t}
	nc, err := jetstream.Connect(ctx, cfg, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			a.mu.Lock()
			a.violations = append(a.violations, err.Error())
			a.mu.Unlock()
		}
	}), nats.MaxReconnects(-1))
	if err != nil {
		return nil, err
	}
	a.nc = nc
	return a, nil
}

// Close closes the connection.
func (a *Attacker) Close() { a.nc.Close() }

// All runs every attack once, in order.
func (a *Attacker) All(ctx context.Context) []Outcome {
	out := make([]Outcome, 0, len(Names))
	for _, n := range Names {
		out = append(out, a.Run(ctx, n))
	}
	return out
}

// Run runs the attack named name.
func (a *Attacker) Run(ctx context.Context, name string) Outcome {
	switch name {
	case Dedupe:
		return a.dedupe(ctx)
	case ConsumerUpdate:
		return a.consumerUpdate(ctx)
	case Durables:
		return a.durables(ctx)
	case Rollup:
		return a.rollup(ctx)
	case Metadata:
		return a.metadata(ctx)
	case Flood:
		return a.flood(ctx)
	}
	return Outcome{Attack: name, Detail: "no such attack"}
}

// apiWait bounds one JetStream API request: a refused publish gets no
// answer, only a violation.
const apiWait = 2 * time.Second

// request sends a JetStream API request and returns the answer, or why
// there is none: a permissions violation, a timeout.
func (a *Attacker) request(ctx context.Context, subject string, body any, hdr nats.Header) (map[string]any, error) {
	var b []byte
	if body != nil {
		b, _ = json.Marshal(body)
	}
	msg, err := a.roundTrip(ctx, &nats.Msg{Subject: subject, Data: b, Header: hdr})
	if err != nil {
		return nil, err
	}
	var out map[string]any
	if json.Unmarshal(msg.Data, &out) != nil {
		return map[string]any{"raw": string(msg.Data)}, nil
	}
	if e, ok := out["error"]; ok && e != nil {
		return out, fmt.Errorf("api error: %v", e)
	}
	return out, nil
}

// roundTrip publishes msg with a reply inbox of its own and returns the
// answer, or a permissions violation as soon as the server reports one
// (a refused publish gets no answer), or a timeout after apiWait.
func (a *Attacker) roundTrip(ctx context.Context, msg *nats.Msg) (*nats.Msg, error) {
	replies, err := a.nc.SubscribeSync(a.nc.NewRespInbox())
	if err != nil {
		return nil, err
	}
	defer func() { _ = replies.Unsubscribe() }()
	msg.Reply = replies.Subject
	before := a.violationCount()
	if err := a.nc.PublishMsg(msg); err != nil {
		return nil, err
	}
	// The server reports a violation before it answers the flush's ping.
	_ = a.nc.FlushTimeout(apiWait)
	deadline := time.Now().Add(apiWait)
	for {
		if m, err := replies.NextMsg(20 * time.Millisecond); err == nil {
			if m.Header.Get("Status") == "503" {
				return nil, nats.ErrNoResponders
			}
			return m, nil
		}
		if a.violationCount() > before {
			return nil, fmt.Errorf("permissions violation: %s", a.lastViolation())
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return nil, fmt.Errorf("no answer within %s", apiWait)
		}
	}
}

// publish publishes and reports a permissions violation, waiting a moment
// for the server's word (a core publish has no answer).
func (a *Attacker) publish(msg *nats.Msg) error {
	before := a.violationCount()
	if err := a.nc.PublishMsg(msg); err != nil {
		return err
	}
	if err := a.nc.Flush(); err != nil {
		return err
	}
	if a.waitViolation(before) {
		return fmt.Errorf("permissions violation: %s", a.lastViolation())
	}
	return nil
}

// waitViolation waits up to 500 ms for a violation after the first
// before, and says whether one came.
func (a *Attacker) waitViolation(before int) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	return poll.Until(ctx, poll.Every(20*time.Millisecond), func() (bool, error) {
		if a.violationCount() > before {
			return true, nil
		}
		// A ping round trip: the server sends the violation before the pong.
		err := a.nc.FlushTimeout(100 * time.Millisecond)
		return err == nil && a.violationCount() > before, nil
	}) == nil
}

func (a *Attacker) violationCount() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.violations)
}

func (a *Attacker) lastViolation() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.violations) == 0 {
		return ""
	}
	return a.violations[len(a.violations)-1]
}

// ackSubject is an ack subject of the attacker's own: what its
// permissions let it publish into the stream.
func (a *Attacker) ackSubject(seq uint64, p events.Phase) string {
	return events.AckSubject(a.t.Run, seq, p, a.t.Self)
}

// lastMsg reads the newest message of subject by a direct get, as a
// sandbox may: its headers carry the publisher's Nats-Msg-Id.
func (a *Attacker) lastMsg(ctx context.Context, subject string) (*nats.Msg, error) {
	rctx, cancel := context.WithTimeout(ctx, apiWait)
	defer cancel()
	m, err := a.nc.RequestMsgWithContext(rctx, &nats.Msg{Subject: "$JS.API.DIRECT.GET." + jetstream.StreamName + "." + subject})
	if err != nil {
		return nil, err
	}
	if st := m.Header.Get("Status"); st != "" {
		return nil, fmt.Errorf("direct get of %s: status %s %s", subject, st, m.Header.Get("Description"))
	}
	return m, nil
}

func (a *Attacker) dedupe(ctx context.Context) Outcome {
	o := Outcome{Attack: Dedupe}
	var seen []string
	for _, subj := range []string{events.PhaseFilter(a.t.Run), events.OutcomeSubject(a.t.Run, events.TypeCheckpointCommitted)} {
		if m, err := a.lastMsg(ctx, subj); err == nil {
			if id := m.Header.Get(nats.MsgIdHdr); id != "" {
				seen = append(seen, id)
			}
		}
	}
	guesses := predict(a.t, seen)
	stored, refused := 0, 0
	var last error
	// Every guess at once, answered on one inbox: a stored one answers a
	// PubAck; a refused one a violation, or nothing.
	replies, err := a.nc.SubscribeSync(a.nc.NewRespInbox())
	if err != nil {
		o.Detail = err.Error()
		return o
	}
	defer func() { _ = replies.Unsubscribe() }()
	before := a.violationCount()
	for i, id := range guesses {
		msg := &nats.Msg{Subject: a.ackSubject(uint64(1_000_000+i), events.PhaseCommit), Reply: replies.Subject, Data: []byte("{}"),
			Header: nats.Header{nats.MsgIdHdr: []string{id}}}
		if err := a.nc.PublishMsg(msg); err != nil {
			last = err
			break
		}
	}
	_ = a.nc.FlushTimeout(apiWait)
	deadline := time.Now().Add(apiWait)
	for stored+refused < len(guesses) && time.Now().Before(deadline) {
		if a.violationCount()-before >= len(guesses) {
			break
		}
		m, err := replies.NextMsg(50 * time.Millisecond)
		if err != nil {
			continue
		}
		if strings.Contains(string(m.Data), `"error"`) || m.Header.Get("Status") != "" {
			refused++
			last = errors.New(string(m.Data) + m.Header.Get("Description"))
			continue
		}
		stored++
	}
	refused = len(guesses) - stored
	if a.violationCount() > 0 && stored == 0 {
		last = errors.New(a.lastViolation())
	}
	o.Refused = stored == 0
	o.Detail = fmt.Sprintf("%d guessed ids from %d seen (%q): %d stored, %d refused (last: %v)", len(guesses), len(seen), seen, stored, refused, last)
	return o
}

// predict returns the ids a deterministic scheme would give next, from
// the ids seen: each with its numeric tokens advanced by 1..3 and every
// phase name put in place of one, and the old schemes' member ack ids
// (of the phases after those seen, and of the first phases).
func predict(t Target, seen []string) []string {
	phases := []string{"prepare", "commit", "resume", "abort", "restore", "release", "retire"}
	set := map[string]bool{}
	add := func(s string) { set[s] = true }
	for _, id := range seen {
		tok := strings.Split(id, ".")
		for i, x := range tok {
			if n, err := strconv.ParseUint(x, 10, 64); err == nil {
				for d := uint64(1); d <= 3; d++ {
					c := append([]string(nil), tok...)
					c[i] = strconv.FormatUint(n+d, 10)
					add(strings.Join(c, "."))
					for j, y := range c {
						for _, p := range phases {
							if y != p && contains(phases, y) {
								cc := append([]string(nil), c...)
								cc[j] = p
								add(strings.Join(cc, "."))
							}
						}
					}
				}
			}
		}
		// The old member ack ids, <run>.<seq>.<phase>.<member>.
		if len(tok) > 1 {
			if n, err := strconv.ParseUint(tok[1], 10, 64); err == nil {
				for d := uint64(0); d <= 3; d++ {
					for _, p := range phases {
						for _, v := range t.Victims {
							add(t.Run + "." + strconv.FormatUint(n+d, 10) + "." + p + "." + string(v))
						}
					}
				}
			}
		}
	}
	{
		// Whatever was readable: the old member ack ids of the first phases.
		for n := 1; n <= 6; n++ {
			for _, p := range phases {
				for _, v := range t.Victims {
					add(t.Run + "." + strconv.Itoa(n) + "." + p + "." + string(v))
				}
			}
		}
	}
	out := make([]string, 0, len(set))
	for s := range set {
		out = append(out, s)
	}
	return out
}

func contains(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

func (a *Attacker) consumerUpdate(ctx context.Context) Outcome {
	o := Outcome{Attack: ConsumerUpdate, Refused: true}
	var parts []string
	for _, v := range a.t.Victims {
		if v.Kind() == events.KindSandbox {
			continue
		}
		name := "sp_" + a.t.Run + "_" + string(v.Kind()) + "_" + v.Name()
		filter := events.PhaseFilter(a.t.Run)
		body := map[string]any{"stream_name": jetstream.StreamName, "config": map[string]any{
			"durable_name": name, "name": name, "filter_subject": filter, "ack_policy": "explicit",
			"max_ack_pending": 1, "ack_wait": int64(time.Hour), "deliver_policy": "all",
		}, "action": ""}
		_, err := a.request(ctx, "$JS.API.CONSUMER.CREATE."+jetstream.StreamName+"."+name+"."+filter, body, nil)
		if err == nil {
			o.Refused = false
			parts = append(parts, name+": updated")
			continue
		}
		parts = append(parts, name+": "+err.Error())
	}
	o.Detail = strings.Join(parts, "; ")
	return o
}

func (a *Attacker) durables(ctx context.Context) Outcome {
	o := Outcome{Attack: Durables, Refused: true}
	var parts []string
	for i := range 3 {
		name := fmt.Sprintf("att%d%d", time.Now().UnixNano()%1_000_000, i)
		filter := events.PhaseFilter(a.t.Run)
		body := map[string]any{"stream_name": jetstream.StreamName, "config": map[string]any{
			"durable_name": name, "name": name, "filter_subject": filter, "ack_policy": "explicit",
		}}
		_, err := a.request(ctx, "$JS.API.CONSUMER.CREATE."+jetstream.StreamName+"."+name+"."+filter, body, nil)
		if err == nil {
			o.Refused = false
			parts = append(parts, name+": made")
			continue
		}
		parts = append(parts, name+": "+err.Error())
	}
	o.Detail = strings.Join(parts, "; ")
	return o
}

func (a *Attacker) rollup(ctx context.Context) Outcome {
	o := Outcome{Attack: Rollup, Refused: true}
	// Its key in the bucket of its kind's heartbeats, and in sp_members,
	// where a sandbox daemon's heartbeat was before it had a bucket of its
	// own; an owner's, a key of the snapshot index too: refused only if
	// every one is.
	subjects := map[string]string{}
	for _, bucket := range []string{jetstream.HeartbeatBucket(a.t.Self.Kind()), jetstream.BucketMembers} {
		subjects[bucket] = "$KV." + bucket + "." + events.MemberKey(a.t.Run, a.t.Self)
	}
	if a.t.Self.Kind() == events.KindOwner {
		subjects[jetstream.BucketSnapshots] = "$KV." + jetstream.BucketSnapshots + ".rollup-" + a.t.Run + "-" + a.t.Self.Name()
	}
	var parts []string
	for _, bucket := range slices.Sorted(maps.Keys(subjects)) {
		subject := subjects[bucket]
		msg := &nats.Msg{Subject: subject, Data: []byte("{}"), Header: nats.Header{"Nats-Rollup": []string{"all"}}}
		before := a.violationCount()
		rctx, cancel := context.WithTimeout(ctx, apiWait)
		ack, err := a.nc.RequestMsgWithContext(rctx, msg)
		cancel()
		switch {
		case err != nil && (a.violationCount() > before || a.waitViolation(before)):
			parts = append(parts, bucket+": permissions violation: "+a.lastViolation())
		case err != nil:
			parts = append(parts, bucket+": "+err.Error())
		case strings.Contains(string(ack.Data), `"error"`):
			parts = append(parts, bucket+": "+string(ack.Data))
		default:
			o.Refused = false
			parts = append(parts, bucket+": stored: "+string(ack.Data))
		}
	}
	o.Detail = strings.Join(parts, "; ")
	return o
}

func (a *Attacker) metadata(ctx context.Context) Outcome {
	o := Outcome{Attack: Metadata}
	out, err := a.request(ctx, "$JS.API.STREAM.INFO."+jetstream.StreamName, map[string]any{"subjects_filter": ">"}, nil)
	if err != nil {
		o.Refused, o.Detail = true, err.Error()
		return o
	}
	n := 0
	if st, ok := out["state"].(map[string]any); ok {
		if subs, ok := st["subjects"].(map[string]any); ok {
			n = len(subs)
		}
	}
	o.Detail = fmt.Sprintf("stream info answered: %d subjects listed", n)
	return o
}

func (a *Attacker) flood(ctx context.Context) Outcome {
	o := Outcome{Attack: Flood}
	chunk := make([]byte, 64<<10)
	sent, stored := 0, 0
	before := a.violationCount()
	for i := 0; sent < FloodBytes && ctx.Err() == nil; i++ {
		// Where its acks travel: a sandbox's on core NATS (events.LiveAck),
		// which its credentials may publish at will.
		subj := a.ackSubject(uint64(2_000_000+i), events.PhaseCommit)
		if events.LiveAck(events.PhaseCommit, a.t.Self) {
			subj = events.LiveAckSubject(a.t.Run, uint64(2_000_000+i), events.PhaseCommit, a.t.Self)
		}
		if err := a.nc.Publish(subj, chunk); err != nil {
			break
		}
		sent += len(chunk)
	}
	_ = a.nc.Flush()
	// One more, asked for an answer: whether the stream stores them.
	rctx, cancel := context.WithTimeout(ctx, apiWait)
	ack, err := a.nc.RequestWithContext(rctx, a.ackSubject(3_000_000, events.PhaseCommit), chunk)
	cancel()
	if err == nil && !strings.Contains(string(ack.Data), `"error"`) {
		stored = 1
	}
	refused := a.violationCount() > before || a.waitViolation(before)
	o.Refused = stored == 0
	o.Detail = fmt.Sprintf("%d MiB published on its own ack subjects; stored: %v; violations: %v", sent>>20, stored == 1, refused)
	return o
}
