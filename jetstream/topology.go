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
	// BucketMembers is the KV bucket of agents' and owners' heartbeats, keyed <run>.<member>:
	// one message a key, living MemberTTL after its last write, and no roll-up or purge, so
	// that no member's write removes another's key (heartbeatsStreamConfig).
	BucketMembers = "sp_members"
	// BucketDaemons is the KV bucket of sandbox daemons' heartbeats, keyed <run>.sandbox.<name>:
	// the shape of BucketMembers with the longer SandboxTTL, apart from it so that a sandbox's
	// credentials write nothing where agents and owners beat.
	BucketDaemons = "sp_daemons"
	// BucketManifests is the KV bucket of checkpoint and member manifests and the LATEST pointer.
	BucketManifests = "sp_manifests"
	// BucketSnapshots is the KV bucket of the owners' snapshot index: one message a key and no
	// roll-up or purge (snapshotsStreamConfig), since a run's owners share it.
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
	// DefaultMemberTTL is the TTL of an agent's or an owner's heartbeat, the max age of
	// BucketMembers: a member that stops heartbeating is gone after it.
	DefaultMemberTTL = 30 * time.Second
	// DefaultSandboxTTL is the TTL of a sandbox daemon's heartbeat: longer, since there are
	// thousands of them and each beat is a replicated write, and the bridge finds a dead daemon
	// of a phase sooner by asking it (PROTOCOL §3, Liveness).
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
	// MemberTTL is the TTL of an agent's or an owner's heartbeat (default 30 seconds): the max
	// age of BucketMembers.
	MemberTTL time.Duration
	// SandboxTTL is the TTL of a sandbox daemon's heartbeat (default 2 minutes): the max age of
	// BucketDaemons.
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

// keyValueConfigs are the configurations of the KV buckets nats.go's KV create makes, in a fixed
// order: the manifests alone. The others are made as plain streams (plainKVStreamConfig).
func (t Topology) keyValueConfigs() []natsjs.KeyValueConfig {
	return []natsjs.KeyValueConfig{
		{
			Bucket:      BucketManifests,
			Description: "Stillpoint manifests: <run>.<checkpoint>[.<member>], <run>.LATEST",
			History:     uint8(t.ManifestHistory),
			Storage:     natsjs.FileStorage,
			Replicas:    t.Replicas,
		},
	}
}

// heartbeatValueMax bounds a value of BucketMembers and BucketDaemons: a heartbeat is a few
// hundred bytes.
const heartbeatValueMax = 64 << 10

// plainKVStreamConfig is the configuration of the stream of a KV bucket that is made as a stream
// rather than through nats.go's KV create, which always allows roll-ups: one message a key,
// living maxAge after its last write (0: for good), values of at most maxValue bytes (-1: the
// server's bound). No roll-up (a put with a Nats-Rollup header is refused, where one of "all" on
// any key purged every key), no purge, no delete of a message by the API, no per-message TTL and
// no subject delete markers, which nats-server allows only with roll-ups. A delete (a put with
// KV-Operation DEL, as kv.Delete writes) is a put like any other and reads as gone. The
// duplicate window is short: no write of these buckets carries a message id, and a flood of ids
// would only grow the server's memory of them.
func (t Topology) plainKVStreamConfig(bucket, description string, maxAge time.Duration, maxValue int32) natsjs.StreamConfig {
	dup := time.Second
	if maxAge > 0 {
		dup = min(dup, maxAge)
	}
	return natsjs.StreamConfig{
		Name:              "KV_" + bucket,
		Description:       description,
		Subjects:          []string{"$KV." + bucket + ".>"},
		Retention:         natsjs.LimitsPolicy,
		MaxMsgsPerSubject: 1,
		MaxMsgs:           -1,
		MaxBytes:          -1,
		MaxConsumers:      -1,
		MaxAge:            maxAge,
		MaxMsgSize:        maxValue,
		Storage:           natsjs.FileStorage,
		Replicas:          t.Replicas,
		Discard:           natsjs.DiscardNew,
		Duplicates:        dup,
		AllowDirect:       true,
		DenyDelete:        true,
		DenyPurge:         true,
		AllowRollup:       false,
	}
}

// heartbeatsStreamConfig is the configuration of a heartbeats bucket's stream (BucketMembers,
// BucketDaemons). Its writers are the members themselves: a member's credentials may write its
// own key (docs/PERMISSIONS.md), and a sandbox's workload can read its daemon's. So a plain KV
// stream (plainKVStreamConfig), where the worst a write does is to its writer's own key. A key
// lives ttl after its last write, the stream's max age, and goes without a marker: a watcher
// tells an expired heartbeat by the time the server stored it plus that TTL (HeartbeatTTL,
// HeartbeatExpired). A delete (the member's as it stops, the owner's when it stops a sandbox)
// still reads as gone at once.
func (t Topology) heartbeatsStreamConfig(bucket, description string, ttl time.Duration) natsjs.StreamConfig {
	return t.plainKVStreamConfig(bucket, description, ttl, heartbeatValueMax)
}

