package jetstream

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
)

// Names of the objects that make up the bus (PROTOCOL.md §3).
const (
	// StreamName is the one stream that holds the whole conversation and is the audit log.
	StreamName = "STILLPOINT"
	// StreamSubjects is the subject filter of StreamName: every subject of the protocol.
	StreamSubjects = "sp.>"
	// BucketMembers is the KV bucket of agents' and owners' heartbeats, keyed <run>.<member>,
	// with a TTL.
	BucketMembers = "sp_members"
	// BucketDaemons is the KV bucket of sandbox daemons' heartbeats, keyed <run>.sandbox.<name>:
	// apart from BucketMembers, whose expiry markers need roll-ups, so that no write a sandbox's
	// credentials may make rolls up or purges another member's key (daemonsStreamConfig).
	BucketDaemons = "sp_daemons"
	// BucketManifests is the KV bucket of checkpoint and member manifests and the LATEST pointer.
	BucketManifests = "sp_manifests"
	// BucketSnapshots is the KV bucket of the owner's snapshot index.
	BucketSnapshots = "sp_snapshots"
	// BucketRecords is the object store of members' exported records.
	BucketRecords = "sp_records"
	// BucketCheckpoints is the bridge's object store of checkpoint member lists
	// (events.MemberListObject), which schema-2 checkpoint manifests name by digest.
	BucketCheckpoints = "sp_checkpoints"
	// BucketTrajectories is the object store of rollouts' trajectories (docs/TRAJECTORIES.md),
	// <run>/<rollout>.jsonl: results, which no release deletes.
	BucketTrajectories = "sp_trajectories"
)

// Defaults of Topology, applied to zero fields by WithDefaults.
const (
	// DefaultReplicas is the replica count of every stream and bucket: 1 for an embedded server.
	DefaultReplicas = 1
	// DefaultMaxAge is how long the stream keeps a message.
	DefaultMaxAge = 7 * 24 * time.Hour
	// DefaultDuplicates is the stream's Nats-Msg-Id duplicate window.
	DefaultDuplicates = 2 * time.Minute
	// DefaultMemberTTL is the TTL of an agent's or an owner's heartbeat in BucketMembers: a
	// member that stops heartbeating disappears after it.
	DefaultMemberTTL = 30 * time.Second
	// DefaultSandboxTTL is the TTL of a sandbox daemon's heartbeat: longer, since there are
	// thousands of them (10,000 daemons beating every 10 s were 1,000 replicated writes a
	// second, a third of a checkpoint's cost on a 3-node cluster), and the bridge finds a dead
	// daemon of a phase sooner by asking it (PROTOCOL §3, Liveness).
	DefaultSandboxTTL = 2 * time.Minute
	// DefaultManifestHistory is the number of revisions BucketManifests keeps per key, so that
	// the bucket's stream shows recent moves of <run>.LATEST (docs/POSTMORTEM.md).
	DefaultManifestHistory = 16
)

// maxReplicas is the largest replica count JetStream accepts.
const maxReplicas = 5

// ErrInvalidConfig is returned (wrapped, one error per field, joined) by Topology.Validate and
// ConnConfig.Validate when a field has a value that cannot be used.
var ErrInvalidConfig = errors.New("jetstream: invalid config")

// Topology is the shape of the bus: how many replicas every object has and how long things live.
// The zero value, after WithDefaults, is the single-node layout of PROTOCOL.md §3.
type Topology struct {
	// Replicas is the replica count of the stream and of every bucket (default 1; 3 on a cluster).
	Replicas int
	// MaxAge is how long the stream keeps a message (default 7 days).
	MaxAge time.Duration
	// Duplicates is the stream's duplicate window for Nats-Msg-Id (default 2 minutes).
	Duplicates time.Duration
	// MemberTTL is the TTL of an agent's or an owner's heartbeat in sp_members (default 30
	// seconds).
	MemberTTL time.Duration
	// SandboxTTL is the TTL of a sandbox daemon's heartbeat (default 2 minutes): the max age of
	// BucketDaemons. sp_members, an earlier build's home of those heartbeats too, keeps a key for
	// the longer of the two and names both (MemberTTLs).
	SandboxTTL time.Duration
	// ManifestHistory is the KV history of sp_manifests (default 16, at most 64).
	ManifestHistory int
}

