package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nuid"
	"github.com/rs/zerolog"

	"github.com/stillpoint/stillpoint/controller-bridge/bridgeapi"
	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// Bridge is the controller bridge of one run. Its methods are safe for
// concurrent use; operations run one at a time.
type Bridge struct {
	cfg      Config
	log      zerolog.Logger
	source   events.Member
	instance string // this process's nonce, in every phase id

	mu   sync.Mutex // one operation at a time
	held *heldCheckpoint

	bgCtx    context.Context // ends when Run returns
	bgCancel context.CancelFunc
	bg       sync.WaitGroup // resume watchers
}

// heldCheckpoint is a checkpoint held prepared for an outer save.
type heldCheckpoint struct {
	mu      sync.Mutex // held by a renew while it publishes
	req     bridgeapi.CheckpointRequest
	id      string
	prepare events.Prepare
	lastID  string // the id of the last phase this bridge published for it
	tally   *machine.Tally
	started time.Time
	prepMS  int64
	stop    context.CancelFunc
	done    chan struct{}
}

// New checks cfg and returns a bridge. Call Recover (Run does) before the
// first operation after a restart.
func New(cfg Config) (*Bridge, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	src, _ := events.NewMember(events.KindBridge, cfg.Name)
	b := &Bridge{cfg: cfg, source: src, instance: nuid.Next(),
		log: cfg.Logger.With().Str("run", cfg.Run).Str("member", string(src)).Logger()}
	b.bgCtx, b.bgCancel = context.WithCancel(context.Background())
	return b, nil
}

// Run recovers whatever the last bridge left open, then blocks until ctx
// ends, when it abandons a held checkpoint by resuming the fleet and stops
// its background watchers.
func (b *Bridge) Run(ctx context.Context) error {
	defer func() {
		b.bgCancel()
		b.bg.Wait()
	}()
	if err := b.Recover(ctx); err != nil && ctx.Err() == nil {
		return err
	}
	<-ctx.Done()
	b.mu.Lock()
	defer b.mu.Unlock()
	if h := b.held; h != nil {
		b.stopRenew()
		cctx, cancel := context.WithTimeout(context.Background(), b.cfg.ResumeTimeout+5*time.Second)
		defer cancel()
		st, err := b.state(cctx)
		if err == nil {
			_, err = b.abort(cctx, &st, h.prepare.PhaseHeader, events.PhasePrepare, &bridgeapi.Failure{Phase: events.PhasePrepare,
				Reason: "the bridge stopped while the checkpoint was held"}, h.started, h.prepMS)
		}
		if err != nil {
			b.log.Error().Err(err).Str("checkpoint", h.id).Msg("abandoning the held checkpoint")
		}
	}
	return nil
}

// runState is what the stream says about the run: its last phase event.
type runState struct {
	seq       uint64 // protocol sequence of the last phase event
	streamSeq uint64 // its stream sequence, the fence of the next publish
	epoch     uint64
	last      events.PhaseEvent // nil before the first phase
	lastID    string            // its ce-id
	lastAt    time.Time
}

// state reads the run's last phase event back from the stream; when the
// stream no longer holds it (aged out), the head record keeps the run's
// sequence and epoch going.
func (b *Bridge) state(ctx context.Context) (runState, error) {
	st, err := b.lastPhaseEvent(ctx)
	if err != nil {
		return st, err
	}
	e, err := b.cfg.Bus.Manifests.Get(ctx, events.HeadKey(b.cfg.Run))
	switch {
	case errors.Is(err, natsjs.ErrKeyNotFound):
	case err != nil:
		return st, fmt.Errorf("bridge: read the head of run %s: %w", b.cfg.Run, err)
	default:
		var h events.Head
		if err := json.Unmarshal(e.Value(), &h); err != nil {
			return st, fmt.Errorf("bridge: the head of run %s does not decode: %w", b.cfg.Run, err)
		}
		if h.Seq > st.seq {
			st.seq, st.epoch = h.Seq, max(st.epoch, h.Epoch)
			if st.last != nil {
				st.last, st.lastID = nil, "" // older than the head: not the run's last
			}
		}
	}
	return st, nil
}

