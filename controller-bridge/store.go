package bridge

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/controller-bridge/internal/failpoint"
	"github.com/stillpoint/stillpoint/controller-bridge/machine"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
)

// The bridge's reads and writes of sp_manifests, the heartbeats,
// sp_checkpoints and sp_records: what the machine asks for, carried out.

// latest reads LATEST and its revision; nil if there is none.
func (b *Bridge) latest(ctx context.Context) (*events.Latest, uint64, error) {
	e, err := b.cfg.Bus.Manifests.Get(ctx, events.LatestKey(b.cfg.Run))
	if errors.Is(err, natsjs.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("bridge: read LATEST: %w", err)
	}
	var l events.Latest
	if err := json.Unmarshal(e.Value(), &l); err != nil {
		return nil, 0, fmt.Errorf("bridge: LATEST does not decode: %w", err)
	}
	return &l, e.Revision(), nil
}

// moveLatest points LATEST at l by compare-and-set, unless it already
// does or names a checkpoint committed later.
func (b *Bridge) moveLatest(ctx context.Context, l events.Latest) error {
	key := events.LatestKey(b.cfg.Run)
	v, _ := json.Marshal(l)
	// The LATEST this bridge wrote last is most likely still the one
	// there: update it by its revision, a round trip fewer than a read
	// first; anything else reads and goes on as before.
	if last := b.lastLatest; last != nil && last.CheckpointID != l.CheckpointID && last.CommitSeq < l.CommitSeq {
		if rev, err := b.cfg.Bus.Manifests.Update(ctx, key, v, b.lastLatestRev); err == nil {
			b.lastLatest, b.lastLatestRev = &l, rev
			return nil
		}
	}
	for range 5 {
		cur, rev, err := b.latest(ctx)
		if err != nil {
			return err
		}
		if cur != nil && (cur.CheckpointID == l.CheckpointID || cur.CommitSeq > l.CommitSeq) {
			// Already there, or a later checkpoint is: a slow bridge
			// finishing an older one never moves LATEST back.
			return nil
		}
		var wrote uint64
		if cur == nil {
			wrote, err = b.cfg.Bus.Manifests.Create(ctx, key, v)
		} else {
			wrote, err = b.cfg.Bus.Manifests.Update(ctx, key, v, rev)
		}
		if err == nil {
			b.lastLatest, b.lastLatestRev = &l, wrote
			return nil
		}
		b.log.Debug().Err(err).Msg("LATEST moved under us; reading it again")
	}
	return fmt.Errorf("bridge: LATEST of run %s keeps moving; giving up", b.cfg.Run)
}

// manifest reads the checkpoint key of id; nil if absent.
func (b *Bridge) manifest(ctx context.Context, id string) (*events.CheckpointManifest, uint64, error) {
	e, err := b.cfg.Bus.Manifests.Get(ctx, events.ManifestKey(b.cfg.Run, id))
	if errors.Is(err, natsjs.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("bridge: read manifest %s: %w", id, err)
	}
	m, err := decodeManifest(id, e.Value())
	if err != nil {
		return nil, 0, err
	}
	// Schema 2: the members are in the member list, verified by its digest.
	if err := m.LoadMembers(func(o string) ([]byte, error) { return b.cfg.Bus.Checkpoints.GetBytes(ctx, o) }); err != nil {
		return nil, 0, fmt.Errorf("bridge: manifest %s: %w", id, err)
	}
	return &m, e.Revision(), nil
}

// previous returns LATEST's manifest, its members loaded: what a new
// checkpoint carries forward from (nil before the first commit). A LATEST
// a failed release marked is restored no more: nothing is carried from it.
func (b *Bridge) previous(ctx context.Context) (*events.CheckpointManifest, error) {
	l, _, err := b.latest(ctx)
	if err != nil || l == nil {
		return nil, err
	}
	m, _, err := b.manifest(ctx, l.CheckpointID)
	if err != nil {
		return nil, err
	}
	if m == nil || m.Aborted || m.Released != nil {
		return nil, nil
	}
	return m, nil
}

