package jetstream

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
)

var (
	// ErrConfigConflict is returned (wrapped, one error per object, joined) by Provision when a
	// stream or bucket already exists with a configuration that differs from the Topology. The
	// message names the object and every field that differs, with both values.
	ErrConfigConflict = errors.New("jetstream: config conflict")

	// ErrNotProvisioned is returned (wrapped) by Open when the stream or a bucket does not exist.
	// The message lists everything that is missing.
	ErrNotProvisioned = errors.New("jetstream: not provisioned")
)

// Bus is a handle on every object of the bus layout (PROTOCOL.md §3). It holds no connection of
// its own: closing the nats.Conn behind the JetStream it came from ends it.
type Bus struct {
	// Stream is StreamName, the audit log of phases, acks, outcomes and membership.
	Stream natsjs.Stream
	// Members is BucketMembers: agents' and owners' heartbeats, each living the bucket's max
	// age after its last write (HeartbeatTTL).
	Members natsjs.KeyValue
	// Daemons is BucketDaemons: sandbox daemons' heartbeats, likewise.
	Daemons natsjs.KeyValue
	// Manifests is BucketManifests: created once, LATEST moved with compare-and-set.
	Manifests natsjs.KeyValue
	// Snapshots is BucketSnapshots: the owners' snapshot index.
	Snapshots natsjs.KeyValue
	// Records is BucketRecords: members' exported records, but those of a member with
	// credentials of its own, which it keeps in an object store of its own name
	// (events.RecordsBucket, opened through JS).
	Records natsjs.ObjectStore
	// Checkpoints is BucketCheckpoints: the bridge's member lists of schema-2 checkpoint
	// manifests.
	Checkpoints natsjs.ObjectStore
	// Trajectories is BucketTrajectories: the rollouts' trajectories, which agents write
	// and no release deletes.
	Trajectories natsjs.ObjectStore
	// JS is the JetStream context the bus was opened with: it opens the members' own
	// records stores and the agents' own trajectories stores (TrajectoryStore).
	JS natsjs.JetStream
}

// Heartbeats returns the bucket of the heartbeats of members of kind (HeartbeatBucket).
func (b *Bus) Heartbeats(kind events.MemberKind) natsjs.KeyValue {
	if kind == events.KindSandbox {
		return b.Daemons
	}
	return b.Members
}

// TrajectoryStore opens the trajectories store bucket names (agentapi.TrajectoryRef's Bucket):
// Trajectories, the shared BucketTrajectories, for "" (every trajectory an agent wrote before
// agents had stores of their own, and an agent's without credentials of its own), else an
// agent's own store (events.TrajectoriesBucket), through JS. Any other bucket is refused, so
// that a result names no store of another kind.
func (b *Bus) TrajectoryStore(ctx context.Context, bucket string) (natsjs.ObjectStore, error) {
	switch {
	case bucket == "" || bucket == BucketTrajectories:
		return b.Trajectories, nil
	case !strings.HasPrefix(bucket, BucketTrajectories+"_"):
		return nil, fmt.Errorf("jetstream: %.80q is no trajectories store", bucket)
	case b.JS == nil:
		return nil, fmt.Errorf("jetstream: trajectories store %s: the bus has no JetStream context to open it", bucket)
	}
	store, err := b.JS.ObjectStore(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("jetstream: trajectories store %s: %w", bucket, err)
	}
	return store, nil
}

// resource is one object of the bus as Provision sees it: a backing stream to look up, a
// comparison against what it should be, and a way to create it.
type resource struct {
	what   string // for messages: "stream STILLPOINT", "kv bucket sp_members", ...
	stream string // the backing stream's name
	diff   func(have natsjs.StreamConfig) []string
	create func(ctx context.Context, js natsjs.JetStream) error
	// upgrade, when set, adds to an existing object what an earlier build
	// did not configure and this one needs, changing nothing it holds.
	upgrade func(ctx context.Context, js natsjs.JetStream, have natsjs.StreamConfig) error
}