// saveHead records the run's head after a phase publish; best effort (the
// stream holds the phase until it ages out).
func (b *Bridge) saveHead(ctx context.Context, h events.PhaseHeader) {
	v, _ := json.Marshal(events.Head{Seq: h.Seq, Epoch: h.Epoch, Updated: b.cfg.Now().UTC()})
	key := events.HeadKey(b.cfg.Run)
	// Compare-and-set, never backwards: a delayed write of another bridge
	// must not lower the head.
	for range 3 {
		e, err := b.cfg.Bus.Manifests.Get(ctx, key)
		switch {
		case errors.Is(err, natsjs.ErrKeyNotFound):
			_, err = b.cfg.Bus.Manifests.Create(ctx, key, v)
		case err == nil:
			var cur events.Head
			if json.Unmarshal(e.Value(), &cur) == nil && cur.Seq >= h.Seq {
				return
			}
			_, err = b.cfg.Bus.Manifests.Update(ctx, key, v, e.Revision())
		}
		if err == nil {
			return
		}
		b.log.Debug().Err(err).Uint64("seq", h.Seq).Msg("record the run's head; trying again")
	}
	b.log.Warn().Uint64("seq", h.Seq).Msg("could not record the run's head")
}

// lastPhaseEvent reads the run's last phase event back from the stream.
func (b *Bridge) lastPhaseEvent(ctx context.Context) (runState, error) {
	raw, err := b.cfg.Bus.Stream.GetLastMsgForSubject(ctx, events.PhaseFilter(b.cfg.Run))
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return runState{}, nil
	}
	if err != nil {
		return runState{}, fmt.Errorf("bridge: read the last phase of run %s: %w", b.cfg.Run, err)
	}
	e, d, err := events.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
	if err != nil {
		return runState{}, fmt.Errorf("bridge: the last phase of run %s (stream sequence %d) does not decode: %w", b.cfg.Run, raw.Sequence, err)
	}
	p, ok := d.(events.PhaseEvent)
	if !ok {
		return runState{}, fmt.Errorf("bridge: stream sequence %d on %s is a %s, not a phase", raw.Sequence, raw.Subject, d.Type())
	}
	h := p.Header()
	return runState{seq: h.Seq, streamSeq: raw.Sequence, epoch: h.Epoch, last: p, lastID: e.ID(), lastAt: raw.Time}, nil
}

// header builds the header of the next phase event.
func (b *Bridge) header(st *runState, id string, epoch uint64, members []events.Member, timeout time.Duration) events.PhaseHeader {
	return events.PhaseHeader{Run: b.cfg.Run, CheckpointID: id, Seq: st.seq + 1, Epoch: epoch,
		Deadline: b.cfg.Now().Add(timeout).UTC().Truncate(time.Millisecond), Members: members}
}

// publishPhase publishes p fenced on the run's last phase: if another
// bridge published in between, the server refuses it and bridgeapi.ErrFenced is
// returned. On success st describes p.
func (b *Bridge) publishPhase(ctx context.Context, st *runState, p events.PhaseEvent) error {
	h := p.Header()
	// The id is this process's own (its instance nonce), so that a second
	// bridge publishing the same sequence never looks like a duplicate of
	// ours to the server, and our own retry always does.
	id := b.cfg.Run + "." + strconv.FormatUint(h.Seq, 10) + "." + string(p.Phase()) + "." + h.CheckpointID + "." + b.instance
	msg, err := events.Marshal(b.source, p, events.WithID(id))
	if err != nil {
		return fmt.Errorf("bridge: build %s: %w", p.Phase(), err)
	}
	ack, err := b.cfg.JS.PublishMsg(ctx, msg, natsjs.WithExpectLastSequenceForSubject(st.streamSeq, events.PhaseFilter(b.cfg.Run)))
	if jetstream.IsWrongLastSequence(err) {
		// Our own earlier attempt may have landed: then the last phase is
		// ours, by its id.
		now, serr := b.state(ctx)
		if serr == nil && now.lastID == id {
			*st = now
			return nil
		}
		return fmt.Errorf("%w: publishing %s seq %d: %w", bridgeapi.ErrFenced, p.Phase(), h.Seq, err)
	}
	if err != nil {
		return fmt.Errorf("bridge: publish %s seq %d: %w", p.Phase(), h.Seq, err)
	}
	*st = runState{seq: h.Seq, streamSeq: ack.Sequence, epoch: h.Epoch, last: p, lastID: id, lastAt: b.cfg.Now()}
	b.saveHead(ctx, h)
	b.log.Debug().Str("phase", string(p.Phase())).Uint64("seq", h.Seq).Str("checkpoint", h.CheckpointID).
		Int("members", len(h.Members)).Msg("phase published")
	return nil
}

