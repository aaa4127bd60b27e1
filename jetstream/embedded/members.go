package embedded

import (
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
)

// nameTemplate is what a member's permissions name it by when a run's scoped signing key mints
// its user (MemberPermissions with it as name): nats-server fills it from the user JWT's name. The
// run is the account's own, written into the template.
const nameTemplate = "{{name()}}"

// MemberPermissions returns what member kind.name of run may do on the bus, and nothing of any
// other member or run: publish its own acks (a commit ack records its manifest), membership and
// heartbeat key (ownWrites: a sandbox's acks on core NATS and its key of sp_daemons only), serve
// its own service subject, read its own inbox (InboxPrefix), and the JetStream API calls of its
// feed. An agent or an owner reads its phases from its own durable consumer (member.ConsumerName)
// and no other: it creates it with the run's phases as its one filter and no other, and reads,
// acks and deletes that one only; it hears its run's committed outcomes on a core subscription
// and reads the newest by a direct get; it also watches its run's keys,
// writes its records to a store of its own (events.RecordsBucket) and reads that and the shared
// one, and calls the services it uses (an agent its owners' and sandboxes',
// and it hears its sandboxes' prepare acks). An agent also stores its trajectories in a store of
// its own (events.TrajectoriesBucket) and reads that and the shared one. A sandbox, the least trusted (its workload can read
// its credentials), hears its run's phases and committed outcomes on a core subscription, reads
// the newest of them by direct gets whose subjects name them, reads only its own key and acks (a
// sandbox exports and installs nothing, so a restore reads it no manifest: no checkpoint manifest
// or member list), and makes no consumer and reads no stream's or account's info (which lists
// every subject of the run). name may be the template a scoped signing key fills in.
func MemberPermissions(kind events.MemberKind, run, name string) *Permissions {
	k := string(kind)
	sp := events.SubjectPrefix + "." + run + "."
	self := k + "." + name
	kvPub := func(bucket, key string) string { return "$KV." + bucket + "." + run + "." + key }
	direct := func(stream, subject string) string { return "$JS.API.DIRECT.GET." + stream + "." + subject }
	kvGet := func(bucket, key string) string {
		return direct("KV_"+bucket, "$KV."+bucket+"."+run+"."+key)
	}
	pub := append(ownWrites(kind, run, name),
		direct(jetstream.StreamName, sp+"ack.*.*."+self),
		"_INBOX.>", // replies to whoever called
	)
	sub := append([]string{InboxPrefix(run, events.Member(self)) + ".>", events.ServiceSubject(run, events.Member(self)) + ".>"},
		discovery(kind)...)
	if kind == events.KindSandbox {
		// Its feed (member.Config.StateFile with NoPull: feed.Core): a core subscription of its run's phases
		// as the bridge publishes their live copies (events.LivePhaseFilter) and of its committed
		// outcomes; catch-up by direct gets of the newest of them, and of the newest phase of each
		// kind, whose subjects name the run (a next-by-subject get names its subject in the
		// request body, which no permission sees: it would read every run). No consumer: a
		// consumer create takes any name, and one on an existing name updates that consumer.
		committed := events.OutcomeSubject(run, events.TypeCheckpointCommitted)
		pub = append(pub,
			kvGet(jetstream.BucketDaemons, self),
			kvGet(jetstream.BucketManifests, "*."+self),
			direct(jetstream.StreamName, events.PhaseFilter(run)),
			direct(jetstream.StreamName, committed),
		)
		sub = append(sub, events.LivePhaseFilter(run), committed)
		return &Permissions{Publish: Subjects{Allow: pub}, Subscribe: Subjects{Allow: sub}}
	}
	// An agent's or an owner's own durable consumer of the run's phases. Its name is
	// member.ConsumerName's: sp_<run>_<kind>_<name> (MemberCreds refuses a run or name with an
	// underscore, which ConsumerName would double). Its create (and update) subject names both
	// its name and its one filter, within the run's phases, and the server refuses a body whose
	// name or filter is not the subject's: no other name, no other filter, so it reads nothing
	// else through it (member.DurableConfig). The committed outcomes a stop commit parks on come on a core
	// subscription, the newest by a direct get whose subject names them.
	durable := jetstream.StreamName + ".sp_" + run + "_" + k + "_" + name
	committed := events.OutcomeSubject(run, events.TypeCheckpointCommitted)
	pub = append(pub,
		"$JS.API.INFO",
		"$JS.API.STREAM.INFO.*",
		"$JS.API.CONSUMER.CREATE."+durable+"."+events.PhaseFilter(run),
		"$JS.API.CONSUMER.INFO."+durable,
		"$JS.API.CONSUMER.MSG.NEXT."+durable,
		"$JS.API.CONSUMER.DELETE."+durable,
		"$JS.ACK."+durable+".>",
		direct(jetstream.StreamName, committed),
		"$JS.API.STREAM.NAMES",
		kvGet(jetstream.BucketMembers, ">"),
		kvGet(jetstream.BucketDaemons, ">"),
		kvGet(jetstream.BucketManifests, ">"),
		direct("OBJ_"+jetstream.BucketRecords, ">"),
		direct("OBJ_"+jetstream.BucketCheckpoints, ">"),
		"$JS.FC.>",
	)
	sub = append(sub, committed)
	// Its records go to a store of its own name (events.RecordsBucket), which the bridge makes
	// when it asks (a stream-create subject names the stream, not its configuration, so a member
	// that made its own could give it any subjects), and which it writes, purges (a stopped
	// write's chunks) and reads, and no one else's: the shared store's object names are base64
	// subject tokens no permission can split by member, so it only reads that one (what runs
	// before this wrote).
	own := events.RecordsBucket(run, events.Member(self))
	pub = append(pub,
		"$O."+own+".>",
		// The bridge makes the store (jetstream.ServeStores): a member makes no stream.
		jetstream.StoreRequestSubject(run, events.Member(self)),
		"$JS.API.STREAM.PURGE.OBJ_"+own,
		direct("OBJ_"+own, ">"),
		"$JS.API.CONSUMER.CREATE.OBJ_"+own+".*.$O."+own+".>",
		"$JS.API.CONSUMER.INFO.OBJ_"+own+".*",
		"$JS.API.CONSUMER.DELETE.OBJ_"+own+".*",
	)
	// Watches of the run's keys and reads of records are ordered push consumers of the buckets'
	// streams. Their names are random, so no permission can tell a member's own from another
	// client's (the bridge's watch of the members bucket, a collector's): a member deletes none of
	// those of the KV buckets, which it does not watch itself, and the server removes an ordered
	// consumer whose subscriber has gone. A records read deletes its consumer when done: that
	// delete stays allowed on the records store (docs/PERMISSIONS.md).
	for _, b := range []struct{ stream, filter string }{
		{"KV_" + jetstream.BucketMembers, "$KV." + jetstream.BucketMembers + "." + run + ".>"},
		{"KV_" + jetstream.BucketDaemons, "$KV." + jetstream.BucketDaemons + "." + run + ".>"},
		{"KV_" + jetstream.BucketManifests, "$KV." + jetstream.BucketManifests + "." + run + ".>"},
		{"OBJ_" + jetstream.BucketRecords, "$O." + jetstream.BucketRecords + ".>"},
		{"OBJ_" + jetstream.BucketCheckpoints, "$O." + jetstream.BucketCheckpoints + ".>"},
	} {
		pub = append(pub,
			"$JS.API.CONSUMER.CREATE."+b.stream+".*."+b.filter,
			"$JS.API.CONSUMER.INFO."+b.stream+".*",
		)
	}
	pub = append(pub, "$JS.API.CONSUMER.DELETE.OBJ_"+jetstream.BucketRecords+".*",
		"$JS.API.CONSUMER.DELETE.OBJ_"+jetstream.BucketCheckpoints+".*")
	switch kind {
	case events.KindAgent:
		ownTrajectories := events.TrajectoriesBucket(run, events.Member(self))
		pub = append(pub,
			events.ServiceFilter(run, events.KindOwner),
			events.ServiceFilter(run, events.KindSandbox),
			// Its rollouts' trajectories go to a store of its own name
			// (events.TrajectoriesBucket), which the bridge makes when it
			// asks (jetstream.AskStore), as its records store: it writes
			// them, purges the chunks of one it writes again or of a stopped
			// write, and reads them back. An object store needs roll-ups
			// (its metadata) and its writer a purge, and the shared store's
			// object subjects are base64 tokens no permission can split by
			// agent, so that one it only reads (what runs before this wrote):
			// no write, purge or roll-up of another agent's trajectories.
			"$O."+ownTrajectories+".>",
			"$JS.API.STREAM.PURGE.OBJ_"+ownTrajectories,
			direct("OBJ_"+ownTrajectories, ">"),
			"$JS.API.CONSUMER.CREATE.OBJ_"+ownTrajectories+".*.$O."+ownTrajectories+".>",
			"$JS.API.CONSUMER.INFO.OBJ_"+ownTrajectories+".*",
			"$JS.API.CONSUMER.DELETE.OBJ_"+ownTrajectories+".*",
			direct("OBJ_"+jetstream.BucketTrajectories, ">"),
			"$JS.API.CONSUMER.CREATE.OBJ_"+jetstream.BucketTrajectories+".*.$O."+jetstream.BucketTrajectories+".>",
			"$JS.API.CONSUMER.INFO.OBJ_"+jetstream.BucketTrajectories+".*",
			"$JS.API.CONSUMER.DELETE.OBJ_"+jetstream.BucketTrajectories+".*",
		)
		// It hears its sandboxes' prepare acks, on core NATS (events.LiveAck); one published
		// before it looked a daemon says again when asked on its alive subject.
		sub = append(sub, events.LivePrefix+"."+run+".ack.*."+string(events.PhasePrepare)+"."+string(events.KindSandbox)+".*")
	case events.KindOwner:
		pub = append(pub,
			// Its sandboxes' users, minted by the run's authority (ServeMint).
			jetstream.MintSubject(run),
			kvPub(jetstream.BucketDaemons, string(events.KindSandbox)+".*"),
			"$KV."+jetstream.BucketSnapshots+".>",
			direct("KV_"+jetstream.BucketSnapshots, ">"),
			"$JS.API.CONSUMER.CREATE.KV_"+jetstream.BucketSnapshots+".>",
			"$JS.API.CONSUMER.INFO.KV_"+jetstream.BucketSnapshots+".*",
			"$JS.API.CONSUMER.DELETE.KV_"+jetstream.BucketSnapshots+".*",
		)
	}
	return &Permissions{Publish: Subjects{Allow: pub}, Subscribe: Subjects{Allow: sub}}
}