// WithDefaults returns a copy of t with every zero field set to its default.
func (t Topology) WithDefaults() Topology {
	t.setDefaults()
	return t
}

func (t *Topology) setDefaults() {
	if t.Replicas == 0 {
		t.Replicas = DefaultReplicas
	}
	if t.MaxAge == 0 {
		t.MaxAge = DefaultMaxAge
	}
	if t.Duplicates == 0 {
		t.Duplicates = DefaultDuplicates
	}
	if t.MemberTTL == 0 {
		t.MemberTTL = DefaultMemberTTL
	}
	if t.SandboxTTL == 0 {
		t.SandboxTTL = DefaultSandboxTTL
	}
	if t.ManifestHistory == 0 {
		t.ManifestHistory = DefaultManifestHistory
	}
}

// Validate reports every field of t that JetStream would refuse, joined, each wrapping
// ErrInvalidConfig and naming the field. It does not apply defaults: call it on WithDefaults().
func (t Topology) Validate() error {
	var errs []error
	field := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: Topology."+format, append([]any{ErrInvalidConfig}, args...)...))
	}
	if t.Replicas < 1 || t.Replicas > maxReplicas {
		field("Replicas %d: must be between 1 and %d", t.Replicas, maxReplicas)
	}
	if t.MaxAge <= 0 {
		field("MaxAge %s: must be positive", t.MaxAge)
	}
	if t.Duplicates <= 0 {
		field("Duplicates %s: must be positive", t.Duplicates)
	} else if t.MaxAge > 0 && t.Duplicates > t.MaxAge {
		field("Duplicates %s: must not exceed MaxAge %s", t.Duplicates, t.MaxAge)
	}
	if t.MemberTTL < time.Second {
		field("MemberTTL %s: must be at least a second", t.MemberTTL)
	}
	if t.SandboxTTL < time.Second {
		field("SandboxTTL %s: must be at least a second", t.SandboxTTL)
	}
	if t.ManifestHistory < 1 || t.ManifestHistory > natsjs.KeyValueMaxHistory {
		field("ManifestHistory %d: must be between 1 and %d", t.ManifestHistory, natsjs.KeyValueMaxHistory)
	}
	return errors.Join(errs...)
}

// streamConfig is the configuration of StreamName.
func (t Topology) streamConfig() natsjs.StreamConfig {
	return natsjs.StreamConfig{
		Name:        StreamName,
		Description: "Stillpoint checkpoint protocol: phases, acks, outcomes, membership",
		Subjects:    []string{StreamSubjects},
		Retention:   natsjs.LimitsPolicy,
		Storage:     natsjs.FileStorage,
		Replicas:    t.Replicas,
		MaxAge:      t.MaxAge,
		Duplicates:  t.Duplicates,
		Discard:     natsjs.DiscardOld,
		AllowDirect: true,
	}
}

// phaseRepublish is how an earlier build's stream republished every phase
// it stored, on events.LivePhaseFilter's subjects: the bridge now publishes
// the live copies itself (PROTOCOL §3, live phases), and Provision takes
// this away from a stream that has it.
func phaseRepublish() *natsjs.RePublish {
	return &natsjs.RePublish{
		Source:      events.SubjectPrefix + ".*.phase.>",
		Destination: events.LivePrefix + ".{{wildcard(1)}}.phase.>",
	}
}