// Provision makes the bus of t exist and returns a handle on it. It creates what is missing and
// leaves alone what already exists with the same configuration, so running it any number of
// times, from any number of processes, changes nothing after the first. An existing object whose
// configuration differs from t is never updated: Provision returns ErrConfigConflict naming every
// difference and creates or changes nothing. The exceptions upgrade a store made by an earlier
// build in place, changing nothing it holds, once nothing conflicts: the stream's republish of
// its phases (events.LivePhaseFilter) goes, and BucketMembers and BucketSnapshots, which nats.go's
// KV create made with roll-ups allowed, get the shape of a plain KV stream (plainKVStreamConfig);
// an object that build did not make, such as BucketDaemons, is created as any missing one. Zero
// fields of t take their defaults; an invalid t returns ErrInvalidConfig.
func Provision(ctx context.Context, js natsjs.JetStream, t Topology) (*Bus, error) {
	if js == nil {
		return nil, errors.New("jetstream: provision: nil JetStream")
	}
	t = t.WithDefaults()
	if err := t.Validate(); err != nil {
		return nil, err
	}

	resources := t.resources()
	type existing struct {
		r    resource
		have natsjs.StreamConfig
	}
	var (
		missing   []resource
		upgrades  []existing
		conflicts []error
	)
	for _, r := range resources {
		have, err := lookupStreamConfig(ctx, js, r.stream)
		switch {
		case errors.Is(err, natsjs.ErrStreamNotFound):
			missing = append(missing, r)
		case err != nil:
			return nil, fmt.Errorf("jetstream: provision: look up %s: %w", r.what, err)
		default:
			if err := r.check(have); err != nil {
				conflicts = append(conflicts, err)
			} else if r.upgrade != nil {
				upgrades = append(upgrades, existing{r, have})
			}
		}
	}
	if len(conflicts) > 0 {
		return nil, errors.Join(conflicts...)
	}
	for _, u := range upgrades {
		if err := u.r.upgrade(ctx, js, u.have); err != nil {
			return nil, fmt.Errorf("jetstream: provision: upgrade %s: %w", u.r.what, err)
		}
	}

	for _, r := range missing {
		err := r.create(ctx, js)
		if errors.Is(err, natsjs.ErrStreamNameAlreadyInUse) || errors.Is(err, natsjs.ErrBucketExists) {
			// Another provisioner created it between our look-up and our create: accept what it
			// made if it is what we would have made.
			have, lerr := lookupStreamConfig(ctx, js, r.stream)
			if lerr != nil {
				return nil, fmt.Errorf("jetstream: provision: look up %s after create: %w", r.what, errors.Join(err, lerr))
			}
			err = r.check(have)
		}
		if err != nil {
			if errors.Is(err, ErrConfigConflict) {
				return nil, err
			}
			return nil, fmt.Errorf("jetstream: provision: create %s: %w", r.what, err)
		}
	}
	return Open(ctx, js)
}