// carrySources reads the manifests man carries episodes from, by id (nil
// for one that is gone).
func (b *Bridge) carrySources(ctx context.Context, man *events.CheckpointManifest) (map[string]*events.CheckpointManifest, error) {
	out := map[string]*events.CheckpointManifest{}
	for _, c := range man.Carried {
		if _, ok := out[c.From]; ok {
			continue
		}
		src, _, err := b.manifest(ctx, c.From)
		if err != nil {
			return nil, err
		}
		out[c.From] = src
	}
	return out, nil
}

// streamMaxAge returns the stream's MaxAge when age is the only limit on
// what it keeps, 0 when messages or bytes are limited too (old messages
// may go before their age).
func (b *Bridge) streamMaxAge(ctx context.Context) (time.Duration, error) {
	info, err := b.cfg.Bus.Stream.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("bridge: stream info: %w", err)
	}
	c := info.Config
	if c.MaxMsgs > 0 || c.MaxBytes > 0 || c.MaxMsgsPerSubject > 0 {
		return 0, nil
	}
	return c.MaxAge, nil
}

// writeMemberList puts a checkpoint's member list. Its name is its
// digest, so a bridge that writes it again after a crash writes the same
// bytes.
func (b *Bridge) writeMemberList(ctx context.Context, name string, data []byte) error {
	if _, err := b.cfg.Bus.Checkpoints.PutBytes(ctx, name, data); err != nil {
		return fmt.Errorf("bridge: write member list %s: %w", name, err)
	}
	return nil
}

// createManifest creates the checkpoint key once. If the key exists it
// returns what is there and created=false.
func (b *Bridge) createManifest(ctx context.Context, m events.CheckpointManifest) (have *events.CheckpointManifest, created bool, err error) {
	v, err := json.Marshal(m.Stored())
	if err != nil {
		return nil, false, err
	}
	_, err = b.cfg.Bus.Manifests.Create(ctx, events.ManifestKey(b.cfg.Run, m.CheckpointID), v)
	if errors.Is(err, natsjs.ErrKeyExists) {
		have, _, err := b.manifest(ctx, m.CheckpointID)
		if err != nil {
			return nil, false, err
		}
		if have == nil {
			return nil, false, fmt.Errorf("bridge: manifest %s exists and vanished", m.CheckpointID)
		}
		return have, false, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("bridge: create manifest %s: %w", m.CheckpointID, err)
	}
	return &m, true, nil
}

// decodeManifest decodes and validates the stored manifest of checkpoint
// id (in schema 2 without its members: LoadMembers adds them).
func decodeManifest(id string, v []byte) (events.CheckpointManifest, error) {
	var m events.CheckpointManifest
	if err := json.Unmarshal(v, &m); err != nil {
		return m, fmt.Errorf("bridge: manifest %s does not decode: %w", id, err)
	}
	if err := m.Validate(); err != nil {
		return m, fmt.Errorf("bridge: manifest %s: %w", id, err)
	}
	return m, nil
}

// checkpoints lists every checkpoint key of the run (committed and
// aborted), oldest first.
func (b *Bridge) checkpoints(ctx context.Context) ([]events.CheckpointManifest, error) {
	all, _, err := b.listCheckpoints(ctx, "")
	return all, err
}

// listCheckpoints lists every checkpoint key of the run, oldest first, and
// the checkpoints whose key release op purged already (its purge marker
// names it: events.HeaderReleasedBy), for a bridge finishing a release its
// predecessor died in; none when op is "".
func (b *Bridge) listCheckpoints(ctx context.Context, op string) ([]events.CheckpointManifest, []string, error) {
	// Read from the stream's leader (jetstream.KVLeaderLast): a direct
	// get or a consumer may be served by a replica that has not applied
	// the last writes or, after its node came back, is still catching up;
	// a release deleting what such a listing held would delete a
	// checkpoint already gone and leave the newest one and its records.
	last, err := jetstream.KVLeaderLast(ctx, b.cfg.JS, b.cfg.Bus.Manifests.Bucket(), b.cfg.Run+".*")
	if err != nil {
		return nil, nil, fmt.Errorf("bridge: list manifests: %w", err)
	}
	var (
		out    []events.CheckpointManifest
		purged []string
	)
	for k, msg := range last {
		id := strings.TrimPrefix(k, b.cfg.Run+".")
		if id == "LATEST" || id == "HEAD" { // the run's own keys (events.LatestKey, HeadKey)
			continue
		}
		if jetstream.KVRemoved(msg.Header) {
			if op != "" && msg.Header.Get(events.HeaderReleasedBy) == op {
				purged = append(purged, id)
			}
			continue
		}
		m, err := decodeManifest(id, msg.Data)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	slices.Sort(purged)
	return out, purged, nil
}

// purgeReleased purges checkpoint key id for release op, with a marker
// that names the release (events.HeaderReleasedBy), as KeyValue.Purge does
// otherwise: the marker rolls the key's messages up, and reads as purged.
func (b *Bridge) purgeReleased(ctx context.Context, id, op string) error {
	msg := nats.NewMsg("$KV." + b.cfg.Bus.Manifests.Bucket() + "." + events.ManifestKey(b.cfg.Run, id))
	msg.Header.Set("KV-Operation", "PURGE")
	msg.Header.Set(natsjs.MsgRollup, natsjs.MsgRollupSubject)
	msg.Header.Set(events.HeaderReleasedBy, op)
	if _, err := b.cfg.JS.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("bridge: delete manifest %s: %w", id, err)
	}
	return nil
}