// ownWrites returns what member kind.name of run writes as itself. An agent
// or an owner: its acks and membership into the stream, its resume acks on
// core NATS, its heartbeat in sp_members (one message a key, no roll-up or
// purge: jetstream.BucketMembers). A sandbox, whose workload can read
// its credentials, writes nothing into the stream, nothing a server keeps
// without bound and nothing that can remove another's data: every ack of
// its travels on core NATS (events.LiveAck), which the bridge hears only
// while it waits for it and records itself; it announces no membership; and
// its heartbeat is its one key of sp_daemons, a bucket with one message a
// key and no roll-up or purge either (jetstream.BucketDaemons), apart from
// the agents' and owners'.
func ownWrites(kind events.MemberKind, run, name string) []string {
	self := string(kind) + "." + name
	kv := func(bucket string) string { return "$KV." + bucket + "." + run + "." + self }
	if kind == events.KindSandbox {
		return []string{events.LivePrefix + "." + run + ".ack.*.*." + self, kv(jetstream.BucketDaemons)}
	}
	sp := events.SubjectPrefix + "." + run + "."
	return []string{
		sp + "ack.*.*." + self,
		events.LivePrefix + "." + run + ".ack.*." + string(events.PhaseResume) + "." + self,
		sp + "member." + self,
		kv(jetstream.BucketMembers),
	}
}