// membersStreamConfig is the configuration of BucketMembers' stream.
func (t Topology) membersStreamConfig() natsjs.StreamConfig {
	return t.heartbeatsStreamConfig(BucketMembers, "Stillpoint members: <run>.<member> heartbeats", t.MemberTTL)
}

// daemonsStreamConfig is the configuration of BucketDaemons' stream; its metadata names its TTL.
func (t Topology) daemonsStreamConfig() natsjs.StreamConfig {
	c := t.heartbeatsStreamConfig(BucketDaemons, "Stillpoint sandbox daemons: <run>.sandbox.<name> heartbeats", t.SandboxTTL)
	c.Metadata = map[string]string{metaSandboxTTL: t.SandboxTTL.String()}
	return c
}

// snapshotsStreamConfig is the configuration of BucketSnapshots' stream: a plain KV stream whose
// keys live for good. A run's owners share the index, and each owner's credentials may write any
// key of it: no roll-up or purge there lets one remove the others' entries all at once. The
// owners Put, Create, Update and Delete there, and never Purge.
func (t Topology) snapshotsStreamConfig() natsjs.StreamConfig {
	return t.plainKVStreamConfig(BucketSnapshots, "Stillpoint snapshot index: snapshot id -> checkpoints", 0, -1)
}

// HeartbeatBucket returns the KV bucket of the heartbeats of members of kind: BucketDaemons for
// a sandbox daemon, BucketMembers for the rest. Both are keyed <run>.<member> (events.MemberKey).
func HeartbeatBucket(kind events.MemberKind) string {
	if kind == events.KindSandbox {
		return BucketDaemons
	}
	return BucketMembers
}

// DefaultHeartbeatTTL returns the default TTL of a heartbeat of bucket (BucketDaemons or
// BucketMembers): what a member whose user may not read the bucket's info takes.
func DefaultHeartbeatTTL(bucket string) time.Duration {
	if bucket == BucketDaemons {
		return DefaultSandboxTTL
	}
	return DefaultMemberTTL
}

// HeartbeatTTL returns how long a heartbeat of a heartbeats bucket (BucketMembers,
// BucketDaemons) lives after the server stored it, from the bucket's status: its max age. An
// expired key leaves no marker (heartbeatsStreamConfig), so a watcher takes a key older than
// this for gone (HeartbeatExpired).
func HeartbeatTTL(st natsjs.KeyValueStatus) time.Duration {
	if ttl := st.TTL(); ttl > 0 {
		return ttl
	}
	return DefaultHeartbeatTTL(st.Bucket())
}

// HeartbeatExpired tells whether a heartbeat that the server stored at stored has expired at
// now, given its bucket's ttl (HeartbeatTTL).
func HeartbeatExpired(stored time.Time, ttl time.Duration, now time.Time) bool {
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
	return storesByPrefix(ctx, js, prefix, "records")
}

// TrajectoryStores opens the agents' own trajectories stores of run
// (events.TrajectoriesBucket: every object store whose bucket name starts with
// events.TrajectoriesBucketPrefix), sorted by name. The shared BucketTrajectories is not one.
func TrajectoryStores(ctx context.Context, js natsjs.JetStream, run string) ([]natsjs.ObjectStore, error) {
	return storesByPrefix(ctx, js, events.TrajectoriesBucketPrefix(run), "trajectories")
}

// storesByPrefix opens every object store whose bucket name starts with prefix, sorted by name;
// what names them in errors.
func storesByPrefix(ctx context.Context, js natsjs.JetStream, prefix, what string) ([]natsjs.ObjectStore, error) {
	names := js.StreamNames(ctx)
	var buckets []string
	for n := range names.Name() {
		if b, ok := strings.CutPrefix(n, "OBJ_"); ok && strings.HasPrefix(b, prefix) {
			buckets = append(buckets, b)
		}
	}
	if err := names.Err(); err != nil && !errors.Is(err, natsjs.ErrEndOfData) {
		return nil, fmt.Errorf("jetstream: list %s stores: %w", what, err)
	}
	slices.Sort(buckets)
	var stores []natsjs.ObjectStore
	for _, b := range buckets {
		st, err := js.ObjectStore(ctx, b)
		if errors.Is(err, natsjs.ErrBucketNotFound) {
			continue // deleted meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("jetstream: %s store %s: %w", what, b, err)
		}
		stores = append(stores, st)
	}
	return stores, nil
}

// The metadata keys that name heartbeat TTLs: BucketDaemons names its own with metaSandboxTTL.
// An earlier build's BucketMembers named both (its metadata, which Provision's upgrade drops:
// membersEarlier).
const (
	metaMemberTTL  = "stillpoint_member_ttl"
	metaSandboxTTL = "stillpoint_sandbox_ttl"
)