// keyValueConfigs are the configurations of the KV buckets, in a fixed order.
func (t Topology) keyValueConfigs() []natsjs.KeyValueConfig {
	return []natsjs.KeyValueConfig{
		{
			Bucket:      BucketMembers,
			Description: "Stillpoint members: <run>.<member> heartbeats",
			History:     1,
			// The longer TTL; each heartbeat carries its kind's own
			// (Nats-TTL), which the metadata names.
			TTL: max(t.MemberTTL, t.SandboxTTL),
			// An expired heartbeat leaves a marker, so that a watcher (the
			// bridge gathering acks) sees a dead member at once rather than
			// waiting out the phase deadline.
			LimitMarkerTTL: t.MemberTTL,
			Storage:        natsjs.FileStorage,
			Replicas:       t.Replicas,
			Metadata:       MemberTTLs{Member: t.MemberTTL, Sandbox: t.SandboxTTL}.metadata(),
		},
		{
			Bucket:      BucketManifests,
			Description: "Stillpoint manifests: <run>.<checkpoint>[.<member>], <run>.LATEST",
			History:     uint8(t.ManifestHistory),
			Storage:     natsjs.FileStorage,
			Replicas:    t.Replicas,
		},
		{
			Bucket:      BucketSnapshots,
			Description: "Stillpoint snapshot index: snapshot id -> checkpoints",
			History:     1,
			Storage:     natsjs.FileStorage,
			Replicas:    t.Replicas,
		},
	}
}

// daemonValueMax bounds a value of BucketDaemons: a heartbeat is a few hundred bytes.
const daemonValueMax = 64 << 10

// daemonsStreamConfig is the configuration of BucketDaemons' stream, made as a stream rather than
// through nats.go's KV create, which always allows roll-ups. A sandbox's credentials may write its
// own key there (docs/PERMISSIONS.md), and its workload can read them: so one message per key, no
// roll-up (a Nats-Rollup header is refused, where on sp_members one of "all" purged every key), no
// purge, no per-message TTL, and no subject delete markers, which nats-server allows only with
// roll-ups. A key lives SandboxTTL after its last write, the stream's max age, and goes without a
// marker: a watcher tells an expired heartbeat by the time the server stored it plus that TTL
// (DaemonTTL). A delete (KV-Operation DEL, the owner's when it stops a sandbox) still reads as
// gone. The duplicate window is short: heartbeats carry no message id, and a flood of ids would
// only grow the server's memory of them.
func (t Topology) daemonsStreamConfig() natsjs.StreamConfig {
	return natsjs.StreamConfig{
		Name:              "KV_" + BucketDaemons,
		Description:       "Stillpoint sandbox daemons: <run>.sandbox.<name> heartbeats",
		Subjects:          []string{"$KV." + BucketDaemons + ".>"},
		Retention:         natsjs.LimitsPolicy,
		MaxMsgsPerSubject: 1,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxConsumers:      -1,
		MaxAge:            t.SandboxTTL,
		MaxMsgSize:        daemonValueMax,
		Storage:           natsjs.FileStorage,
		Replicas:          t.Replicas,
		Discard:           natsjs.DiscardNew,
		Duplicates:        min(time.Second, t.SandboxTTL),
		AllowDirect:       true,
		DenyDelete:        true,
		DenyPurge:         true,
		AllowRollup:       false,
		Metadata:          map[string]string{metaSandboxTTL: t.SandboxTTL.String()},
	}
}

// HeartbeatBucket returns the KV bucket of the heartbeats of members of kind: BucketDaemons for
// a sandbox daemon, BucketMembers for the rest. Both are keyed <run>.<member> (events.MemberKey).
func HeartbeatBucket(kind events.MemberKind) string {
	if kind == events.KindSandbox {
		return BucketDaemons
	}
	return BucketMembers
}

// DaemonTTL returns how long a heartbeat of BucketDaemons lives after the server stored it, from
// the bucket's status: its max age. An expired key leaves no marker (daemonsStreamConfig), so a
// watcher takes a key older than this for gone.
func DaemonTTL(st natsjs.KeyValueStatus) time.Duration {
	if ttl := st.TTL(); ttl > 0 {
		return ttl
	}
	return DefaultSandboxTTL
}

