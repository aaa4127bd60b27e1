package embedded

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nats-io/nkeys"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// Role is a kind of client of the bus. Each role has its own nkey and the permissions
// RolePermissions gives it, so that a process speaks on the bus only as what it is (PROTOCOL
// §2–§3), within the limits RolePermissions documents.
type Role string

// The roles. A member role (agent, owner, sandbox) is also the kind half of its member names.
const (
	// RoleBridge is the controller bridge: phases, outcomes, checkpoint manifests, LATEST,
	// release of manifests and records, and its service spsvc.<run>.bridge.<name>.
	RoleBridge Role = "bridge"
	// RoleAgent is an agent server: member agent.<name>, its service spsvc.<run>.agent.<name>.
	RoleAgent Role = "agent"
	// RoleOwner is a sandbox owner: member owner.<name>, its service, the snapshot index, and
	// the heartbeats of the sandbox daemons it stops.
	RoleOwner Role = "owner"
	// RoleSandbox is a sandbox daemon (sandboxd member), inside a sandbox: the least trusted.
	RoleSandbox Role = "sandbox"
	// RoleController is the controller's side: the CLI's reads of the bus (timeline), the
	// rollout requests a collector sends to agents, and calls of the bridge's service.
	RoleController Role = "controller"
	// RoleAdmin may do anything: the server's own provisioning, and the operator's `nats` CLI
	// (post-mortem, `nats stream edit`).
	RoleAdmin Role = "admin"
)

// Roles returns every role, in a fixed order.
func Roles() []Role {
	return []Role{RoleBridge, RoleAgent, RoleOwner, RoleSandbox, RoleController, RoleAdmin}
}

// SeedFile returns the path of role's nkey seed file in dir: dir/<role>.nk.
func SeedFile(dir string, role Role) string {
	return filepath.Join(dir, string(role)+".nk")
}

// RolePermissions returns what role may publish and subscribe to on the bus of run, or of
// every run when run is "". RoleAdmin gets nil: everything. Phases and outcomes are the bridge's
// alone, a member role acks (its commit ack records its manifest) and heartbeats only as its own kind
// and writes no manifest, and no role but
// admin changes a stream. docs/PERMISSIONS.md says, subject by subject, what is restricted and what
// is not: reading, consumers, replies and names within a role are open to every role, so the
// permissions guard against a confused component, not a hostile one.
func RolePermissions(role Role, run string) (*Permissions, error) {
	r := "*"
	if run != "" {
		if err := events.ValidateRun(run); err != nil {
			return nil, fmt.Errorf("%w: run: %w", ErrInvalidConfig, err)
		}
		r = run
	}
	sp := events.SubjectPrefix + "." + r + "."
	kv := func(bucket, key string) string { return "$KV." + bucket + "." + r + "." + key }
	records := []string{"$O." + jetstream.BucketRecords + ".>", "$JS.API.STREAM.PURGE.OBJ_" + jetstream.BucketRecords}
	member := func(kind events.MemberKind, pub, sub []string) *Permissions {
		return &Permissions{
			Publish: Subjects{Allow: append(append(common(), ownWrites(kind, r, "*")...), pub...)},
			// The committed outcomes a stop commit parks on, on a core subscription
			// (PROTOCOL §3, Consumers).
			Subscribe: Subjects{Allow: append(append([]string{"_INBOX.>", events.ServiceFilter(r, kind),
				events.OutcomeSubject(r, events.TypeCheckpointCommitted)}, discovery(kind)...), sub...)},
		}
	}
	switch role {
	case RoleBridge:
		// It releases records from the shared store and from the members' own
		// (events.RecordsBucket, one stream each, which no subject wildcard can name
		// apart from the others): it may purge any stream but the audit log and the
		// KV buckets.
		return &Permissions{
			Publish: Subjects{Allow: append(common(),
				sp+"phase.>",
				// The phases' live copies for the sandbox daemons (events.LiveCopy).
				events.LivePhaseFilter(r),
				sp+"roster.>",
				sp+"resumed.>",
				// Its records of the sandbox daemons' prepare acks (events.PrepareAcked),
				// and of their other acks, which it stores as it took them (a daemon
				// publishes nothing into the stream: events.LiveAck).
				sp+"prepared.>",
				sp+"ack.*.*."+string(events.KindSandbox)+".*",
				// It asks a phase's silent sandbox daemons whether they are there
				// (events.AliveSubject), and may call nothing else of theirs.
				events.ServicePrefix+"."+r+"."+string(events.KindSandbox)+".*.alive",
				sp+"outcome.>",
				kv(jetstream.BucketManifests, ">"),
				"$O.>",
				"$JS.API.STREAM.PURGE.*",
			), Deny: []string{
				"$JS.API.STREAM.PURGE." + jetstream.StreamName,
				"$JS.API.STREAM.PURGE.KV_" + jetstream.BucketMembers,
				"$JS.API.STREAM.PURGE.KV_" + jetstream.BucketDaemons,
				"$JS.API.STREAM.PURGE.KV_" + jetstream.BucketManifests,
				"$JS.API.STREAM.PURGE.KV_" + jetstream.BucketSnapshots,
			}},
			// Its micro service (the controller API, bridgeapi.ServiceSubject) and micro's
			// discovery subjects of that service alone.
			Subscribe: Subjects{Allow: []string{"_INBOX.>", events.ServiceFilter(r, events.KindBridge),
				events.ServicePrefix + "." + r + ".stores.*.*",
				events.LiveAckFilter(r, events.PhaseResume),
				// The sandbox daemons' acks of every phase, on core NATS too.
				events.LivePrefix + "." + r + ".ack.*.*." + string(events.KindSandbox) + ".*",
				"$SRV.*", "$SRV.*." + bridgeService, "$SRV.*." + bridgeService + ".*"}},
		}, nil
	case RoleAgent:
		// It also stores its rollouts' trajectories (jetstream.BucketTrajectories).
		return member(events.KindAgent, append([]string{
			events.ServiceFilter(r, events.KindOwner),
			events.ServiceFilter(r, events.KindSandbox),
			"$O." + jetstream.BucketTrajectories + ".>",
			"$JS.API.STREAM.PURGE.OBJ_" + jetstream.BucketTrajectories,
		}, records...), []string{events.LivePrefix + "." + r + ".ack.*." + string(events.PhasePrepare) + "." + string(events.KindSandbox) + ".*"}), nil
	case RoleOwner:
		return member(events.KindOwner, append([]string{
			kv(jetstream.BucketDaemons, string(events.KindSandbox)+".*"),
			"$KV." + jetstream.BucketSnapshots + ".>",
		}, records...), nil), nil
	case RoleSandbox:
		// Its core feed (member.Config.StateFile: feed.Core): the run's phases as the stream republishes them
		// (events.LivePhaseFilter) and its committed outcomes on a core subscription; it catches
		// up by the direct gets common allows.
		// It publishes nothing into the stream: its acks go on core NATS (events.LiveAck),
		// its heartbeat to sp_daemons (ownWrites).
		return member(events.KindSandbox, nil,
			[]string{events.LivePhaseFilter(r), events.OutcomeSubject(r, events.TypeCheckpointCommitted)}), nil
	case RoleController:
		return &Permissions{
			Publish:   Subjects{Allow: append(common(), events.ServiceFilter(r, events.KindAgent), events.ServiceFilter(r, events.KindBridge), "$SRV.>")},
			Subscribe: Subjects{Allow: []string{"_INBOX.>"}},
		}, nil
	case RoleAdmin:
		return nil, nil
	}
	return nil, fmt.Errorf("%w: role %q: want one of %v", ErrInvalidConfig, role, Roles())
}

