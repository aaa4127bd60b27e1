package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/live"
)

// memberView is the bridge's one live view of its run's heartbeats: the
// agents' and owners' (sp_members) and the sandbox daemons' (sp_daemons):
// who is alive, and as which process instance. One ordered consumer of each
// bucket's stream keeps it for the bridge's life, and an operation that
// needs it first waits until it has read both buckets as far as they were
// when asked (sync), so that it is as fresh as a read of every key would be,
// without reading every key per operation or a watch per phase (a watch
// stopped with an update in flight leaves nats.go's sender blocked).
//
// A key that expires leaves no marker in either bucket (markers need
// roll-ups, with which a member's own key could purge every other): the
// view takes a member whose last heartbeat the server stored its bucket's
// TTL ago for gone when it lists or starts a watch, and a phase's watch,
// looked at every second while the phase runs (expire, from the driver's
// probe timer), tells of one whose heartbeat expires then; the probe finds
// a sandbox daemon that dies sooner (PROTOCOL §3, Liveness).
type memberView struct {
	mu      sync.Mutex
	cond    *sync.Cond // broadcast when a bucket's seq moves or the view fails
	started bool
	// gen counts the views started: a message of a stopped view's
	// consumer still in flight, or a sync begun on it, finds another.
	gen   uint64
	ccs   []natsjs.ConsumeContext
	seq   map[string]uint64 // by bucket: its stream sequence read up to
	alive map[string]events.MemberInfo
	rev   map[string]uint64        // the stream sequence of each live key's heartbeat
	at    map[string]time.Time     // when the server stored each live key's heartbeat
	ttl   map[string]time.Duration // by bucket: a heartbeat's life there (jetstream.HeartbeatTTL)
	// silent are the keys a probe found gone, at the heartbeat they had
	// then: left out of every listing until they heartbeat again, rather
	// than asked again at every phase while their heartbeat lives.
	silent  map[string]uint64
	watches map[*memberWatch]struct{}
	err     error // the view cannot read a bucket
	synced  bool  // a sync has completed: every heartbeat there was is read
}

// memberWatch tells a phase gathered which of its members die, leave or
// are replaced while it runs.
type memberWatch struct {
	run      string
	memberOf map[string]events.Member // key -> member, of the phase's members
	told     map[events.Member]bool   // members said gone
	gone     chan machine.Input       // MemberGone, buffered for every member
	view     *memberView

	// probed is the last member the watch's probe asked, where the next
	// round goes on from; unanswered, the silence of each member asked
	// whose requests found no responder (probe).
	probed     events.Member
	unanswered map[events.Member]live.Silence
}

// heartbeatBuckets are the buckets of the view: the agents' and owners',
// and the sandbox daemons'.
var heartbeatBuckets = []string{jetstream.BucketMembers, jetstream.BucketDaemons}

// view returns the started view of the run's heartbeats.
func (b *Bridge) view(ctx context.Context) (*memberView, error) {
	v := &b.members
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cond == nil {
		v.cond = sync.NewCond(&v.mu)
	}
	if v.started {
		return v, v.err
	}
	ttl := map[string]time.Duration{}
	for _, kv := range []natsjs.KeyValue{b.cfg.Bus.Members, b.cfg.Bus.Daemons} {
		st, err := kv.Status(ctx)
		if err != nil {
			return nil, fmt.Errorf("bridge: watch the members of %s: %w", kv.Bucket(), err)
		}
		ttl[kv.Bucket()] = jetstream.HeartbeatTTL(st)
	}
	gen := v.gen + 1
	var ccs []natsjs.ConsumeContext
	stop := func() {
		for _, cc := range ccs {
			cc.Stop()
		}
	}
	for _, bucket := range heartbeatBuckets {
		cons, err := b.cfg.JS.OrderedConsumer(ctx, "KV_"+bucket, natsjs.OrderedConsumerConfig{
			FilterSubjects: []string{"$KV." + bucket + "." + events.MemberKeyFilter(b.cfg.Run)},
			DeliverPolicy:  natsjs.DeliverLastPerSubjectPolicy,
		})
		if err != nil {
			stop()
			return nil, fmt.Errorf("bridge: watch the members of %s: %w", bucket, err)
		}
		cc, err := cons.Consume(func(msg natsjs.Msg) { b.heardHeartbeat(gen, bucket, msg) }, natsjs.ConsumeErrHandler(func(_ natsjs.ConsumeContext, err error) {
			b.log.Debug().Err(err).Str("bucket", bucket).Msg("the members' watch")
		}))
		if err != nil {
			stop()
			return nil, fmt.Errorf("bridge: watch the members of %s: %w", bucket, err)
		}
		ccs = append(ccs, cc)
	}
	v.started, v.gen, v.ccs, v.alive, v.watches = true, gen, ccs, map[string]events.MemberInfo{}, map[*memberWatch]struct{}{}
	v.rev, v.at, v.silent, v.seq, v.ttl = map[string]uint64{}, map[string]time.Time{}, map[string]uint64{}, map[string]uint64{}, ttl
	return v, nil
}