// publishOutcome publishes an outcome once: a deterministic id makes a
// repeat inside the duplicate window a no-op, and outcomeOf lets recovery
// check for it beyond.
func (b *Bridge) publishOutcome(ctx context.Context, o events.Data, opID string) error {
	msg, err := events.Marshal(b.source, o, events.WithID(b.cfg.Run+"."+opID+"."+o.Type().Noun()))
	if err != nil {
		return fmt.Errorf("bridge: build outcome: %w", err)
	}
	if _, err := jetstream.PublishDedup(ctx, b.cfg.JS, msg); err != nil {
		return fmt.Errorf("bridge: publish outcome %s: %w", o.Type().Noun(), err)
	}
	return nil
}

// outcomeOf returns the last outcome of type t if it belongs to opID.
func (b *Bridge) outcomeOf(ctx context.Context, t events.Type, opID string) (events.Data, error) {
	raw, err := b.cfg.Bus.Stream.GetLastMsgForSubject(ctx, events.OutcomeSubject(b.cfg.Run, t))
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("bridge: read outcome %s: %w", t.Noun(), err)
	}
	e, d, err := events.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
	if err != nil {
		return nil, fmt.Errorf("bridge: outcome at stream sequence %d: %w", raw.Sequence, err)
	}
	if e.Subject() != opID {
		return nil, nil
	}
	return d, nil
}

// liveMembers reads the run's heartbeats. fresh selects members that have
// served no phase; otherwise it returns the members of epoch, plus fresh
// ones (a member that joined since the last phase serves the next).
func (b *Bridge) liveMembers(ctx context.Context, epoch uint64, fresh bool) ([]events.Member, []events.MemberInfo, error) {
	values, err := snapshot(ctx, b.cfg.Bus.Members, events.MemberKeyFilter(b.cfg.Run))
	if err != nil {
		return nil, nil, fmt.Errorf("bridge: read members: %w", err)
	}
	var (
		members []events.Member
		infos   []events.MemberInfo
	)
	for k, v := range values {
		var info events.MemberInfo
		if err := json.Unmarshal(v, &info); err != nil || info.Validate() != nil || info.Run != b.cfg.Run ||
			events.MemberKey(b.cfg.Run, info.Member) != k {
			b.log.Warn().Str("key", k).Msg("ignoring a member heartbeat that does not decode or names another key")
			continue
		}
		if info.Member.Kind() == events.KindBridge {
			continue
		}
		infos = append(infos, info)
		switch {
		case fresh && !info.Served:
		case !fresh && (!info.Served || info.Epoch == epoch):
		default:
			continue
		}
		members = append(members, info.Member)
	}
	sort.Slice(members, func(i, j int) bool { return members[i] < members[j] })
	sort.Slice(infos, func(i, j int) bool { return infos[i].Member < infos[j].Member })
	return members, infos, nil
}

// snapshot reads the current values of a bucket's keys under filter in one
// pass (a watcher's initial values), rather than one request per key.
func snapshot(ctx context.Context, kv natsjs.KeyValue, filter string) (map[string][]byte, error) {
	w, err := kv.Watch(ctx, filter, natsjs.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	out := map[string][]byte{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("watcher closed")
			}
			if e == nil {
				return out, nil
			}
			out[e.Key()] = e.Value()
		}
	}
}

// gather reads the acks of phase event p until the tally decides, the
// deadline (plus a little slack for clocks) passes, or ctx ends. A member
// whose heartbeat expires or is deleted fails the phase at once.
func (b *Bridge) gather(ctx context.Context, p events.PhaseEvent) (*machine.Tally, machine.Verdict, error) {
	return b.collect(ctx, p, true)
}

