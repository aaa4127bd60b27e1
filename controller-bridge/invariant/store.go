package invariant

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/controller-bridge/collect"
	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/participants/member"
)

// Manifests verifies each checkpoint's member manifests as it commits
// (invariant 1): a later release may delete them before the run ends. Its
// zero value is ready; it is safe for concurrent use.
type Manifests struct {
	mu        sync.Mutex
	verified  map[string]bool
	manifests int
	bad       []string
	// gone are the checkpoints whose manifest was not there when read:
	// deleted by a release that came first (Check tells from the stream),
	// or never written.
	gone []string
	// marked are the checkpoints a release marked (events.ReleaseMark)
	// before they were verified: their members deleted their side, and
	// the bridge may have died deleting its own; none restores.
	marked []string
	// read are the manifests verified, members loaded: what invariant 9
	// compares, each committed checkpoint with the one before.
	read map[string]events.CheckpointManifest
}

// OnCommit reads back the checkpoint manifest of run's checkpoint id (and,
// in schema 2, its member list, verified by its digest) and every member
// manifest and records it names, verifying size, sha256 and count. The
// collector's OnCommit calls it. A read that finds something missing or
// not verifying while a release that does not keep id runs, or after one
// did, is no verdict: it waits for that release to end and reads again
// (acrossRelease), deciding from what the release left.
func (v *Manifests) OnCommit(ctx context.Context, bus *jetstream.Bus, run, id string) {
	got := verify(ctx, bus, run, id)
	if len(got.bad) > 0 && acrossRelease(ctx, bus, run, id, got.commitSeq) {
		got = afterRelease(ctx, bus, run, id)
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.verified == nil {
		v.verified = map[string]bool{}
	}
	v.verified[id] = true
	switch {
	case got.gone:
		v.gone = append(v.gone, id)
	case got.marked:
		v.marked = append(v.marked, id)
	default:
		if got.loaded {
			if v.read == nil {
				v.read = map[string]events.CheckpointManifest{}
			}
			v.read[id] = got.m
		}
		v.bad = append(v.bad, got.bad...)
		v.manifests += got.n
	}
}

// verified is what one verification of a checkpoint found.
type verified struct {
	gone, marked bool // its key not there, or marked released
	m            events.CheckpointManifest
	loaded       bool // m was read, its members loaded
	commitSeq    uint64
	n            int      // member manifests verified
	bad          []string // what does not verify
}

// verify reads and verifies checkpoint id once, as OnCommit says.
func verify(ctx context.Context, bus *jetstream.Bus, run, id string) verified {
	m, err := readManifest(ctx, bus, run, id)
	out := verified{m: m, commitSeq: m.CommitSeq}
	switch {
	case errors.Is(err, natsjs.ErrKeyNotFound):
		out.gone = true
		return out
	case err != nil:
		out.bad = append(out.bad, fmt.Sprintf("%s: manifest: %v", id, err))
		return out
	case m.Released != nil:
		out.marked = true
		return out
	}
	out.loaded = true
	for _, mm := range m.Members {
		if err := readRecords(ctx, bus, m, mm); err != nil {
			out.bad = append(out.bad, fmt.Sprintf("%s/%s: %v", id, mm.Member, err))
			continue
		}
		out.n++
	}
	// What it carries must be restorable too: each source committed, not
	// released, and holding every carried episode in the records of each
	// member the carry names (read and verified above, when the source
	// was verified at its own commit).
	for _, cr := range m.Carried {
		src, err := readManifest(ctx, bus, run, cr.From)
		if err != nil {
			out.bad = append(out.bad, fmt.Sprintf("%s: carries %d episodes from %s: %v", id, len(cr.Episodes), cr.From, err))
			continue
		}
		if src.Released != nil {
			out.bad = append(out.bad, fmt.Sprintf("%s: carries %d episodes from %s, which a release marked", id, len(cr.Episodes), cr.From))
			continue
		}
		for _, mem := range cr.Members {
			i := slices.IndexFunc(src.Members, func(mm events.MemberManifest) bool { return mm.Member == mem })
			if i < 0 {
				out.bad = append(out.bad, fmt.Sprintf("%s: carries from %s records of %s, which has none there", id, cr.From, mem))
				continue
			}
			for _, k := range cr.Episodes {
				if !slices.Contains(src.Members[i].Episodes, k) {
					out.bad = append(out.bad, fmt.Sprintf("%s: carries %s from %s, where %s does not hold it", id, k, cr.From, mem))
				}
			}
		}
	}
	if len(out.bad) == 0 {
		return out
	}
	// A release that began after the manifest was read marks it before
	// it deletes a thing: records it deleted under the read are no
	// violation, and the manifest read again says so.
	again, err := readManifest(ctx, bus, run, id)
	switch {
	case errors.Is(err, natsjs.ErrKeyNotFound):
		return verified{gone: true, commitSeq: m.CommitSeq}
	case err == nil && again.Released != nil:
		return verified{marked: true, commitSeq: m.CommitSeq}
	}
	return out
}

// readManifest reads the checkpoint manifest of run's checkpoint id (one
// marked released without its members), each try bounded and tried again as readRecords does: a read sent to a node
// killed under it is never answered, and without a bound it held the
// collector's commit, and so the round, until the round limit.
func readManifest(ctx context.Context, bus *jetstream.Bus, run, id string) (events.CheckpointManifest, error) {
	var m events.CheckpointManifest
	err := readAgain(ctx, func(rctx context.Context) error {
		e, err := bus.Manifests.Get(rctx, events.ManifestKey(run, id))
		if err != nil {
			return err
		}
		m = events.CheckpointManifest{}
		if err := json.Unmarshal(e.Value(), &m); err != nil {
			return fmt.Errorf("%w: %v", errUnreadable, err)
		}
		if err := m.Validate(); err != nil {
			return fmt.Errorf("%w: %w", errUnreadable, err)
		}
		if m.Released != nil {
			// Restores no more: the release that marked it may have
			// deleted its member list already.
			return nil
		}
		// Schema 2: the members are in the member list, whose bytes must
		// be the ones its digest names.
		err = m.LoadMembers(func(o string) ([]byte, error) { return bus.Checkpoints.GetBytes(rctx, o) })
		if errors.Is(err, events.ErrMismatch) || errors.Is(err, events.ErrMalformed) || errors.Is(err, natsjs.ErrObjectNotFound) {
			return fmt.Errorf("%w: %w", errUnreadable, err)
		}
		return err
	}, func(err error) bool { return errors.Is(err, natsjs.ErrKeyNotFound) || errors.Is(err, errUnreadable) })
	return m, err
}

// readFor is how long a read the bus fails is tried again (a node of a
// cluster lost, its leaders being elected; a single server killed and
// started again on its store, which takes seconds under load): only what
// was read and does not verify is a violation.
const readFor = time.Minute

// readTimeout bounds one try of a read.
const readTimeout = 10 * time.Second

// readAgain runs read, each try bounded by readTimeout, a second after the
// last while it fails, for readFor in all, until it succeeds or fails for
// good (final). It returns the last error.
func readAgain(ctx context.Context, read func(context.Context) error, final func(error) bool) error {
	deadline := time.Now().Add(readFor)
	for {
		rctx, cancel := context.WithTimeout(ctx, readTimeout)
		err := read(rctx)
		cancel()
		if err == nil || final(err) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(time.Second):
		}
	}
}

