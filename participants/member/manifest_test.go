package member_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
	"github.com/stillpoint/stillpoint/participants/member/membertest"
)

// v2Checkpoint makes what a v2 commit of checkpoint id leaves on the bus:
// each member's records and its commit ack (of phase sequence seq)
// carrying the manifest, the member list in sp_checkpoints and the
// schema-2 checkpoint manifest naming it. It returns the manifests by
// member and the list's bytes.
func v2Checkpoint(t *testing.T, env *jstest.Env, id string, seq uint64, recs map[events.Member][]events.Record) (map[events.Member]events.MemberManifest, events.CheckpointManifest) {
	t.Helper()
	mans := map[events.Member]events.MemberManifest{}
	var list []events.MemberManifest
	for m, rs := range recs {
		man, err := member.WriteRecords(t.Context(), env.Bus.Records, "run1", id, m, rs)
		if err != nil {
			t.Fatal(err)
		}
		mans[m] = man
		list = append(list, man)
		publishAck(t, env, events.CommitAck{AckHeader: events.AckHeader{Run: "run1", Member: m, Seq: seq, CheckpointID: id, OK: true,
			State: events.StateCommitted}, Manifest: &man})
	}
	data, ref, err := events.EncodeMemberList("run1", id, nil, list)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Bus.Checkpoints.PutBytes(t.Context(), ref.Object, data); err != nil {
		t.Fatal(err)
	}
	cm := events.CheckpointManifest{Schema: events.CheckpointSchema, Run: "run1", CheckpointID: id, CommitSeq: seq,
		Created: time.Now().UTC(), MemberList: &ref}
	putCheckpoint(t, env, cm)
	return mans, cm
}

func putCheckpoint(t *testing.T, env *jstest.Env, cm events.CheckpointManifest) {
	t.Helper()
	b, err := json.Marshal(cm.Stored())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.Bus.Manifests.Put(t.Context(), events.ManifestKey("run1", cm.CheckpointID), b); err != nil {
		t.Fatal(err)
	}
}

func publishAck(t *testing.T, env *jstest.Env, ack events.CommitAck) {
	t.Helper()
	msg, err := events.Marshal(ack.Member, ack)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := jetstream.PublishOnce(t.Context(), env.JS, msg); err != nil {
		t.Fatal(err)
	}
}

// dropAck removes an ack from the stream, as MaxAge does.
func dropAck(t *testing.T, env *jstest.Env, seq uint64, m events.Member) {
	t.Helper()
	if err := env.Bus.Stream.Purge(t.Context(), natsjs.WithPurgeSubject(events.AckSubject("run1", seq, events.PhaseCommit, m))); err != nil {
		t.Fatal(err)
	}
}

// PROTOCOL §5, restore: a member finds its manifest in its own commit ack
// of the source's commit, and in the member list once the ack is gone;
// both verify, and its records read back the same.
func TestFindManifestFromAckThenList(t *testing.T) {
	env := jstest.Start(t)
	other := events.Member("owner.b")
	mans, _ := v2Checkpoint(t, env, "c1", 5, map[events.Member][]events.Record{self: records(3, 10), other: records(1, 10)})
	for _, seq := range []uint64{5, 0} { // the restore names the sequence, or not
		got, recs, err := member.ReadRecordsAt(t.Context(), env.Bus, "run1", "c1", self, seq, nil)
		if err != nil || got.SHA256 != mans[self].SHA256 || len(recs) != 3 {
			t.Fatalf("from the ack (seq %d): %+v, %d records, %v", seq, got, len(recs), err)
		}
	}
	dropAck(t, env, 5, self)
	got, recs, err := member.ReadRecordsAt(t.Context(), env.Bus, "run1", "c1", self, 5, nil)
	if err != nil || got.SHA256 != mans[self].SHA256 || len(recs) != 3 {
		t.Fatalf("from the member list: %+v, %d records, %v", got, len(recs), err)
	}
	// A member not in the commit has no manifest there.
	if _, err := member.FindManifest(t.Context(), env.Bus, "run1", "c1", "agent.z", 5); !errors.Is(err, member.ErrNoManifest) {
		t.Fatalf("a member not in the list: %v, want ErrNoManifest", err)
	}
}