// discoveryVerbs are the verbs of NATS micro's discovery subjects, $SRV.<verb>[.<service>[.<id>]].
var discoveryVerbs = []string{"PING", "INFO", "STATS"}

// discovery returns the discovery subjects a service of member kind answers (and that only its
// kind's users may subscribe to): $SRV.<verb> of every service, and $SRV.<verb>.<name> and
// $SRV.<verb>.<name>.<id> of its kind's service name (events.ServiceName). No member subscribes
// to another service's discovery, so none answers for the bridge or another kind; a micro
// service's id is random, so within a kind the id is not named.
func discovery(kind events.MemberKind) []string {
	name := events.ServiceName(kind)
	var subs []string
	for _, verb := range discoveryVerbs {
		subs = append(subs, "$SRV."+verb)
		if name != "" {
			subs = append(subs, "$SRV."+verb+"."+name, "$SRV."+verb+"."+name+".*")
		}
	}
	return subs
}

// InboxPrefix returns the inbox prefix of member m of run, _INBOX.<run>.<kind>.<name>: a member
// with credentials of its own (MemberCreds, Signer) subscribes only below it, so it reads no
// reply meant for another client. jetstream.Connect sets it from a member's credentials.
func InboxPrefix(run string, m events.Member) string {
	return jetstream.MemberInboxPrefix(run, string(m.Kind()), m.Name())
}