// collect is gather; without live it does not watch heartbeats, so a dead
// member is only reported when the deadline passes, among those that did
// not answer, and no sandbox daemon is excused (the resume check, which
// only logs, spares the bridge reading every heartbeat once more).
func (b *Bridge) collect(ctx context.Context, p events.PhaseEvent, live bool) (*machine.Tally, machine.Verdict, error) {
	h := p.Header()
	slack := min(time.Second, h.Deadline.Sub(b.cfg.Now())/10)
	if slack < 0 {
		slack = 0
	}
	hh := h
	hh.Deadline = h.Deadline.Add(slack)
	t := machine.NewTally(p.Phase(), hh)
	// A restore waits for every answer even after a failure: all or none
	// needs to know what each member installed before retiring. Retire,
	// forget and release have nothing to abort: their result says what
	// every member did (a release, what each one deleted).
	switch p.Phase() {
	case events.PhaseRestore, events.PhaseRetire, events.PhaseForget, events.PhaseRelease:
		t.WaitAll = true
	}
	if len(h.Members) == 0 {
		return t, t.Decide(b.cfg.Now()), nil
	}
	gctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// Acks already in the stream count whatever the time: a bridge that
	// recovers after the deadline reads what the members said. The
	// deadline applies only once those are read.
	var backlog uint64
	if last, err := b.cfg.Bus.Stream.GetLastMsgForSubject(gctx, events.AckFilter(b.cfg.Run, h.Seq)); err == nil {
		backlog = last.Sequence
	} else if !errors.Is(err, natsjs.ErrMsgNotFound) {
		return nil, machine.Failed, fmt.Errorf("bridge: acks of seq %d: %w", h.Seq, err)
	}
	type ackMsg struct {
		msg *nats.Msg
		seq uint64
	}
	acks := make(chan ackMsg, 256)
	cons, err := b.cfg.JS.OrderedConsumer(gctx, jetstream.StreamName, natsjs.OrderedConsumerConfig{
		FilterSubjects: []string{events.AckFilter(b.cfg.Run, h.Seq)}, DeliverPolicy: natsjs.DeliverAllPolicy})
	if err != nil {
		return nil, machine.Failed, fmt.Errorf("bridge: ack consumer for seq %d: %w", h.Seq, err)
	}
	cc, err := cons.Consume(func(m natsjs.Msg) {
		var seq uint64
		if md, err := m.Metadata(); err == nil {
			seq = md.Sequence.Stream
		}
		select {
		case acks <- ackMsg{&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}, seq}:
		case <-gctx.Done():
		}
	})
	if err != nil {
		return nil, machine.Failed, fmt.Errorf("bridge: consume acks of seq %d: %w", h.Seq, err)
	}
	defer cc.Stop()

	// The watcher's initial values say who is alive now (a member may have
	// died between the member listing and the publish); its updates, who
	// dies while the phase runs.
	var updates <-chan natsjs.KeyValueEntry // nil without live: never ready
	if live {
		watcher, err := b.cfg.Bus.Members.Watch(gctx, events.MemberKeyFilter(b.cfg.Run))
		if err != nil {
			return nil, machine.Failed, fmt.Errorf("bridge: watch members: %w", err)
		}
		defer watcher.Stop()
		updates = watcher.Updates()
	}
	memberOf := map[string]events.Member{}
	for _, m := range h.Members {
		memberOf[events.MemberKey(b.cfg.Run, m)] = m
	}
	alive, initial := map[string]bool{}, true
	instance := map[string]string{}

	timer := time.NewTimer(time.Until(hh.Deadline))
	defer timer.Stop()
	for {
		now := b.cfg.Now()
		if backlog > 0 && !now.Before(hh.Deadline) {
			now = hh.Deadline.Add(-time.Nanosecond) // the backlog is not read yet
		}
		if v := t.Decide(now); v != machine.Waiting {
			return t, v, nil
		}
		select {
		case <-ctx.Done():
			return t, machine.Failed, ctx.Err()
		case <-timer.C:
			if backlog > 0 {
				timer.Reset(50 * time.Millisecond)
			}
		case am := <-acks:
			if am.seq >= backlog {
				backlog = 0
			}
			m := am.msg
			_, d, err := events.Unmarshal(m)
			if err != nil {
				b.log.Warn().Err(err).Str("subject", m.Subject).Msg("refusing an ack")
				continue
			}
			ack, ok := d.(events.Ack)
			if !ok {
				b.log.Warn().Str("subject", m.Subject).Str("type", string(d.Type())).Msg("refusing a non-ack on an ack subject")
				continue
			}
			if !t.Add(ack) {
				ah := ack.Header()
				b.log.Warn().Str("member", string(ah.Member)).Uint64("epoch", ah.Epoch).Uint64("want_epoch", h.Epoch).
					Str("checkpoint", ah.CheckpointID).Msg("ignoring an ack that does not answer this phase (stale epoch or foreign)")
			}
		case e := <-updates:
			switch {
			case e == nil && initial:
				initial = false
				for k, m := range memberOf {
					if alive[k] {
						continue
					}
					// A key written while the watcher loaded can come after
					// its marker: ask for the few not seen.
					if _, err := b.cfg.Bus.Members.Get(gctx, k); errors.Is(err, natsjs.ErrKeyNotFound) {
						b.dead(t, m, p.Phase(), "member not alive at the phase's start")
					}
				}
				continue
			case e == nil:
				continue
			case e.Operation() == natsjs.KeyValuePut:
				var info events.MemberInfo
				_ = json.Unmarshal(e.Value(), &info)
				m, tracked := memberOf[e.Key()]
				if was, seen := instance[e.Key()]; tracked && seen && !initial && was != info.Instance {
					// Another process took the name: the one asked is gone.
					b.dead(t, m, p.Phase(), "member replaced by a new process during a phase")
				}
				alive[e.Key()], instance[e.Key()] = true, info.Instance
				continue
			}
			if initial {
				continue
			}
			if m, ok := memberOf[e.Key()]; ok {
				b.dead(t, m, p.Phase(), "member died or left during a phase")
			}
		}
	}
}

