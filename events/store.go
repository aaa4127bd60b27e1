package events

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Storage formats: what the bus's KV buckets and object store hold
// (PROTOCOL §3). They are part of the wire contract like the events: a
// reader refuses a schema it does not know.

// MemberKey returns the sp_members key of a member, <run>.<member>.
func MemberKey(run string, m Member) string { return run + "." + string(m) }

// MemberKeyFilter returns the sp_members filter of one run, <run>.>.
func MemberKeyFilter(run string) string { return run + ".>" }

// ManifestKey returns the sp_manifests key of a checkpoint, <run>.<checkpoint>.
func ManifestKey(run, checkpoint string) string { return run + "." + checkpoint }

// MemberManifestKey returns the sp_manifests key of one member's manifest,
// <run>.<checkpoint>.<member>: where members of schema-1 runs created it.
// Members of schema-2 runs do not write it (PROTOCOL-HISTORY §35): their commit ack records
// the manifest, and the checkpoint's member list gathers them.
func MemberManifestKey(run, checkpoint string, m Member) string {
	return run + "." + checkpoint + "." + string(m)
}

// HeaderReleasedBy is the header of the purge marker a release leaves on
// each checkpoint key it deletes: the release's id. A bridge finishing a
// release its predecessor died in reads it to report the checkpoints that
// release deleted before the crash.
const HeaderReleasedBy = "Sp-Released-By"

// LatestKey returns the sp_manifests key of the run's newest committed
// checkpoint, <run>.LATEST (moved by compare-and-set).
func LatestKey(run string) string { return run + ".LATEST" }

// HeadKey returns the sp_manifests key of the run's head: the sequence and
// epoch of its last phase event, kept beyond the stream's MaxAge.
func HeadKey(run string) string { return run + ".HEAD" }

// Head is the run's head record (HeadKey): a bridge that finds the run's
// phases aged out of the stream goes on from it, never back to sequence 0
// and epoch 0.
type Head struct {
	Seq     uint64    `json:"seq"`
	Epoch   uint64    `json:"epoch"`
	Updated time.Time `json:"updated"`
}

// MemberInfo is a member's heartbeat in sp_members: who is alive and what
// it can do. The member puts it at start and then every third of the
// bucket's TTL; an expired key means a dead member.
type MemberInfo struct {
	// Run and Member name the member.
	Run    string `json:"run"`
	Member Member `json:"member"`
	// Instance identifies the process: a new process of the same member
	// has a new instance, which tells a replacement from a heartbeat.
	Instance string `json:"instance,omitempty"`
	// Epoch is the epoch the member serves; meaningful once Served.
	Epoch uint64 `json:"epoch"`
	// Served tells whether the member has handled a phase yet. A restore
	// goes to members that have not: a fresh fleet.
	Served bool `json:"served"`
	// Capabilities are as in MemberJoined.
	Capabilities []string `json:"capabilities,omitempty"`
	// Host, PID and Version say where and what it runs.
	Host    string `json:"host,omitempty"`
	PID     int    `json:"pid,omitempty"`
	Version string `json:"version,omitempty"`
	// Started is when the member started; Heartbeat when it last wrote.
	Started   time.Time `json:"started"`
	Heartbeat time.Time `json:"heartbeat"`
}

// Validate checks the heartbeat.
func (m MemberInfo) Validate() error {
	return errors.Join(prefixField("member_info.", ValidateRun(m.Run)), validateMember("member_info.member", string(m.Member)))
}

// CheckpointSchema is the schema version of the checkpoint manifests this
// build writes: 2, whose member manifests are in a member list object
// (MemberList) that MemberList names. Readers also read
// CheckpointSchemaInline, and refuse any other.
const CheckpointSchema = 2

// CheckpointSchemaInline is the schema of checkpoint manifests written
// before the member list (runs of older builds): every member manifest
// inline in Members, each also under its own key
// (MemberManifestKey). It stays readable.
const CheckpointSchemaInline = 1