// errViewStopped: the view stopped while a sync waited on it.
var errViewStopped = errors.New("bridge: the members' watch is stopped")

// stopView ends the view (Run is ending); a later use starts another.
func (b *Bridge) stopView() {
	v := &b.members
	v.mu.Lock()
	ccs := v.ccs
	if v.started {
		// Whoever waits in a sync wakes and fails.
		v.err = errViewStopped
		v.cond.Broadcast()
	}
	v.mu.Unlock()
	for _, cc := range ccs {
		cc.Stop()
	}
	v.mu.Lock()
	v.ccs, v.started, v.err, v.seq, v.synced, v.alive, v.watches = nil, false, nil, nil, false, nil, nil
	v.rev, v.at, v.ttl, v.silent = nil, nil, nil, nil
	v.mu.Unlock()
}

// heardHeartbeat takes one message of bucket, read by the consumer of view
// gen: a heartbeat put, or a key deleted or purged (or expired, in a store
// that still holds an earlier build's markers). A key is read
// from its kind's bucket only (jetstream.HeartbeatBucket): a sandbox
// daemon's key in sp_members is an earlier build's, and no one but a
// daemon (and its owner) writes sp_daemons.
func (b *Bridge) heardHeartbeat(gen uint64, bucket string, msg natsjs.Msg) {
	md, err := msg.Metadata()
	if err != nil {
		return
	}
	key := strings.TrimPrefix(msg.Subject(), "$KV."+bucket+".")
	kind, _, _ := strings.Cut(strings.TrimPrefix(key, b.cfg.Run+"."), ".")
	ours := jetstream.HeartbeatBucket(events.MemberKind(kind)) == bucket
	var info events.MemberInfo
	removed := jetstream.KVRemoved(msg.Headers())
	if !removed && ours {
		if err := json.Unmarshal(msg.Data(), &info); err != nil || info.Validate() != nil || info.Run != b.cfg.Run ||
			events.MemberKey(b.cfg.Run, info.Member) != key {
			b.log.Warn().Str("key", key).Msg("ignoring a member heartbeat that does not decode or names another key")
			removed = true
		}
	}
	v := &b.members
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.started || v.gen != gen {
		return // a message still in flight when its view stopped
	}
	v.seq[bucket] = max(v.seq[bucket], md.Sequence.Stream)
	v.cond.Broadcast()
	if !ours {
		return
	}
	was, had := v.alive[key]
	if removed {
		delete(v.alive, key)
		delete(v.rev, key)
		delete(v.at, key)
	} else {
		v.alive[key] = info
		v.rev[key] = md.Sequence.Stream
		v.at[key] = md.Timestamp
	}
	delete(v.silent, key) // it heartbeats again, or is gone for good
	for w := range v.watches {
		m, tracked := w.memberOf[key]
		switch {
		case !tracked:
		case removed && had:
			w.send(machine.MemberGone{Member: m, Why: machine.GoneLeft})
		case !removed && had && was.Instance != info.Instance:
			// Another process took the name: the one asked is gone.
			w.send(machine.MemberGone{Member: m, Why: machine.GoneReplaced})
		}
	}
}

