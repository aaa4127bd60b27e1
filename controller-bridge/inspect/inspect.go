package inspect

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/owner/ownerapi"
)

// Errors returned by Run.
var (
	// ErrBadRun is returned (wrapped) for a run id that is not a valid
	// token.
	ErrBadRun = errors.New("inspect: bad run id")
	// ErrNoBucket is returned (wrapped, naming the bucket) when the server
	// has no such KV bucket or object store: not a Stillpoint bus, or one
	// not provisioned yet.
	ErrNoBucket = errors.New("inspect: bucket not found")
)

// Report is what Run found.
type Report struct {
	// Run is the run id.
	Run string `json:"run"`
	// Latest and Head are the run's <run>.LATEST and <run>.HEAD records;
	// nil when absent (no checkpoint kept, or no phase yet).
	Latest *events.Latest `json:"latest"`
	Head   *events.Head   `json:"head"`
	// Checkpoints are the checkpoint keys kept, oldest first: manifests
	// and abort markers.
	Checkpoints []Checkpoint `json:"checkpoints"`
	// Snapshots are the owner's index entries of the run, by id.
	Snapshots []Snapshot `json:"snapshots"`
	// Members are the live members' heartbeats, by name.
	Members []events.MemberInfo `json:"members"`
	// Problems lists every key that did not decode and every manifest that
	// did not verify, one line each.
	Problems []string `json:"problems,omitempty"`
}