// markReleased sets mark on every committed checkpoint not in keep,
// merged with the mark an earlier failed release left: a checkpoint whose
// external state a member may have deleted is restored no more. Each is
// a compare-and-set on the manifest's revision.
func (b *Bridge) markReleased(ctx context.Context, keep []string, mark events.ReleaseMark) error {
	all, err := b.checkpoints(ctx)
	if err != nil {
		return err
	}
	for _, c := range all {
		if c.Aborted || slices.Contains(keep, c.CheckpointID) {
			continue
		}
		if err := b.markOne(ctx, c.CheckpointID, mark); err != nil {
			return err
		}
		b.log.Warn().Str("checkpoint", c.CheckpointID).Str("release", mark.Op).Msg("marked partly released: it restores no more")
	}
	return nil
}

// markOne sets mark on checkpoint id, merged with the mark it has. It
// reads the key alone, not the member list: a release the bridge died in
// may have deleted that list already, and marking must not need it.
func (b *Bridge) markOne(ctx context.Context, id string, mark events.ReleaseMark) error {
	for range 8 {
		e, err := b.cfg.Bus.Manifests.Get(ctx, events.ManifestKey(b.cfg.Run, id))
		if errors.Is(err, natsjs.ErrKeyNotFound) {
			return nil // gone meanwhile: nothing to mark
		}
		if err != nil {
			return fmt.Errorf("bridge: read manifest %s: %w", id, err)
		}
		rev := e.Revision()
		m, err := decodeManifest(id, e.Value())
		if err != nil {
			return err
		}
		next := mergeMark(m.Released, mark)
		m.Released = &next
		v, err := json.Marshal(m.Stored())
		if err != nil {
			return err
		}
		_, err = b.cfg.Bus.Manifests.Update(ctx, events.ManifestKey(b.cfg.Run, id), v, rev)
		if err == nil {
			failpoint.Hit("bridge/after-release-mark")
			return nil
		}
		if !errors.Is(err, natsjs.ErrKeyExists) && !jetstream.IsWrongLastSequence(err) {
			return fmt.Errorf("bridge: mark %s released: %w", id, err)
		}
	}
	return fmt.Errorf("bridge: mark %s released: too many concurrent updates", id)
}

// mergeMark adds what mark says to an earlier mark: the newest release,
// every deletion, every member that failed.
func mergeMark(old *events.ReleaseMark, mark events.ReleaseMark) events.ReleaseMark {
	if old == nil {
		return mark
	}
	out := events.ReleaseMark{Op: mark.Op, Deleted: map[events.Member][]string{}}
	for _, d := range []map[events.Member][]string{old.Deleted, mark.Deleted} {
		for m, ids := range d {
			for _, id := range ids {
				if !slices.Contains(out.Deleted[m], id) {
					out.Deleted[m] = append(out.Deleted[m], id)
				}
			}
		}
	}
	if len(out.Deleted) == 0 {
		out.Deleted = nil
	}
	out.Failed = slices.Clone(old.Failed)
	for _, e := range mark.Failed {
		if !slices.ContainsFunc(out.Failed, func(f events.MemberError) bool { return f.Member == e.Member }) {
			out.Failed = append(out.Failed, e)
		}
	}
	return out
}