// DaemonExpired tells whether a heartbeat of BucketDaemons that the server stored at stored has
// expired at now, given the bucket's ttl (DaemonTTL).
func DaemonExpired(stored time.Time, ttl time.Duration, now time.Time) bool {
	return !stored.IsZero() && !now.Before(stored.Add(ttl))
}

// objectStoreConfigs are the configurations of BucketRecords, BucketCheckpoints and
// BucketTrajectories.
func (t Topology) objectStoreConfigs() []natsjs.ObjectStoreConfig {
	return []natsjs.ObjectStoreConfig{
		{
			Bucket:      BucketRecords,
			Description: "Stillpoint records: <run>/<checkpoint>/<member>.jsonl",
			Storage:     natsjs.FileStorage,
			Replicas:    t.Replicas,
		},
		{
			Bucket:      BucketCheckpoints,
			Description: "Stillpoint member lists: <run>/<checkpoint>/members.<sha>.json",
			Storage:     natsjs.FileStorage,
			Replicas:    t.Replicas,
		},
		{
			Bucket:      BucketTrajectories,
			Description: "Stillpoint trajectories: <run>/<rollout>.jsonl",
			Storage:     natsjs.FileStorage,
			Replicas:    t.Replicas,
		},
	}
}

// RecordStores opens every object store whose bucket name starts with prefix (the members' own
// records stores of a run: events.RecordsBucketPrefix), sorted by name.
func RecordStores(ctx context.Context, js natsjs.JetStream, prefix string) ([]natsjs.ObjectStore, error) {
	names := js.StreamNames(ctx)
	var buckets []string
	for n := range names.Name() {
		if b, ok := strings.CutPrefix(n, "OBJ_"); ok && strings.HasPrefix(b, prefix) {
			buckets = append(buckets, b)
		}
	}
	if err := names.Err(); err != nil && !errors.Is(err, natsjs.ErrEndOfData) {
		return nil, fmt.Errorf("jetstream: list records stores: %w", err)
	}
	slices.Sort(buckets)
	var stores []natsjs.ObjectStore
	for _, b := range buckets {
		st, err := js.ObjectStore(ctx, b)
		if errors.Is(err, natsjs.ErrBucketNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("jetstream: records store %s: %w", b, err)
		}
		stores = append(stores, st)
	}
	return stores, nil
}

// The metadata keys of BucketMembers that name its heartbeats' TTLs (BucketDaemons names its own
// with metaSandboxTTL).
const (
	metaMemberTTL  = "stillpoint_member_ttl"
	metaSandboxTTL = "stillpoint_sandbox_ttl"
)

// MemberTTLs are the heartbeat TTLs of BucketMembers: an agent's or an
// owner's, and a sandbox daemon's. A member puts its heartbeat every third
// of its kind's, each put carrying it (Nats-TTL).
type MemberTTLs struct {
	Member, Sandbox time.Duration
}

// For returns the TTL of a member of kind.
func (m MemberTTLs) For(kind events.MemberKind) time.Duration {
	if kind == events.KindSandbox {
		return m.Sandbox
	}
	return m.Member
}

func (m MemberTTLs) metadata() map[string]string {
	return map[string]string{metaMemberTTL: m.Member.String(), metaSandboxTTL: m.Sandbox.String()}
}

// MemberTTLsOf reads the heartbeat TTLs of a members bucket from its
// status. ok is false for a bucket an earlier build made, which names none:
// every heartbeat then lives the bucket's TTL, and carries none of its own.
func MemberTTLsOf(st natsjs.KeyValueStatus) (ttls MemberTTLs, ok bool) {
	md := st.Metadata()
	m, err1 := time.ParseDuration(md[metaMemberTTL])
	s, err2 := time.ParseDuration(md[metaSandboxTTL])
	if err1 != nil || err2 != nil || m <= 0 || s <= 0 {
		return MemberTTLs{Member: st.TTL(), Sandbox: st.TTL()}, false
	}
	return MemberTTLs{Member: m, Sandbox: s}, true
}