// Open returns a handle on a bus that Provision has made, creating nothing. If anything is
// missing it returns ErrNotProvisioned naming all of it.
func Open(ctx context.Context, js natsjs.JetStream) (*Bus, error) {
	if js == nil {
		return nil, errors.New("jetstream: open: nil JetStream")
	}
	var (
		bus     = Bus{JS: js}
		missing []string
		err     error
	)
	bus.Stream, err = js.Stream(ctx, StreamName)
	switch {
	case errors.Is(err, natsjs.ErrStreamNotFound):
		missing = append(missing, "stream "+StreamName)
	case err != nil:
		return nil, fmt.Errorf("jetstream: open: stream %s: %w", StreamName, err)
	}
	for _, kv := range []struct {
		bucket string
		into   *natsjs.KeyValue
	}{
		{BucketMembers, &bus.Members},
		{BucketDaemons, &bus.Daemons},
		{BucketManifests, &bus.Manifests},
		{BucketSnapshots, &bus.Snapshots},
	} {
		*kv.into, err = js.KeyValue(ctx, kv.bucket)
		switch {
		case errors.Is(err, natsjs.ErrBucketNotFound):
			missing = append(missing, "kv bucket "+kv.bucket)
		case err != nil:
			return nil, fmt.Errorf("jetstream: open: kv bucket %s: %w", kv.bucket, err)
		}
	}
	for _, o := range []struct {
		bucket string
		into   *natsjs.ObjectStore
	}{
		{BucketRecords, &bus.Records},
		{BucketCheckpoints, &bus.Checkpoints},
		{BucketTrajectories, &bus.Trajectories},
	} {
		*o.into, err = js.ObjectStore(ctx, o.bucket)
		switch {
		case errors.Is(err, natsjs.ErrBucketNotFound):
			missing = append(missing, "object store "+o.bucket)
		case err != nil:
			return nil, fmt.Errorf("jetstream: open: object store %s: %w", o.bucket, err)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: missing %s (run Provision first)", ErrNotProvisioned, strings.Join(missing, ", "))
	}
	return &bus, nil
}

// resources lists the objects of t in the order Provision creates them.
func (t Topology) resources() []resource {
	scfg := t.streamConfig()
	rs := []resource{{
		what:   "stream " + scfg.Name,
		stream: scfg.Name,
		diff: func(have natsjs.StreamConfig) []string {
			var d diffs
			d.subjects(have.Subjects, scfg.Subjects)
			diffField(&d, "retention", have.Retention, scfg.Retention)
			diffField(&d, "storage", have.Storage, scfg.Storage)
			diffField(&d, "replicas", replicas(have.Replicas), scfg.Replicas)
			diffField(&d, "duplicates", have.Duplicates, scfg.Duplicates)
			diffField(&d, "max_age", have.MaxAge, scfg.MaxAge)
			if have.RePublish != nil && *have.RePublish != *phaseRepublish() {
				d = append(d, fmt.Sprintf("republish %+v, want none", *have.RePublish))
			}
			return d
		},
		create: func(ctx context.Context, js natsjs.JetStream) error {
			_, err := js.CreateStream(ctx, scfg)
			return err
		},
		// A stream an earlier build provisioned republishes its phases for the sandbox daemons'
		// core feed: the bridge publishes their live copies now (PROTOCOL §3), and a republish
		// beside them would deliver each phase twice, and every phase, to every daemon. It goes;
		// everything else stays, the messages included.
		upgrade: func(ctx context.Context, js natsjs.JetStream, have natsjs.StreamConfig) error {
			if have.RePublish == nil {
				return nil
			}
			have.RePublish = nil
			_, err := js.UpdateStream(ctx, have)
			return err
		},
	}}
	for _, kcfg := range t.keyValueConfigs() {
		rs = append(rs, resource{
			what:   fmt.Sprintf("kv bucket %s (stream KV_%s)", kcfg.Bucket, kcfg.Bucket),
			stream: "KV_" + kcfg.Bucket,
			diff: func(have natsjs.StreamConfig) []string {
				var d diffs
				diffField(&d, "history", have.MaxMsgsPerSubject, int64(kcfg.History))
				diffField(&d, "ttl", have.MaxAge, kcfg.TTL)
				diffField(&d, "replicas", replicas(have.Replicas), kcfg.Replicas)
				diffField(&d, "storage", have.Storage, kcfg.Storage)
				return d
			},
			create: func(ctx context.Context, js natsjs.JetStream) error {
				_, err := js.CreateKeyValue(ctx, kcfg)
				return err
			},
		})
	}
	rs = append(rs,
		plainKVResource(t.membersStreamConfig(), t.membersEarlier),
		plainKVResource(t.daemonsStreamConfig(), nil),
		plainKVResource(t.snapshotsStreamConfig(), func(natsjs.StreamConfig) []string { return nil }),
	)
	for _, ocfg := range t.objectStoreConfigs() {
		rs = append(rs, resource{
			what:   fmt.Sprintf("object store %s (stream OBJ_%s)", ocfg.Bucket, ocfg.Bucket),
			stream: "OBJ_" + ocfg.Bucket,
			diff: func(have natsjs.StreamConfig) []string {
				var d diffs
				diffField(&d, "replicas", replicas(have.Replicas), ocfg.Replicas)
				diffField(&d, "storage", have.Storage, ocfg.Storage)
				return d
			},
			create: func(ctx context.Context, js natsjs.JetStream) error {
				_, err := js.CreateObjectStore(ctx, ocfg)
				return err
			},
		})
	}
	return rs
}

// plainKVResource is the resource of a KV bucket made as a plain stream of configuration cfg
// (plainKVStreamConfig). earlier, when set, says that an earlier build made the bucket through
// nats.go's KV create, which allows roll-ups (and, for BucketMembers, subject delete markers and
// per-message TTLs), and that Provision upgrades such a bucket in place: it returns what of one
// conflicts beyond its subjects, history, replicas and storage, which the upgrade cannot mend.
// The upgrade sets every field of cfg the server lets an update set and keeps every message; the
// server refuses to disable per-message TTLs, so an upgraded bucket keeps allowing them (a put's
// own TTL then only shortens or lengthens its writer's own key, and a reader judges a heartbeat's
// expiry by its store time and the bucket's TTL anyway: HeartbeatExpired).
func plainKVResource(cfg natsjs.StreamConfig, earlier func(have natsjs.StreamConfig) []string) resource {
	bucket := strings.TrimPrefix(cfg.Name, "KV_")
	r := resource{
		what:   fmt.Sprintf("kv bucket %s (stream %s)", bucket, cfg.Name),
		stream: cfg.Name,
		diff: func(have natsjs.StreamConfig) []string {
			var d diffs
			d.subjects(have.Subjects, cfg.Subjects)
			diffField(&d, "history", have.MaxMsgsPerSubject, cfg.MaxMsgsPerSubject)
			diffField(&d, "replicas", replicas(have.Replicas), cfg.Replicas)
			diffField(&d, "storage", have.Storage, cfg.Storage)
			if have.AllowRollup && earlier != nil {
				return append(d, earlier(have)...) // the upgrade sets the rest
			}
			diffField(&d, "ttl", have.MaxAge, cfg.MaxAge)
			diffField(&d, "allow_rollup", have.AllowRollup, cfg.AllowRollup)
			diffField(&d, "deny_purge", have.DenyPurge, cfg.DenyPurge)
			if !have.AllowMsgTTL || earlier == nil {
				diffField(&d, "allow_msg_ttl", have.AllowMsgTTL, cfg.AllowMsgTTL)
			}
			diffField(&d, "subject_delete_marker_ttl", have.SubjectDeleteMarkerTTL, cfg.SubjectDeleteMarkerTTL)
			return d
		},
		create: func(ctx context.Context, js natsjs.JetStream) error {
			_, err := js.CreateStream(ctx, cfg)
			return err
		},
	}
	if earlier != nil {
		r.upgrade = func(ctx context.Context, js natsjs.JetStream, have natsjs.StreamConfig) error {
			if !have.AllowRollup {
				return nil // made by this build, or upgraded already
			}
			have.Description = cfg.Description
			have.AllowRollup, have.DenyPurge, have.DenyDelete = false, true, true
			have.SubjectDeleteMarkerTTL = 0
			have.MaxAge, have.MaxMsgSize, have.Duplicates = cfg.MaxAge, cfg.MaxMsgSize, cfg.Duplicates
			delete(have.Metadata, metaMemberTTL)
			delete(have.Metadata, metaSandboxTTL)
			if len(cfg.Metadata) > 0 {
				if have.Metadata == nil {
					have.Metadata = map[string]string{}
				}
				maps.Copy(have.Metadata, cfg.Metadata)
			}
			_, err := js.UpdateStream(ctx, have)
			return err
		}
	}
	return r
}

// membersEarlier is what of a BucketMembers an earlier build made conflicts with t: the member
// TTL its metadata names, if it names one, which must be t's. The TTL it kept a key for (the
// longer of an agent's and a sandbox daemon's, when that build kept both kinds of heartbeat
// there) and the names of both go with the upgrade.
func (t Topology) membersEarlier(have natsjs.StreamConfig) []string {
	var d diffs
	if v, ok := have.Metadata[metaMemberTTL]; ok {
		diffField(&d, metaMemberTTL, v, t.MemberTTL.String())
	}
	return d
}

// check returns ErrConfigConflict naming every difference between have and r, or nil.
func (r resource) check(have natsjs.StreamConfig) error {
	d := r.diff(have)
	if len(d) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s: %s", ErrConfigConflict, r.what, strings.Join(d, "; "))
}

// lookupStreamConfig returns the configuration of the named stream, or an error that matches
// natsjs.ErrStreamNotFound when there is none.
func lookupStreamConfig(ctx context.Context, js natsjs.JetStream, name string) (natsjs.StreamConfig, error) {
	s, err := js.Stream(ctx, name)
	if err != nil {
		return natsjs.StreamConfig{}, err
	}
	return s.CachedInfo().Config, nil
}

// diffs collects "<field> <have>, want <want>" descriptions.
type diffs []string

func diffField[T comparable](d *diffs, name string, have, want T) {
	if have != want {
		*d = append(*d, fmt.Sprintf("%s %v, want %v", name, have, want))
	}
}

func (d *diffs) subjects(have, want []string) {
	if !slices.Equal(have, want) {
		*d = append(*d, fmt.Sprintf("subjects %q, want %q", have, want))
	}
}

// replicas reads a stored replica count; the server treats 0 as 1.
func replicas(n int) int {
	return max(n, 1)
}
