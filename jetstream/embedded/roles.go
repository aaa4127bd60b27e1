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
	// release of manifests and records.
	RoleBridge Role = "bridge"
	// RoleAgent is an agent server: member agent.<name>, its service spsvc.<run>.agent.<name>.
	RoleAgent Role = "agent"
	// RoleOwner is a sandbox owner: member owner.<name>, its service, the snapshot index, and
	// the heartbeats of the sandbox daemons it stops.
	RoleOwner Role = "owner"
	// RoleSandbox is a sandbox daemon (sandboxd member), inside a sandbox: the least trusted.
	RoleSandbox Role = "sandbox"
	// RoleController is the controller's side: the CLI's reads of the bus (timeline) and the
	// rollout requests a collector sends to agents.
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
// every run when run is "". RoleAdmin gets nil: everything.
//
// What is restricted, by subject (PROTOCOL §3):
//
//   - Phase events sp.<run>.phase.> and outcomes sp.<run>.outcome.>: the bridge only.
//   - Acks sp.<run>.ack.<seq>.<phase>.<kind>.<name> and membership sp.<run>.member.<kind>.<name>:
//     a member role only with its own kind (an agent acks only as agent.*).
//   - KV writes (put, create, update, delete and purge are publishes to $KV.<bucket>.<key>):
//     sp_members <run>.<kind>.* for a member role's own kind (and an owner's sandboxes, whose
//     heartbeats it deletes when it stops them); member manifests <run>.<checkpoint>.<kind>.*
//     likewise; checkpoint manifests and LATEST (any key of sp_manifests under the run) the
//     bridge only; sp_snapshots the owner only.
//   - The object store sp_records ($O.sp_records.> and purging its stream): the bridge, agents
//     and owners; not sandboxes, which export no records. Object names are not restricted per
//     member; a member's manifest carries its records' sha256 and count, and readers verify
//     both, so tampering shows as a failed restore rather than a wrong one.
//   - Services: a role serves (subscribes to) only spsvc.<run>.<its kind>.*.>, and calls only
//     those it uses: agents call owners and sandboxes, the controller calls agents.
//   - Core subscriptions to sp.<run>.>: none, but an agent's to its sandboxes' prepare acks
//     (sp.<run>.ack.*.prepare.sandbox.*). Everything else reads the stream through JetStream.
//   - The JetStream API: an allow list of what clients of the bus use (account info, stream
//     and consumer info and names, message get and direct get, consumer create, delete and
//     next). No role but admin may create, update, delete or purge a stream (but the records
//     store's purge above), delete a message, snapshot, restore, or touch the meta group: the
//     server provisions the bus, and no component can remove the audit log.
//
// What is not restricted, so not to be relied on against a hostile client of a role:
//
//   - Names within a role: every agent shares the agent role, so an agent can ack, heartbeat
//     or write a manifest as another agent, and a sandbox as another sandbox; and runs, when
//     run is "".
//   - Reading: every role reads every stream and bucket through the JetStream API.
//   - Consumers: every role creates and deletes consumers on any stream (KV watches and the
//     object store use push consumers, the member runtime pull and ordered ones), including
//     another member's durable consumer, and acks ($JS.ACK.>) any consumer's messages.
//     nats-server 2.15 does not check a push consumer's deliver subject against its creator's
//     publish permissions (only that it does not feed the consumer's own stream), so a client
//     can have the server deliver messages it stored where it may (its own acks, its own KV
//     keys, with any headers and body) onto any subject that has a subscriber: a service
//     endpoint, another client's inbox, the agents' subscription to sandbox prepare acks (and
//     from there into the stream), or any subject an admin subscribes to. Only separate NATS
//     accounts, with the stream in one and the API imported into the others, would close this.
//   - Replies: every role publishes to and subscribes to _INBOX.>, as request-reply,
//     JetStream and the micro services need, so a client can read or forge replies meant for
//     another.
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
		k := string(kind)
		return &Permissions{
			Publish: Subjects{Allow: append(append(common(),
				sp+"ack.*.*."+k+".*",
				sp+"member."+k+".*",
				kv(jetstream.BucketMembers, k+".*"),
				kv(jetstream.BucketManifests, "*."+k+".*"),
			), pub...)},
			Subscribe: Subjects{Allow: append([]string{"_INBOX.>", "$SRV.>", events.ServiceFilter(r, kind)}, sub...)},
		}
	}
	switch role {
	case RoleBridge:
		return &Permissions{
			Publish: Subjects{Allow: append(append(common(),
				sp+"phase.>",
				sp+"outcome.>",
				kv(jetstream.BucketManifests, ">"),
			), records...)},
			Subscribe: Subjects{Allow: []string{"_INBOX.>"}},
		}, nil
	case RoleAgent:
		return member(events.KindAgent, append([]string{
			events.ServiceFilter(r, events.KindOwner),
			events.ServiceFilter(r, events.KindSandbox),
		}, records...), []string{sp + "ack.*." + string(events.PhasePrepare) + "." + string(events.KindSandbox) + ".*"}), nil
	case RoleOwner:
		return member(events.KindOwner, append([]string{
			kv(jetstream.BucketMembers, string(events.KindSandbox)+".*"),
			"$KV." + jetstream.BucketSnapshots + ".>",
		}, records...), nil), nil
	case RoleSandbox:
		return member(events.KindSandbox, nil, nil), nil
	case RoleController:
		return &Permissions{
			Publish:   Subjects{Allow: append(common(), events.ServiceFilter(r, events.KindAgent), "$SRV.>")},
			Subscribe: Subjects{Allow: []string{"_INBOX.>"}},
		}, nil
	case RoleAdmin:
		return nil, nil
	}
	return nil, fmt.Errorf("%w: role %q: want one of %v", ErrInvalidConfig, role, Roles())
}

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
	pub, err := kp.PublicKey()
	if err != nil {
		return "", fmt.Errorf("embedded: new user nkey: %w", err)
	}
	// Written aside, then linked into place: the link fails if another server on the same dir
	// got there first (its seed is then used), and no one ever reads a half-written file.
	f, err := os.CreateTemp(filepath.Dir(path), ".seed-*") // mode 0600
	if err != nil {
		return "", fmt.Errorf("embedded: seed file: %w", err)
	}
	defer os.Remove(f.Name())
	line := append(bytes.Clone(seed), '\n')
	_, werr := f.Write(line)
	clear(line)
	clear(seed)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		return "", fmt.Errorf("embedded: seed file %s: %w", path, werr)
	}
	if err := os.Link(f.Name(), path); errors.Is(err, fs.ErrExist) {
		return loadOrCreateSeed(path)
	} else if err != nil {
		return "", fmt.Errorf("embedded: seed file: %w", err)
	}
	return pub, nil
}