// errUnreadable is a checkpoint manifest or member list that was read and
// does not verify: no read again makes it right.
var errUnreadable = errors.New("invariant: does not verify")

// readRecords reads and verifies the records of mm, a member manifest of
// checkpoint c, again while the read itself fails (readAgain). The member
// finds its manifest as a restore does (its commit ack in schema 2, its
// key in schema 1), and it must be the one c lists. Each try is bounded:
// the verification runs in the collector's commit, and a read stuck on a
// lost node would hold the run.
func readRecords(ctx context.Context, bus *jetstream.Bus, c events.CheckpointManifest, mm events.MemberManifest) error {
	var seq uint64
	if c.Schema != events.CheckpointSchemaInline {
		seq = c.CommitSeq
	}
	return readAgain(ctx, func(rctx context.Context) error {
		got, _, err := member.ReadRecordsAt(rctx, bus, c.Run, c.CheckpointID, mm.Member, seq, nil)
		if err != nil {
			return err
		}
		if got.SHA256 != mm.SHA256 || got.Count != mm.Count || got.Size != mm.Size || got.Object != mm.Object {
			return fmt.Errorf("%w: the member's own manifest (%s, %d records) is not the one the checkpoint lists (%s, %d records)",
				member.ErrCorruptRecords, got.Object, got.Count, mm.Object, mm.Count)
		}
		return nil
	}, func(err error) bool {
		return errors.Is(err, member.ErrCorruptRecords) || errors.Is(err, member.ErrNoManifest)
	})
}