// sync waits until the view has read each bucket as far as the run's last
// heartbeat message there when asked.
func (v *memberView) sync(ctx context.Context, b *Bridge) error {
	// Each bucket's last write of the run, from the stream's leader: a
	// replica behind it would let the view call itself synced short of a
	// heartbeat the leader holds. One request, not a stream info and a get.
	last := map[string]uint64{}
	for _, bucket := range heartbeatBuckets {
		msg, err := jetstream.LeaderLastMsg(ctx, b.cfg.Conn, "KV_"+bucket, "$KV."+bucket+"."+events.MemberKeyFilter(b.cfg.Run))
		switch {
		case errors.Is(err, natsjs.ErrMsgNotFound):
			// no heartbeat of the run there yet
		case err != nil:
			return fmt.Errorf("bridge: read the members: %w", err)
		default:
			last[bucket] = msg.Sequence
		}
	}
	stop := context.AfterFunc(ctx, func() {
		v.mu.Lock()
		defer v.mu.Unlock()
		v.cond.Broadcast()
	})
	defer stop()
	v.mu.Lock()
	defer v.mu.Unlock()
	gen := v.gen
	behind := func() bool {
		for bucket, seq := range last {
			if v.seq[bucket] < seq {
				return true
			}
		}
		return false
	}
	for v.err == nil && v.gen == gen && v.started && ctx.Err() == nil && behind() {
		v.cond.Wait()
	}
	if v.err != nil {
		return v.err
	}
	if v.gen != gen || !v.started {
		return errViewStopped
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	v.synced = true
	return nil
}

// loaded reports whether the view has read the bucket as far as it was at
// some sync.
func (v *memberView) loaded() bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.synced
}

// liveLocked tells whether key's heartbeat is alive at now: read, and
// stored less than its bucket's TTL ago. The view's lock is held.
func (v *memberView) liveLocked(key string, now time.Time) bool {
	if _, ok := v.alive[key]; !ok {
		return false
	}
	return !jetstream.HeartbeatExpired(v.at[key], v.ttl[keyBucket(key)], now)
}

// keyBucket returns the bucket of heartbeat key <run>.<kind>.<name>: its
// kind's (jetstream.HeartbeatBucket).
func keyBucket(key string) string {
	_, member, _ := strings.Cut(key, ".")
	kind, _, _ := strings.Cut(member, ".")
	return jetstream.HeartbeatBucket(events.MemberKind(kind))
}

// snapshot returns the heartbeats of the run's live members at now.
func (v *memberView) snapshot(now time.Time) []events.MemberInfo {
	v.mu.Lock()
	defer v.mu.Unlock()
	out := make([]events.MemberInfo, 0, len(v.alive))
	for key, info := range v.alive {
		if at, ok := v.silent[key]; ok && at == v.rev[key] || !v.liveLocked(key, now) {
			continue
		}
		out = append(out, info)
	}
	return out
}

// watch starts telling which of members are gone: at once those not alive
// at now, then each that dies, leaves or is replaced. The caller syncs
// first.
func (v *memberView) watch(run string, members []events.Member, now time.Time) *memberWatch {
	w := &memberWatch{run: run, memberOf: map[string]events.Member{}, told: map[events.Member]bool{},
		gone: make(chan machine.Input, len(members)), view: v}
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, m := range members {
		k := events.MemberKey(run, m)
		w.memberOf[k] = m
		if !v.liveLocked(k, now) {
			w.send(machine.MemberGone{Member: m, Why: machine.GoneNotAlive})
		}
	}
	if v.watches != nil { // nil: the view stopped (Run ended), and tells nothing
		v.watches[w] = struct{}{}
	}
	return w
}

// expire tells of each of the watch's members whose heartbeat, alive when
// the watch started or since, has expired at now: a key expires without a
// marker (jetstream.HeartbeatExpired), so the watch is looked at while its
// phase runs (driving.probed, every probeEvery).
func (w *memberWatch) expire(now time.Time) {
	v := w.view
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, ok := v.watches[w]; !ok {
		return
	}
	for key, m := range w.memberOf {
		if !w.told[m] && !v.liveLocked(key, now) {
			w.send(machine.MemberGone{Member: m, Why: machine.GoneLeft})
		}
	}
}