// deleteCheckpoints deletes what a release does not keep, then LATEST
// unless it names a kept checkpoint. Each committed checkpoint is marked
// released first (mark): its members deleted their side already, so one
// the bridge dies deleting must read as restorable no more, not as a
// checkpoint whose records are missing.
func (b *Bridge) deleteCheckpoints(ctx context.Context, del []machine.Deletion, keep []string, mark events.ReleaseMark) error {
	for _, d := range del {
		if !d.KeepMarker {
			if err := b.markOne(ctx, d.CheckpointID, mark); err != nil {
				return err
			}
		}
		if err := b.deleteCheckpoint(ctx, d, mark.Op); err != nil {
			return err
		}
	}
	l, _, err := b.latest(ctx)
	if err != nil || l == nil {
		return err
	}
	for _, k := range keep {
		if k == l.CheckpointID {
			return nil
		}
	}
	if err := b.cfg.Bus.Manifests.Purge(ctx, events.LatestKey(b.cfg.Run)); err != nil {
		return fmt.Errorf("bridge: delete LATEST: %w", err)
	}
	failpoint.Hit("bridge/after-release-latest")
	return nil
}

// deleteTries is how many times deleteRecords deletes a listed object that
// the delete says is not there.
const deleteTries = 10

// deleteRecords deletes records object name of store bucket, which the
// leader's listing just showed. The delete reads the object's info first
// with a direct get, which any replica may answer: one still catching up
// after its node came back says "not found" for an object that is there,
// and the delete does nothing (a final release would leave records). So
// "not found" is believed only once the object's meta message, read from
// the stream's leader, says so too, and the delete is tried again until
// then.
func (b *Bridge) deleteRecords(ctx context.Context, store natsjs.ObjectStore, bucket, name string) error {
	try := 0
	return poll.Until(ctx, poll.Every(500*time.Millisecond), func() (bool, error) {
		try++
		err := store.Delete(ctx, name)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, natsjs.ErrObjectNotFound) {
			return false, fmt.Errorf("bridge: delete records %s/%s: %w", bucket, name, err)
		}
		there, lerr := leaderObjectLive(ctx, b.cfg.Conn, bucket, name)
		switch {
		case lerr != nil:
			return false, fmt.Errorf("bridge: delete records %s/%s: %w", bucket, name, lerr)
		case !there:
			return true, nil
		case try == deleteTries:
			return false, fmt.Errorf("bridge: delete records %s/%s: there, yet %w %d times", bucket, name, err, try)
		}
		b.log.Debug().Str("object", name).Int("try", try).Msg("records there but their delete found nothing; trying again")
		return false, nil
	})
}

// leaderObjects lists the objects of object store bucket whose names start
// with prefix and are not deleted, as the stream's leader holds them: the
// subjects of their meta messages from the stream's info (which the leader
// answers), each message read from the leader. A listing through a
// consumer (ObjectStore.List) can be served by a replica still catching up
// after its node came back, and miss objects written while it was away,
// so that a release would delete a checkpoint and leave its records.
func leaderObjects(ctx context.Context, js natsjs.JetStream, nc *nats.Conn, bucket, prefix string) ([]string, error) {
	s, err := js.Stream(ctx, "OBJ_"+bucket)
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", bucket, err)
	}
	metaPrefix := objectMetaPrefix(bucket)
	info, err := s.Info(ctx, natsjs.WithSubjectFilter(metaPrefix+">"))
	if err != nil {
		return nil, fmt.Errorf("object store %s: %w", bucket, err)
	}
	var names []string
	for subj := range info.State.Subjects {
		raw, err := base64.URLEncoding.DecodeString(strings.TrimPrefix(subj, metaPrefix))
		if err != nil || !strings.HasPrefix(string(raw), prefix) {
			continue
		}
		live, err := leaderObjectLive(ctx, nc, bucket, string(raw))
		if err != nil {
			return nil, err
		}
		if live {
			names = append(names, string(raw))
		}
	}
	slices.Sort(names)
	return names, nil
}

// objectMetaPrefix is the prefix of the subjects of bucket's object meta
// messages, each ending in its object's name, base64url-encoded.
func objectMetaPrefix(bucket string) string { return "$O." + bucket + ".M." }