// PROTOCOL §5, restore: a member list whose bytes are not the ones its
// digest names is refused, naming the digest, and nothing is read.
func TestFindManifestTamperedList(t *testing.T) {
	env := jstest.Start(t)
	_, cm := v2Checkpoint(t, env, "c1", 5, map[events.Member][]events.Record{self: records(2, 10)})
	dropAck(t, env, 5, self)
	data, err := env.Bus.Checkpoints.GetBytes(t.Context(), cm.MemberList.Object)
	if err != nil {
		t.Fatal(err)
	}
	tampered := bytes.Replace(data, []byte(`"count":2`), []byte(`"count":9`), 1)
	if bytes.Equal(tampered, data) {
		t.Fatal("nothing tampered")
	}
	if _, err := env.Bus.Checkpoints.PutBytes(t.Context(), cm.MemberList.Object, tampered); err != nil {
		t.Fatal(err)
	}
	_, recs, err := member.ReadRecordsAt(t.Context(), env.Bus, "run1", "c1", self, 5, nil)
	if !errors.Is(err, member.ErrCorruptRecords) || !strings.Contains(err.Error(), "sha256") || !strings.Contains(err.Error(), cm.MemberList.Object) || recs != nil {
		t.Fatalf("tampered list: %v, %d records; want ErrCorruptRecords naming the object and its sha256", err, len(recs))
	}
	// Gone altogether: refused as corrupt too, not read as "no manifest".
	if err := env.Bus.Checkpoints.Delete(t.Context(), cm.MemberList.Object); err != nil {
		t.Fatal(err)
	}
	if _, err := member.FindManifest(t.Context(), env.Bus, "run1", "c1", self, 5); !errors.Is(err, member.ErrCorruptRecords) {
		t.Fatalf("missing list: %v, want ErrCorruptRecords", err)
	}
}

// PROTOCOL §5, restore: the ack on the member's own commit subject must
// be its own: one whose manifest names another member (forged, or
// misrouted) is refused as corrupt, never installed.
func TestFindManifestForgedAck(t *testing.T) {
	env := jstest.Start(t)
	other := events.Member("owner.b")
	recs := records(1, 10)
	theirs, err := member.WriteRecords(t.Context(), env.Bus.Records, "run1", "c1", other, recs)
	if err != nil {
		t.Fatal(err)
	}
	// A valid ack of self, then its manifest swapped for other's in the
	// bytes: what a forger without the member's keys would publish.
	mine, _ := member.Digest("run1", "c1", self, recs)
	msg, err := events.Marshal(self, events.CommitAck{AckHeader: events.AckHeader{Run: "run1", Member: self, Seq: 5, CheckpointID: "c1", OK: true,
		State: events.StateCommitted}, Manifest: &mine})
	if err != nil {
		t.Fatal(err)
	}
	a, _ := json.Marshal(mine)
	b, _ := json.Marshal(theirs)
	msg.Data = bytes.Replace(msg.Data, a, b, 1)
	if _, err := jetstream.PublishOnce(t.Context(), env.JS, msg); err != nil {
		t.Fatal(err)
	}
	_, got, err := member.ReadRecordsAt(t.Context(), env.Bus, "run1", "c1", self, 5, nil)
	if !errors.Is(err, member.ErrCorruptRecords) || !strings.Contains(err.Error(), string(other)) || got != nil {
		t.Fatalf("forged ack: %v, %d records; want ErrCorruptRecords naming %s", err, len(got), other)
	}
}

// PROTOCOL-HISTORY §35: a schema-1 checkpoint (inline members, a KV key per member)
// still reads; a schema this build does not know is refused, named.
func TestFindManifestSchemas(t *testing.T) {
	env := jstest.Start(t)
	recs := records(2, 10)
	man, err := member.WriteRecords(t.Context(), env.Bus.Records, "run1", "c1", self, recs)
	if err != nil {
		t.Fatal(err)
	}
	if err := member.CreateManifest(t.Context(), env.Bus.Manifests, man); err != nil {
		t.Fatal(err)
	}
	putCheckpoint(t, env, events.CheckpointManifest{Schema: events.CheckpointSchemaInline, Run: "run1", CheckpointID: "c1", CommitSeq: 5,
		Created: time.Now().UTC(), Members: []events.MemberManifest{man}})
	for _, seq := range []uint64{0, 5} { // no ack of seq 5 on the stream: the key is read
		got, all, err := member.ReadRecordsAt(t.Context(), env.Bus, "run1", "c1", self, seq, nil)
		if err != nil || got.SHA256 != man.SHA256 || len(all) != 2 {
			t.Fatalf("schema 1 (seq %d): %+v, %d records, %v", seq, got, len(all), err)
		}
	}
	b := []byte(`{"schema":3,"run":"run1","checkpoint_id":"c2","created":"2026-01-01T00:00:00Z"}`)
	if _, err := env.Bus.Manifests.Put(t.Context(), events.ManifestKey("run1", "c2"), b); err != nil {
		t.Fatal(err)
	}
	if _, err := member.FindManifest(t.Context(), env.Bus, "run1", "c2", self, 0); !errors.Is(err, events.ErrUnknownVersion) || !strings.Contains(err.Error(), "schema: unknown event version: 3") {
		t.Fatalf("schema 3: %v, want ErrUnknownVersion naming it", err)
	}
}