// send queues g unless the watch has said its member is gone already: the
// channel has room for one input per member, so it never blocks. The
// view's lock is held.
func (w *memberWatch) send(g machine.MemberGone) {
	if w.told[g.Member] {
		return
	}
	w.told[g.Member] = true
	w.gone <- g
}

// tell says g, as the view does (once per member). A member found silent
// is left out of the view's listings until it heartbeats again.
func (w *memberWatch) tell(g machine.MemberGone) {
	v := w.view
	v.mu.Lock()
	defer v.mu.Unlock()
	if key := events.MemberKey(w.run, g.Member); g.Why == machine.GoneSilent && v.silent != nil {
		if at, ok := v.rev[key]; ok {
			v.silent[key] = at
		}
	}
	if _, ok := v.watches[w]; ok {
		w.send(g)
	}
}

// Probing a phase's silent sandbox daemons (PROTOCOL §3, Liveness): a
// daemon's heartbeat lives minutes (jetstream.DefaultSandboxTTL), so the
// bridge asks those it still waits for whether they are still there, once
// the phase is probeAfter old and no ack came for probeQuiet (while acks
// stream in, a fleet is answering, not dead), every probeEvery, at most
// probeBatch a round (the next round goes on from the last asked, so every
// silent daemon is asked in turn) and probeParallel at once. A daemon the
// silence rule finds gone (live.Silence: its connection closed, not
// reconnecting) is left out of the phase as a heartbeat that expired would
// have it. Each request names the phase (events.AliveQuery): a daemon that
// answered it on core NATS says its ack again, in case the bridge missed
// it, and answers with it, which answered is given.
const (
	probeAfter    = 3 * time.Second
	probeQuiet    = 2 * time.Second
	probeEvery    = time.Second
	probeBatch    = 512
	probeParallel = 16
	probeTimeout  = 2 * time.Second
)

// probe asks silent, or the probeBatch of them after the last it asked,
// whether they are there, and tells w of those the silence rule finds
// gone; each answer goes to answered (nil: none), on the probe's
// goroutines. It returns when every answer is in or ctx ends. The probes
// of one watch run one at a time (driving.probed).
func (b *Bridge) probe(ctx context.Context, w *memberWatch, silent []events.Member, q events.AliveQuery, answered func(events.Member, *nats.Msg)) {
	if len(silent) > probeBatch {
		from, _ := slices.BinarySearch(silent, w.probed)
		if from < len(silent) && silent[from] == w.probed {
			from++
		}
		silent = slices.Concat(silent[from:], silent[:from])[:probeBatch]
	}
	w.probed = silent[len(silent)-1]
	if w.unanswered == nil {
		w.unanswered = map[events.Member]live.Silence{}
	}
	prober := &live.Prober{Conn: b.cfg.JS.Conn(), Run: b.cfg.Run, Timeout: probeTimeout}
	sem := make(chan struct{}, probeParallel)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, m := range silent {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			wg.Wait()
			return
		}
		wg.Go(func() {
			defer func() { <-sem }()
			reply, err := prober.Ask(ctx, m, q)
			if err == nil && answered != nil {
				answered(m, reply)
			}
			mu.Lock()
			s := w.unanswered[m]
			gone := s.Heard(err, time.Now())
			switch {
			case gone || err == nil:
				delete(w.unanswered, m)
			case live.NoResponders(err):
				w.unanswered[m] = s
			}
			mu.Unlock()
			if gone {
				w.tell(machine.MemberGone{Member: m, Why: machine.GoneSilent})
			}
		})
	}
	wg.Wait()
}

// close ends the watch.
func (w *memberWatch) close() {
	if w == nil {
		return
	}
	w.view.mu.Lock()
	defer w.view.mu.Unlock()
	delete(w.view.watches, w)
}