// Checkpoint is one checkpoint key and its verification.
type Checkpoint struct {
	// ID, Epoch and Created are as in the manifest.
	ID      string    `json:"checkpoint_id"`
	Epoch   uint64    `json:"epoch"`
	Created time.Time `json:"created"`
	// Aborted marks an abort marker; Reason says why.
	Aborted bool   `json:"aborted,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Released is set when a failed release left it (restored no more).
	Released bool `json:"released,omitempty"`
	// Stop, Continued and Restarted are as in the manifest, counted.
	Stop      bool `json:"stop,omitempty"`
	Continued int  `json:"continued"`
	Restarted int  `json:"restarted"`
	// Schema is the manifest's schema: 1, members inline and a key each;
	// 2, a member list.
	Schema int `json:"schema"`
	// MemberList is the schema-2 member list object in sp_checkpoints.
	MemberList string `json:"member_list,omitempty"`
	// Members are its member manifests, each verified.
	Members []MemberCheck `json:"members,omitempty"`
	// Verified tells that every member manifest verified (false for an
	// abort marker).
	Verified bool `json:"verified"`
}

// MemberCheck is one member manifest checked against its records object.
type MemberCheck struct {
	// Member, Bucket, Object, Size, SHA256 and Count are as the manifest
	// says (Bucket is the records store: sp_records, or the member's own).
	Member events.Member `json:"member"`
	Bucket string        `json:"bucket"`
	Object string        `json:"object"`
	Size   int64         `json:"size"`
	SHA256 string        `json:"sha256"`
	Count  int           `json:"count"`
	// OK tells that the object exists with that size and digest, and that
	// the member's own record agrees (its manifest key in schema 1, its
	// commit ack in schema 2 while the stream keeps it); Problem says what
	// did not.
	OK      bool   `json:"ok"`
	Problem string `json:"problem,omitempty"`
}

// Snapshot is one owner index entry of the run.
type Snapshot struct {
	// ID is the snapshot id; Checkpoints name it.
	ID          string   `json:"snapshot"`
	Checkpoints []string `json:"checkpoints"`
	// Unkept are those of Checkpoints whose manifests are not kept.
	Unkept []string `json:"unkept,omitempty"`
}

// Run reads run's state on the bus that js reaches.
func Run(ctx context.Context, js natsjs.JetStream, run string) (*Report, error) {
	if err := events.ValidateRun(run); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRun, err)
	}
	manifests, err := bucket(ctx, js, jetstream.BucketManifests)
	if err != nil {
		return nil, err
	}
	members, err := bucket(ctx, js, jetstream.BucketMembers)
	if err != nil {
		return nil, err
	}
	// The sandbox daemons' heartbeats; a bus provisioned before their
	// bucket has none.
	daemons, err := bucket(ctx, js, jetstream.BucketDaemons)
	if errors.Is(err, ErrNoBucket) {
		daemons = nil
	} else if err != nil {
		return nil, err
	}
	snapshots, err := bucket(ctx, js, jetstream.BucketSnapshots)
	if err != nil {
		return nil, err
	}
	if _, err := js.ObjectStore(ctx, jetstream.BucketRecords); errors.Is(err, natsjs.ErrBucketNotFound) || errors.Is(err, natsjs.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: object store %s", ErrNoBucket, jetstream.BucketRecords)
	} else if err != nil {
		return nil, fmt.Errorf("inspect: open %s: %w", jetstream.BucketRecords, err)
	}
	records := &stores{js: js, open: map[string]natsjs.ObjectStore{}}
	// Schema-2 manifests name a member list in the bridge's store, and
	// each member's manifest is also in its commit ack on the stream. A
	// bus provisioned before the member list has no such store: its
	// schema-2 manifests are reported, not read.
	if lists, err := js.ObjectStore(ctx, jetstream.BucketCheckpoints); err == nil {
		records.lists = lists
	} else if !errors.Is(err, natsjs.ErrBucketNotFound) && !errors.Is(err, natsjs.ErrStreamNotFound) {
		return nil, fmt.Errorf("inspect: open %s: %w", jetstream.BucketCheckpoints, err)
	}
	if s, err := js.Stream(ctx, jetstream.StreamName); err == nil {
		records.stream = s
	}
	r := &Report{Run: run, Checkpoints: []Checkpoint{}, Snapshots: []Snapshot{}, Members: []events.MemberInfo{}}
	if err := r.readManifests(ctx, js, manifests, records); err != nil {
		return nil, err
	}
	for _, kv := range []natsjs.KeyValue{members, daemons} {
		if err := r.readMembers(ctx, js, kv); err != nil {
			return nil, err
		}
	}
	sort.Slice(r.Members, func(i, j int) bool { return r.Members[i].Member < r.Members[j].Member })
	if err := r.readSnapshots(ctx, js, snapshots); err != nil {
		return nil, err
	}
	return r, nil
}

func bucket(ctx context.Context, js natsjs.JetStream, name string) (natsjs.KeyValue, error) {
	kv, err := js.KeyValue(ctx, name)
	if errors.Is(err, natsjs.ErrBucketNotFound) || errors.Is(err, natsjs.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: kv bucket %s (is this a Stillpoint server? `stillpoint server` provisions it)", ErrNoBucket, name)
	}
	if err != nil {
		return nil, fmt.Errorf("inspect: open %s: %w", name, err)
	}
	return kv, nil
}

func (r *Report) problem(format string, args ...any) {
	r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
}

// stores opens the records stores that manifests name, once each: the
// shared sp_records, or a member's own (events.RecordsBucket).
type stores struct {
	js   natsjs.JetStream
	open map[string]natsjs.ObjectStore
	// lists is sp_checkpoints, nil when the bus has none; stream the
	// audit stream, nil when it cannot be read.
	lists  natsjs.ObjectStore
	stream natsjs.Stream
}

func (s *stores) get(ctx context.Context, bucket string) (natsjs.ObjectStore, error) {
	if bucket == "" {
		bucket = jetstream.BucketRecords
	}
	if st, ok := s.open[bucket]; ok {
		return st, nil
	}
	st, err := s.js.ObjectStore(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", bucket, err)
	}
	s.open[bucket] = st
	return st, nil
}

func (r *Report) readManifests(ctx context.Context, js natsjs.JetStream, kv natsjs.KeyValue, records *stores) error {
	vals, err := jetstream.KVValues(ctx, js, kv, r.Run+".>")
	if err != nil {
		return fmt.Errorf("inspect: read %s: %w", jetstream.BucketManifests, err)
	}
	if v, ok := vals[events.LatestKey(r.Run)]; ok {
		var l events.Latest
		if err := json.Unmarshal(v, &l); err != nil {
			r.problem("%s does not decode: %v", events.LatestKey(r.Run), err)
		} else {
			r.Latest = &l
		}
	}
	if v, ok := vals[events.HeadKey(r.Run)]; ok {
		var h events.Head
		if err := json.Unmarshal(v, &h); err != nil {
			r.problem("%s does not decode: %v", events.HeadKey(r.Run), err)
		} else {
			r.Head = &h
		}
	}
	for k, v := range vals {
		rest := strings.TrimPrefix(k, r.Run+".")
		if strings.Contains(rest, ".") || k == events.LatestKey(r.Run) || k == events.HeadKey(r.Run) {
			continue // a member manifest (read with its checkpoint), LATEST or HEAD
		}
		var m events.CheckpointManifest
		if err := json.Unmarshal(v, &m); err != nil {
			r.problem("%s does not decode: %v", k, err)
			continue
		}
		if err := m.Validate(); err != nil {
			r.problem("%s: %v", k, err)
			continue
		}
		c := Checkpoint{ID: m.CheckpointID, Epoch: m.Epoch, Created: m.Created, Aborted: m.Aborted, Reason: m.Reason,
			Released: m.Released != nil, Stop: m.Stop, Continued: len(m.Continued), Restarted: len(m.Restarted), Verified: !m.Aborted,
			Schema: m.Schema}
		if m.MemberList != nil {
			c.MemberList = m.MemberList.Object
			if err := records.loadMembers(ctx, &m); err != nil {
				c.Verified = false
				r.problem("checkpoint %s: member list: %v", m.CheckpointID, err)
			}
		}
		for _, mm := range m.Members {
			var own func() (*events.MemberManifest, string)
			if m.Schema == events.CheckpointSchemaInline {
				own = ownKey(vals[events.MemberManifestKey(r.Run, m.CheckpointID, mm.Member)])
			} else {
				own = records.ownAck(ctx, r.Run, m.CommitSeq, mm.Member)
			}
			mc := verify(ctx, records, mm, own)
			if !mc.OK {
				c.Verified = false
				r.problem("checkpoint %s, member %s: %s", m.CheckpointID, mm.Member, mc.Problem)
			}
			c.Members = append(c.Members, mc)
		}
		r.Checkpoints = append(r.Checkpoints, c)
	}
	sort.Slice(r.Checkpoints, func(i, j int) bool {
		a, b := r.Checkpoints[i], r.Checkpoints[j]
		if !a.Created.Equal(b.Created) {
			return a.Created.Before(b.Created)
		}
		return a.ID < b.ID
	})
	if r.Latest != nil && !r.kept(r.Latest.CheckpointID) {
		r.problem("LATEST names %s, whose manifest is not kept", r.Latest.CheckpointID)
	}
	return nil
}

// loadMembers reads m's member list from sp_checkpoints, verified by its
// digest.
func (s *stores) loadMembers(ctx context.Context, m *events.CheckpointManifest) error {
	if s.lists == nil {
		return fmt.Errorf("%w: object store %s", ErrNoBucket, jetstream.BucketCheckpoints)
	}
	return m.LoadMembers(func(o string) ([]byte, error) { return s.lists.GetBytes(ctx, o) })
}

// ownKey is the member's own record of a schema-1 manifest: its key in
// sp_manifests (raw, nil when gone). It returns the manifest there, or
// why there is none to compare.
func ownKey(raw []byte) func() (*events.MemberManifest, string) {
	return func() (*events.MemberManifest, string) {
		var stored events.MemberManifest
		switch {
		case raw == nil:
			return nil, "its member manifest key is gone"
		case json.Unmarshal(raw, &stored) != nil:
			return nil, "its member manifest key does not decode"
		}
		return &stored, ""
	}
}

// ownAck is the member's own record of a schema-2 manifest: its commit ack
// of the checkpoint's commit (commitSeq), read from the stream. An ack
// aged out of the stream is no problem: the member list alone is then the
// record (nil, "").
func (s *stores) ownAck(ctx context.Context, run string, commitSeq uint64, m events.Member) func() (*events.MemberManifest, string) {
	return func() (*events.MemberManifest, string) {
		if s.stream == nil {
			return nil, ""
		}
		subject := events.AckSubject(run, commitSeq, events.PhaseCommit, m)
		raw, err := s.stream.GetLastMsgForSubject(ctx, subject)
		if errors.Is(err, natsjs.ErrMsgNotFound) {
			return nil, ""
		}
		if err != nil {
			return nil, fmt.Sprintf("its commit ack %s: %v", subject, err)
		}
		_, d, err := events.Unmarshal(&nats.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data})
		if err != nil {
			return nil, fmt.Sprintf("its commit ack %s does not decode: %v", subject, err)
		}
		ack, ok := d.(events.CommitAck)
		if !ok || ack.Manifest == nil {
			return nil, fmt.Sprintf("its commit ack %s carries no manifest", subject)
		}
		return ack.Manifest, ""
	}
}

// verify checks one member manifest: the member's own record of it (its
// key in schema 1, its commit ack in schema 2) agrees, and the object it
// names has its size and digest.
func verify(ctx context.Context, records *stores, mm events.MemberManifest, own func() (*events.MemberManifest, string)) MemberCheck {
	mc := MemberCheck{Member: mm.Member, Bucket: mm.Bucket, Object: mm.Object, Size: mm.Size, SHA256: mm.SHA256, Count: mm.Count}
	if mc.Bucket == "" {
		mc.Bucket = jetstream.BucketRecords
	}
	stored, problem := own()
	switch {
	case problem != "":
		mc.Problem = problem
		return mc
	case stored != nil && (stored.SHA256 != mm.SHA256 || stored.Object != mm.Object || stored.Bucket != mm.Bucket || stored.Size != mm.Size):
		mc.Problem = "its own record names other records"
		return mc
	}
	store, err := records.get(ctx, mm.Bucket)
	if err != nil {
		mc.Problem = err.Error()
		return mc
	}
	obj, err := store.Get(ctx, mm.Object)
	if err != nil {
		mc.Problem = fmt.Sprintf("object %s: %v", mm.Object, err)
		return mc
	}
	defer func() { _ = obj.Close() }()
	h := sha256.New()
	n, err := io.Copy(h, obj)
	switch {
	case err != nil:
		mc.Problem = fmt.Sprintf("object %s: read: %v", mm.Object, err)
	case n != mm.Size:
		mc.Problem = fmt.Sprintf("object %s is %d bytes, the manifest says %d", mm.Object, n, mm.Size)
	case hex.EncodeToString(h.Sum(nil)) != mm.SHA256:
		mc.Problem = fmt.Sprintf("object %s has sha256 %s, the manifest says %s", mm.Object, hex.EncodeToString(h.Sum(nil)), mm.SHA256)
	default:
		mc.OK = true
	}
	return mc
}

func (r *Report) kept(id string) bool {
	for _, c := range r.Checkpoints {
		if c.ID == id && !c.Aborted {
			return true
		}
	}
	return false
}

// readMembers adds the run's live heartbeats in kv (nil: none) to the
// report: those of the kinds whose bucket it is (jetstream.HeartbeatBucket;
// a sandbox daemon's key in sp_members is an earlier build's), stored less
// than the bucket's TTL ago. A key that expires leaves no marker, and the
// server may hold it a moment past its TTL: its store time says
// (jetstream.HeartbeatExpired), as for the bridge.
func (r *Report) readMembers(ctx context.Context, js natsjs.JetStream, kv natsjs.KeyValue) error {
	if kv == nil {
		return nil
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return fmt.Errorf("inspect: read %s: %w", kv.Bucket(), err)
	}
	ttl, now := jetstream.HeartbeatTTL(st), time.Now()
	entries, err := jetstream.KVEntries(ctx, js, kv, events.MemberKeyFilter(r.Run))
	if err != nil {
		return fmt.Errorf("inspect: read %s: %w", kv.Bucket(), err)
	}
	for k, e := range entries {
		if jetstream.HeartbeatExpired(e.Stored, ttl, now) {
			continue
		}
		var info events.MemberInfo
		if err := json.Unmarshal(e.Value, &info); err != nil || info.Validate() != nil || events.MemberKey(info.Run, info.Member) != k {
			r.problem("heartbeat %s does not decode or names another key", k)
			continue
		}
		if jetstream.HeartbeatBucket(info.Member.Kind()) != kv.Bucket() {
			continue
		}
		r.Members = append(r.Members, info)
	}
	return nil
}

func (r *Report) readSnapshots(ctx context.Context, js natsjs.JetStream, kv natsjs.KeyValue) error {
	vals, err := jetstream.KVValues(ctx, js, kv, ">")
	if err != nil {
		return fmt.Errorf("inspect: read %s: %w", jetstream.BucketSnapshots, err)
	}
	for k, v := range vals {
		e, err := ownerapi.DecodeIndexEntry(v, k)
		if err != nil {
			r.problem("%v", err)
			continue
		}
		if e.Run != r.Run {
			continue
		}
		s := Snapshot{ID: e.Snapshot, Checkpoints: e.Checkpoints}
		for _, c := range e.Checkpoints {
			if !r.kept(c) {
				s.Unkept = append(s.Unkept, c)
			}
		}
		r.Snapshots = append(r.Snapshots, s)
	}
	sort.Slice(r.Snapshots, func(i, j int) bool { return r.Snapshots[i].ID < r.Snapshots[j].ID })
	return nil
}