// CheckpointManifest is the commit point of a checkpoint, created once in
// sp_manifests at <run>.<checkpoint>. A bridge that aborts a checkpoint
// creates the key with Aborted set instead, so that no other bridge (a
// zombie that was presumed dead) can create the manifest afterwards
// (PROTOCOL §7, invariant 2).
type CheckpointManifest struct {
	// Schema is CheckpointSchema, or CheckpointSchemaInline in old runs.
	Schema int `json:"schema"`
	// Run, CheckpointID and Epoch say which checkpoint this is.
	Run          string `json:"run"`
	CheckpointID string `json:"checkpoint_id"`
	Epoch        uint64 `json:"epoch"`
	// Created is when the bridge created the key.
	Created time.Time `json:"created"`
	// Aborted marks a checkpoint that will never exist; Reason says why.
	Aborted bool   `json:"aborted,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Continued and Restarted are the episodes the checkpoint continues and
	// those that restart from their input.
	Continued []string `json:"continued,omitempty"`
	Restarted []string `json:"restarted,omitempty"`
	// Carried are the episodes the checkpoint holds through an older one
	// (PROTOCOL §5, Progress only moves forward): unfinished at the
	// checkpoint before, and not every member that held them committed
	// this one, so all of each comes from the newest checkpoint that held
	// it whole. Continued does not list them.
	Carried []Carry `json:"carried,omitempty"`
	// Retired are the episodes the checkpoint before held, whose members
	// did not all commit this one, and that the controller's list left
	// out: it has their result or gave them up. Every other episode the
	// checkpoint before held is in Continued or Carried, or ended on
	// members that committed this one (§7).
	Retired []string `json:"retired,omitempty"`
	// Members holds every member's manifest. In schema 1 they are stored
	// here, inline. In schema 2 the KV value never holds them (Stored
	// drops them): they are in the object MemberList names, and a reader
	// that loaded it (DecodeMemberList) may keep them here in memory.
	Members []MemberManifest `json:"members,omitempty"`
	// MemberList names the member list object of a committed schema-2
	// manifest; nil on an abort marker and in schema 1.
	MemberList *MemberListRef `json:"member_list,omitempty"`
	// Committed names every member that committed, as the member list says
	// (LoadMembers; in memory only): in schema 2, Members holds only those
	// that exported records. Nil in schema 1, where Members names them all.
	Committed []Member `json:"-"`
	// PrepareSeq and CommitSeq are the phase sequences of the checkpoint.
	PrepareSeq uint64 `json:"prepare_seq,omitempty"`
	CommitSeq  uint64 `json:"commit_seq,omitempty"`
	// PrepareMS and CommitMS time the two phases.
	PrepareMS int64 `json:"prepare_ms,omitempty"`
	CommitMS  int64 `json:"commit_ms,omitempty"`
	// Stop tells whether the checkpoint parked the fleet.
	Stop bool `json:"stop,omitempty"`
	// Released is set on a committed checkpoint that a release did not
	// keep and that failed: members may have deleted external state
	// (snapshots) the checkpoint names, so it is restored no more.
	Released *ReleaseMark `json:"released,omitempty"`
}

// Carry is a set of episodes a checkpoint carries from an older one, all
// held there by the same members.
type Carry struct {
	// From is the checkpoint whose records hold the episodes, all of
	// them: never one that carried them itself.
	From string `json:"from"`
	// FromCommitSeq is From's commit phase sequence.
	FromCommitSeq uint64 `json:"from_commit_seq"`
	// Episodes are the carried episode ids, sorted.
	Episodes []string `json:"episodes"`
	// Members are the members whose records in From hold each of them,
	// sorted: a restore needs a fresh member of each name.
	Members []Member `json:"members"`
}

// Validate checks the carry.
func (c Carry) Validate() error {
	errs := []error{ValidateCheckpointID(c.From), validateKeys("episodes", c.Episodes)}
	if len(c.Episodes) == 0 {
		errs = append(errs, fieldErr("episodes", ErrInvalid, "empty"))
	}
	if len(c.Members) > MaxMembers {
		errs = append(errs, fieldErr("members", ErrTooLarge, "%d members, limit %d", len(c.Members), MaxMembers))
	}
	for i, m := range c.Members {
		if err := validateMember(fmt.Sprintf("members[%d]", i), string(m)); err != nil {
			errs = append(errs, err)
			break
		}
	}
	return errors.Join(errs...)
}

// CarriedEpisodes returns every episode of the carries, sorted.
func CarriedEpisodes(cs []Carry) []string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Episodes...)
	}
	slices.Sort(out)
	return out
}

// Held returns every episode the checkpoint holds: continued or carried,
// sorted.
func (c CheckpointManifest) Held() []string {
	out := append(slices.Clone(c.Continued), CarriedEpisodes(c.Carried)...)
	slices.Sort(out)
	return slices.Compact(out)
}

// Holding is where a checkpoint holds one episode: the checkpoint whose
// records have every part of it (From, its commit sequence) and the
// members whose records those are.
type Holding struct {
	From          string
	FromCommitSeq uint64
	Members       []Member
}

// Holdings returns every episode the checkpoint holds, with where: its own
// records for a continued episode, the carry's source for a carried one.
// Its members must be loaded.
func (c CheckpointManifest) Holdings() map[string]Holding {
	out := map[string]Holding{}
	for _, k := range c.Continued {
		out[k] = Holding{From: c.CheckpointID, FromCommitSeq: c.CommitSeq}
	}
	for _, mm := range c.Members {
		for _, k := range mm.Episodes {
			if h, ok := out[k]; ok && h.From == c.CheckpointID {
				h.Members = append(h.Members, mm.Member)
				out[k] = h
			}
		}
	}
	for _, cr := range c.Carried {
		for _, k := range cr.Episodes {
			out[k] = Holding{From: cr.From, FromCommitSeq: cr.FromCommitSeq, Members: cr.Members}
		}
	}
	return out
}

// ReleaseMark says which failed release left a checkpoint, and what is
// known of what it deleted.
type ReleaseMark struct {
	// Op is the id of the last failed release that did not keep it.
	Op string `json:"op"`
	// Deleted maps each member that released to what it deleted (every
	// failed release that did not keep the checkpoint, together).
	Deleted map[Member][]string `json:"deleted,omitempty"`
	// Failed names the members that did not release: they may have
	// deleted some of it too.
	Failed []MemberError `json:"failed,omitempty"`
}

// Validate checks the mark.
func (r ReleaseMark) Validate() error {
	errs := []error{ValidateToken("checkpoint.released.op", r.Op), validateMemberErrors("checkpoint.released.failed", r.Failed)}
	if len(r.Deleted) > MaxMembers {
		errs = append(errs, fieldErr("checkpoint.released.deleted", ErrTooLarge, "%d members, limit %d", len(r.Deleted), MaxMembers))
	}
	for m, ids := range r.Deleted {
		if err := validateMember("checkpoint.released.deleted", string(m)); err != nil {
			errs = append(errs, err)
			break
		}
		if err := validateTokens("checkpoint.released.deleted."+string(m), ids); err != nil {
			errs = append(errs, err)
			break
		}
	}
	return errors.Join(errs...)
}

// Validate checks the manifest.
func (c CheckpointManifest) Validate() error {
	var errs []error
	switch c.Schema {
	case CheckpointSchemaInline:
		if c.MemberList != nil {
			errs = append(errs, fieldErr("checkpoint.member_list", ErrInvalid, "set in a schema %d manifest", c.Schema))
		}
	case CheckpointSchema:
		switch {
		case c.MemberList != nil:
			errs = append(errs, c.MemberList.Validate(c.Run, c.CheckpointID))
			if len(c.Members) > 0 && len(c.Members) != c.MemberList.Count {
				errs = append(errs, fieldErr("checkpoint.members", ErrMismatch, "%d loaded, the member list holds %d", len(c.Members), c.MemberList.Count))
			}
		case !c.Aborted:
			errs = append(errs, fieldErr("checkpoint.member_list", ErrInvalid, "missing on a committed schema %d manifest", c.Schema))
		}
	default:
		errs = append(errs, fieldErr("checkpoint.schema", ErrUnknownVersion, "%d, this build reads %d and %d", c.Schema, CheckpointSchemaInline, CheckpointSchema))
	}
	errs = append(errs, prefixField("checkpoint.", errors.Join(ValidateRun(c.Run), ValidateCheckpointID(c.CheckpointID))))
	errs = append(errs, validateKeys("checkpoint.continued", c.Continued), validateKeys("checkpoint.restarted", c.Restarted),
		validateKeys("checkpoint.retired", c.Retired))
	if len(c.Carried) > MaxListLen {
		errs = append(errs, fieldErr("checkpoint.carried", ErrTooLarge, "%d entries, limit %d", len(c.Carried), MaxListLen))
	}
	for i, cr := range c.Carried {
		if err := cr.Validate(); err != nil {
			errs = append(errs, prefixField(fmt.Sprintf("checkpoint.carried[%d].", i), err))
			break
		}
		if cr.From == c.CheckpointID {
			errs = append(errs, fieldErr(fmt.Sprintf("checkpoint.carried[%d].from", i), ErrInvalid, "names the checkpoint itself"))
			break
		}
	}
	for i, m := range c.Members {
		if err := m.Validate(); err != nil {
			errs = append(errs, prefixField(fmt.Sprintf("checkpoint.members[%d].", i), err))
			break
		}
		if m.Run != c.Run || m.CheckpointID != c.CheckpointID {
			errs = append(errs, fieldErr(fmt.Sprintf("checkpoint.members[%d]", i), ErrMismatch, "names %s/%s", m.Run, m.CheckpointID))
			break
		}
	}
	if c.Released != nil {
		errs = append(errs, c.Released.Validate())
	}
	return errors.Join(errs...)
}

// Stored returns the manifest as the KV value holds it: a schema-2
// manifest without its members (they are in its member list object).
func (c CheckpointManifest) Stored() CheckpointManifest {
	if c.Schema != CheckpointSchemaInline {
		c.Members, c.Committed = nil, nil
	}
	return c
}

// CommittedMembers returns every member that committed: Committed when the
// member list said, else the members of Members.
func (c CheckpointManifest) CommittedMembers() []Member {
	if len(c.Committed) > 0 {
		return slices.Clone(c.Committed)
	}
	out := make([]Member, 0, len(c.Members))
	for _, mm := range c.Members {
		out = append(out, mm.Member)
	}
	return out
}

// Latest is the value of <run>.LATEST.
type Latest struct {
	// CheckpointID is the newest committed checkpoint.
	CheckpointID string `json:"checkpoint_id"`
	// Epoch is the epoch it was taken in.
	Epoch uint64 `json:"epoch"`
	// CommitSeq is the phase sequence of its commit: LATEST only moves to
	// a checkpoint committed later than the one it names.
	CommitSeq uint64 `json:"commit_seq,omitempty"`
	// Updated is when the pointer moved.
	Updated time.Time `json:"updated"`
}

// Record is one line of a member's records object in sp_records: the
// state of one captured thing, keyed by its capture key.
type Record struct {
	// Key is the capture key (an episode) or another id the member owns.
	Key string `json:"key"`
	// Data is the member's own JSON.
	Data json.RawMessage `json:"data"`
}