// dead tells the tally that m died, or excuses it where the phase allows.
func (b *Bridge) dead(t *machine.Tally, m events.Member, p events.Phase, why string) {
	if t.Excusable(m) {
		b.log.Info().Str("member", string(m)).Str("phase", string(p)).Msg(why + "; a sandbox daemon holds nothing this phase acts on: left out")
		t.Excuse(m)
		return
	}
	b.log.Warn().Str("dead", string(m)).Str("phase", string(p)).Msg(why)
	t.Dead(m)
}

// resume publishes a resume of id and returns: resume acks are not
// waited for (a member that misses the resume reopens when its lease runs
// out), but a background watcher owned by the bridge logs every member
// that does not ack it within ResumeTimeout.
func (b *Bridge) resume(ctx context.Context, st *runState, id string, members []events.Member, aborted bool) error {
	r := events.Resume{PhaseHeader: b.header(st, id, st.epoch, members, b.cfg.ResumeTimeout), Aborted: aborted}
	if err := b.publishPhase(ctx, st, r); err != nil {
		return err
	}
	b.bg.Go(func() {
		t, v, err := b.collect(b.bgCtx, r, false)
		if err != nil || v == machine.Complete {
			return
		}
		errs, _, _ := t.Failure(b.cfg.Now())
		missing := make([]string, 0, len(errs))
		for _, e := range errs {
			missing = append(missing, string(e.Member))
		}
		b.log.Warn().Str("checkpoint", id).Strs("not_resumed", missing).
			Msg("members did not ack the resume in time; their leases will reopen them")
	})
	return nil
}

// phaseTimeout returns the deadline length a request asks for.
func (b *Bridge) phaseTimeout(ms int64) time.Duration {
	if ms > 0 {
		return time.Duration(ms) * time.Millisecond
	}
	return b.cfg.PhaseTimeout
}

// manifest reads the checkpoint key of id; nil if absent.
func (b *Bridge) manifest(ctx context.Context, id string) (*events.CheckpointManifest, uint64, error) {
	e, err := b.cfg.Bus.Manifests.Get(ctx, events.ManifestKey(b.cfg.Run, id))
	if errors.Is(err, natsjs.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("bridge: read manifest %s: %w", id, err)
	}
	var m events.CheckpointManifest
	if err := json.Unmarshal(e.Value(), &m); err != nil {
		return nil, 0, fmt.Errorf("bridge: manifest %s does not decode: %w", id, err)
	}
	if err := m.Validate(); err != nil {
		return nil, 0, fmt.Errorf("bridge: manifest %s: %w", id, err)
	}
	return &m, e.Revision(), nil
}

// createManifest creates the checkpoint key once. If the key exists it
// returns what is there and created=false.
func (b *Bridge) createManifest(ctx context.Context, m events.CheckpointManifest) (have *events.CheckpointManifest, created bool, err error) {
	v, err := json.Marshal(m)
	if err != nil {
		return nil, false, err
	}
	_, err = b.cfg.Bus.Manifests.Create(ctx, events.ManifestKey(b.cfg.Run, m.CheckpointID), v)
	if errors.Is(err, natsjs.ErrKeyExists) {
		have, _, err := b.manifest(ctx, m.CheckpointID)
		if err != nil {
			return nil, false, err
		}
		if have == nil {
			return nil, false, fmt.Errorf("bridge: manifest %s exists and vanished", m.CheckpointID)
		}
		return have, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("bridge: create manifest %s: %w", m.CheckpointID, err)
	}
	return &m, true, nil
}