// bridgeService is the bridge's micro service name (bridgeapi.ServiceName, which this package
// does not import).
const bridgeService = "stillpoint-bridge"

// common is what every role but admin publishes to: the JetStream API calls of reading the bus
// and consuming from it, consumer acks and flow control, and replies.
func common() []string {
	return []string{
		"$JS.API.INFO",
		"$JS.API.STREAM.NAMES",
		"$JS.API.STREAM.LIST",
		"$JS.API.STREAM.INFO.*",
		"$JS.API.STREAM.MSG.GET.*",
		"$JS.API.DIRECT.GET.>",
		"$JS.API.CONSUMER.CREATE.>",
		"$JS.API.CONSUMER.DURABLE.CREATE.>",
		"$JS.API.CONSUMER.INFO.>",
		"$JS.API.CONSUMER.NAMES.>",
		"$JS.API.CONSUMER.LIST.>",
		"$JS.API.CONSUMER.MSG.NEXT.>",
		"$JS.API.CONSUMER.DELETE.>",
		"$JS.ACK.>",
		"$JS.FC.>",
		"_INBOX.>",
	}
}

// RoleUsers returns one User per role (named after it, with RolePermissions(role, run)) for
// the nkey seeds in dir, SeedFile(dir, role). A seed file that exists is used as it is; a
// missing one is created with a new user seed, mode 0600 (dir is created 0700 if need be). So a
// server restarted on the same dir admits the same clients.
func RoleUsers(dir, run string) ([]User, error) {
	if dir == "" {
		return nil, fmt.Errorf("%w: RoleUsers: dir required", ErrInvalidConfig)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedded: auth dir: %w", err)
	}
	var users []User
	for _, role := range Roles() {
		perms, err := RolePermissions(role, run)
		if err != nil {
			return nil, err
		}
		pub, err := loadOrCreateSeed(SeedFile(dir, role))
		if err != nil {
			return nil, err
		}
		users = append(users, User{Name: string(role), NKey: pub, Permissions: perms})
	}
	return users, nil
}

// loadOrCreateSeed returns the public key of the user seed in path, creating the file with a
// new seed if it does not exist.
func loadOrCreateSeed(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return createSeed(path)
	}
	if err != nil {
		return "", fmt.Errorf("embedded: seed file: %w", err)
	}
	defer clear(b)
	kp, err := nkeys.ParseDecoratedNKey(b)
	if err != nil {
		return "", fmt.Errorf("embedded: seed file %s: %w", path, err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil || !nkeys.IsValidPublicUserKey(pub) {
		return "", fmt.Errorf("embedded: seed file %s: not an nkey user seed", path)
	}
	return pub, nil
}

func createSeed(path string) (string, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", fmt.Errorf("embedded: new user nkey: %w", err)
	}
	defer kp.Wipe()
	seed, err := kp.Seed()
	if err != nil {
		return "", fmt.Errorf("embedded: new user nkey: %w", err)
	}
	if err := writeSeedOnce(path, seed); err != nil {
		return "", err
	}
	clear(seed)
	return loadOrCreateSeed(path) // another server on the same dir may have got there first
}

// writeSeedOnce writes seed to path, mode 0600, unless path exists: then the seed already there is
// kept. It is written aside, then linked into place, so that no one ever reads a half-written file.
func writeSeedOnce(path string, seed []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), ".seed-*") // mode 0600
	if err != nil {
		return fmt.Errorf("embedded: seed file: %w", err)
	}
	defer os.Remove(f.Name())
	line := append(bytes.Clone(seed), '\n')
	_, werr := f.Write(line)
	clear(line)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return fmt.Errorf("embedded: seed file %s: %w", path, werr)
	}
	if err := os.Link(f.Name(), path); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("embedded: seed file: %w", err)
	}
	return nil
}