// result returns what failed and how many member manifests verified.
func (v *Manifests) result() ([]string, int) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.bad...), v.manifests
}

// missing returns the checkpoints whose manifest was not there when read.
func (v *Manifests) missing() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.gone...)
}

// released returns the checkpoints a release marked before they were
// verified.
func (v *Manifests) released() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.marked...)
}

// manifest returns checkpoint id's manifest as verified at its commit.
func (v *Manifests) manifest(id string) (events.CheckpointManifest, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	m, ok := v.read[id]
	return m, ok
}

// seen reports whether checkpoint id was verified.
func (v *Manifests) seen(id string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.verified[id]
}

// ReadResults reads a collector's output: how many lines, the rollouts
// with more than one, those of ids without one, and those graded wrongly.
func ReadResults(path string, ids []string, graded func(collect.Result) bool) (lines int, dups, missing, ungraded []string) {
	f, err := os.Open(path)
	if err != nil {
		return 0, nil, []string{err.Error()}, nil
	}
	defer f.Close()
	seen := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var r collect.Result
		if json.Unmarshal(sc.Bytes(), &r) != nil {
			continue
		}
		lines++
		seen[r.RolloutID]++
		if seen[r.RolloutID] == 2 {
			dups = append(dups, r.RolloutID)
		}
		if !graded(r) {
			ungraded = append(ungraded, r.RolloutID)
		}
	}
	for _, id := range ids {
		if seen[id] == 0 {
			missing = append(missing, id)
		}
	}
	return lines, dups, missing, ungraded
}

// countSnapshots counts the snapshot index entries of run.
func countSnapshots(ctx context.Context, kv natsjs.KeyValue, run string) (int, error) {
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return 0, fmt.Errorf("list the snapshot index: %w", err)
	}
	n := 0
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if errors.Is(err, natsjs.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return n, fmt.Errorf("read the snapshot index: %w", err)
		}
		var entry struct {
			Run string `json:"run"`
		}
		if json.Unmarshal(e.Value(), &entry) == nil && entry.Run == run {
			n++
		}
	}
	return n, nil
}

// recordObjects lists the records objects of run left in the shared store
// and in the stores of the run's members with credentials of their own,
// each as bucket/name, so that a leftover names its checkpoint and member.
func recordObjects(ctx context.Context, js natsjs.JetStream, shared natsjs.ObjectStore, run string) ([]string, error) {
	own, err := jetstream.RecordStores(ctx, js, events.RecordsBucketPrefix(run))
	if err != nil {
		return nil, err
	}
	var out []string
	for _, store := range append([]natsjs.ObjectStore{shared}, own...) {
		infos, err := store.List(ctx)
		if errors.Is(err, natsjs.ErrNoObjectsFound) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list the records: %w", err)
		}
		for _, i := range infos {
			if strings.HasPrefix(i.Name, run+"/") && !i.Deleted {
				out = append(out, i.Bucket+"/"+i.Name)
			}
		}
	}
	return out, nil
}