// leaderObjectLive tells whether object name of bucket is there and not
// deleted, from its meta message read from the stream's leader
// (jetstream.LeaderLastMsg).
func leaderObjectLive(ctx context.Context, nc *nats.Conn, bucket, name string) (bool, error) {
	subj := objectMetaPrefix(bucket) + base64.URLEncoding.EncodeToString([]byte(name))
	raw, err := jetstream.LeaderLastMsg(ctx, nc, "OBJ_"+bucket, subj)
	if errors.Is(err, natsjs.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", name, err)
	}
	var info natsjs.ObjectInfo
	if err := json.Unmarshal(raw.Data, &info); err != nil {
		return false, fmt.Errorf("read %s from the leader: %w", name, err)
	}
	return !info.Deleted, nil
}

// deleteCheckpoint deletes a checkpoint's records and member list, the
// member manifest keys of a schema-1 checkpoint, and its key (purged by
// release op, which its marker names), in that order, so that a crash in
// between leaves a manifest that names missing records rather than
// records nothing names. With KeepMarker the key stays: only what its
// members wrote goes. A failpoint follows each write.
func (b *Bridge) deleteCheckpoint(ctx context.Context, d machine.Deletion, op string) error {
	lister, err := b.cfg.Bus.Manifests.ListKeysFiltered(ctx, events.ManifestKey(b.cfg.Run, d.CheckpointID)+".>")
	if err != nil {
		return fmt.Errorf("bridge: list member manifests: %w", err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	// The shared records store, and the stores of the run's members with
	// credentials of their own (events.RecordsBucket).
	own, err := jetstream.RecordStores(ctx, b.cfg.JS, events.RecordsBucketPrefix(b.cfg.Run))
	if err != nil {
		return fmt.Errorf("bridge: %w", err)
	}
	prefix := b.cfg.Run + "/" + d.CheckpointID + "/"
	// The bridge's own store holds the checkpoint's member list.
	for i, store := range append([]natsjs.ObjectStore{b.cfg.Bus.Records, b.cfg.Bus.Checkpoints}, own...) {
		point := "bridge/after-release-records"
		if i == 1 {
			point = "bridge/after-release-member-list"
		}
		st, err := store.Status(ctx)
		if err != nil {
			return fmt.Errorf("bridge: list records: %w", err)
		}
		bucket := st.Bucket()
		names, err := leaderObjects(ctx, b.cfg.JS, b.cfg.Conn, bucket, prefix)
		if err != nil {
			return fmt.Errorf("bridge: list records: %w", err)
		}
		for _, name := range names {
			if err := b.deleteRecords(ctx, store, bucket, name); err != nil {
				return err
			}
			failpoint.Hit(point)
		}
	}
	failpoint.Hit("bridge/mid-release")
	for _, k := range keys {
		if err := b.cfg.Bus.Manifests.Purge(ctx, k); err != nil {
			return fmt.Errorf("bridge: delete %s: %w", k, err)
		}
	}
	if d.KeepMarker {
		return nil
	}
	if err := b.purgeReleased(ctx, d.CheckpointID, op); err != nil {
		return err
	}
	failpoint.Hit("bridge/after-release-manifest")
	return nil
}

// liveMembers reads the run's heartbeats, from the bridge's view of them
// once it has read them as far as they were when asked. fresh selects
// members that have served no phase; otherwise it returns the members of
// epoch, plus fresh ones (a member that joined since the last phase serves
// the next).
func (b *Bridge) liveMembers(ctx context.Context, epoch uint64, fresh bool) ([]events.Member, []events.MemberInfo, error) {
	v, err := b.view(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := v.sync(ctx, b); err != nil {
		return nil, nil, err
	}
	var (
		members []events.Member
		infos   []events.MemberInfo
	)
	for _, info := range v.snapshot(b.cfg.Now()) {
		if info.Member.Kind() == events.KindBridge {
			continue
		}
		infos = append(infos, info)
		switch {
		case fresh && !info.Served:
		case !fresh && (!info.Served || info.Epoch == epoch):
		default:
			continue
		}
		members = append(members, info.Member)
	}
	sort.Slice(members, func(i, j int) bool { return members[i] < members[j] })
	sort.Slice(infos, func(i, j int) bool { return infos[i].Member < infos[j].Member })
	return members, infos, nil
}