// PROTOCOL §5, restore: a fresh member restores from the checkpoint's
// member list once its commit ack has aged out of the stream; a list that
// does not match its digest fails the restore (corrupt_records) with
// nothing installed, and once it is whole again the restore installs all.
func TestRestoreFromTheMemberList(t *testing.T) {
	w := start(t, membertest.Options{Episodes: 2})
	eps := []events.Episode{{Rollout: "t0-r0"}, {Rollout: "t0-r1"}}
	want(t, w.prepare(t, "c1"), "", events.StatePrepared)
	c := w.commit(t, "c1", eps, false).(events.CommitAck)
	want(t, c, "", events.StateCommitted)
	want(t, w.resume(t, "c1"), "", events.StateIdle)
	if c.Manifest == nil {
		t.Fatal("a commit of records without their manifest")
	}
	// The bridge's part, and the ack aged out.
	data, ref, err := events.EncodeMemberList("run1", "c1", nil, []events.MemberManifest{*c.Manifest})
	if err != nil {
		t.Fatal(err)
	}
	tampered := bytes.Replace(data, []byte(c.Manifest.SHA256), []byte(strings.Repeat("0", 64)), 1)
	if _, err := w.env.Bus.Checkpoints.PutBytes(t.Context(), ref.Object, tampered); err != nil {
		t.Fatal(err)
	}
	putCheckpoint(t, w.env, events.CheckpointManifest{Schema: events.CheckpointSchema, Run: "run1", CheckpointID: "c1", CommitSeq: c.Seq,
		Created: time.Now().UTC(), Continued: []string{"t0-r0", "t0-r1"}, MemberList: &ref})
	dropAck(t, w.env, c.Seq, w.name)
	if err := w.h.Stop(); err != nil {
		t.Fatal(err)
	}

	p := membertest.NewParticipant(w.name.Name())
	membertest.StartMember(t, w.env, "run1", w.name, p, membertest.Options{})
	w.bridge.Epoch = 1
	r := w.phase(t, events.Restore{PhaseHeader: w.bridge.Header("r1", 10*time.Second, w.name), Source: "c1", Scope: eps}).(events.RestoreAck)
	want(t, r, member.CodeCorruptRecords, events.StateIdle)
	if d := r.Error.Detail; !strings.Contains(d, ref.Object) || !strings.Contains(d, "sha256") {
		t.Fatalf("detail %q, want the list and its digest named", d)
	}
	if live := p.Live(); len(live) != 0 {
		t.Fatalf("live %v after a failed restore, want nothing installed", live)
	}
	want(t, w.resume(t, "r1"), "", events.StateIdle)

	if _, err := w.env.Bus.Checkpoints.PutBytes(t.Context(), ref.Object, data); err != nil {
		t.Fatal(err)
	}
	w.bridge.Epoch = 2
	r = w.phase(t, events.Restore{PhaseHeader: w.bridge.Header("r2", 10*time.Second, w.name), Source: "c1", Scope: eps}).(events.RestoreAck)
	want(t, r, "", events.StateRestored)
	got := slices.Clone(r.Restored)
	slices.Sort(got)
	if !slices.Equal(got, []string{"t0-r0-a1", "t0-r1-a1"}) {
		t.Fatalf("restored %v, want the next attempts of both", r.Restored)
	}
}

// PROTOCOL §5, restore: when the restore says the stream keeps every ack
// of the source's commit (source_acks), a fresh member with no ack there
// (a sandbox forked under a new name) has no manifest and reads no member
// list: one direct get, and nothing to install.
func TestRestoreWithTheAcksKeptReadsNoList(t *testing.T) {
	env := jstest.Start(t)
	v2Checkpoint(t, env, "c1", 5, map[events.Member][]events.Record{"agent.other": records(1, 10)})
	h := membertest.StartMember(t, env, "run1", self, membertest.NewParticipant(self.Name()), membertest.Options{})
	b := membertest.NewBridge(t, env, "run1")
	b.Epoch = 1
	// The list made unreadable: a member that read it would fail.
	lists, err := env.Bus.Checkpoints.List(t.Context())
	if err != nil || len(lists) != 1 {
		t.Fatalf("lists %v %v", lists, err)
	}
	if err := env.Bus.Checkpoints.Delete(t.Context(), lists[0].Name); err != nil {
		t.Fatal(err)
	}
	r := b.Ack(b.Publish(events.Restore{PhaseHeader: b.Header("r1", 10*time.Second, self), Source: "c1", SourceCommitSeq: 5, SourceAcks: true}),
		events.PhaseRestore, self).(events.RestoreAck)
	want(t, r, "", events.StateRestored)
	if len(r.Restored) != 0 || len(h.Participant.Live()) != 0 {
		t.Fatalf("restored %v, live %v: want nothing", r.Restored, h.Participant.Live())
	}
	// Without the flag the same member reads the list, and finds it gone.
	h2 := membertest.StartMember(t, env, "run1", "owner.fresh", membertest.NewParticipant("fresh"), membertest.Options{})
	b.Epoch = 2
	r = b.Ack(b.Publish(events.Restore{PhaseHeader: b.Header("r2", 10*time.Second, h2.Name), Source: "c1", SourceCommitSeq: 5}),
		events.PhaseRestore, h2.Name).(events.RestoreAck)
	want(t, r, member.CodeCorruptRecords, events.StateIdle)
}
