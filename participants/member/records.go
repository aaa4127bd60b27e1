package member

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"iter"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/internal/poll"
	"github.com/stillpoint/stillpoint/jetstream"
)

var (
	// ErrCorruptRecords is returned (wrapped, naming every difference) by
	// ReadRecords when a member's records do not match their manifest: size,
	// sha256, count, a line that is not a record, a manifest that names
	// another run, checkpoint, member or object, or an object that is gone.
	ErrCorruptRecords = errors.New("member: corrupt records")

	// ErrNoManifest is returned by ReadRecords and FindManifest when the
	// member has no manifest in the checkpoint (it exported nothing there,
	// or was not in its commit).
	ErrNoManifest = errors.New("member: no member manifest")

	// ErrWriteStopped is returned by WriteRecords when ctx ended before a
	// record: the write stops there, nothing of it stays in the store.
	ErrWriteStopped = errors.New("member: records write stopped")

	// ErrManifestExists is returned by CreateManifest when the key already
	// holds a different manifest, and by CheckRecorded when the commit ack
	// recorded first holds another: another writer got there first.
	ErrManifestExists = errors.New("member: member manifest exists with other content")

	// ErrBadRecord is returned by WriteRecords for a record that cannot be
	// written: an empty or oversized key, or data that is not JSON.
	ErrBadRecord = errors.New("member: bad record")
)

// MaxRecordKey bounds a record's key.
const MaxRecordKey = 256

// encodeRecord returns the record as one JSON line.
func encodeRecord(i int, r events.Record) ([]byte, error) {
	if r.Key == "" || len(r.Key) > MaxRecordKey {
		return nil, fmt.Errorf("%w: record %d: key must be 1 to %d bytes", ErrBadRecord, i, MaxRecordKey)
	}
	b, err := json.Marshal(r) // compacts Data: one record, one line
	if err != nil {
		return nil, fmt.Errorf("%w: record %d (%s): %v", ErrBadRecord, i, r.Key, err)
	}
	return append(b, '\n'), nil
}

// episodesOf returns the sorted, unique capture keys among the records'
// keys; keys that are not episodes are left out.
func episodesOf(records []events.Record) []string {
	var out []string
	for _, r := range records {
		if _, err := events.ParseEpisode(r.Key); err == nil {
			out = append(out, r.Key)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// digest accumulates records as JSON lines: their sha256, size and count,
// one record at a time.
type digest struct {
	h    hash.Hash
	size int64
	n    int
}

func newDigest() *digest { return &digest{h: sha256.New()} }

// add encodes the next record, hashes it and returns its line.
func (d *digest) add(r events.Record) ([]byte, error) {
	line, err := encodeRecord(d.n, r)
	if err != nil {
		return nil, err
	}
	d.h.Write(line)
	d.size += int64(len(line))
	d.n++
	return line, nil
}

// manifest returns the manifest of the records added, which are records.
func (d *digest) manifest(run, checkpoint string, m events.Member, records []events.Record) (events.MemberManifest, error) {
	return manifestOf(run, checkpoint, m, records, d.h.Sum(nil), d.size)
}

// recordReader streams records as JSON lines, hashing as it goes, and
// checks the stop signal (ctx) before each record.
type recordReader struct {
	ctx     context.Context
	records []events.Record
	before  func(index int)
	buf     []byte
	d       *digest
	err     error
}

// Read implements io.Reader: it fills p with as many whole or partial
// records as fit, producing each record only when it is needed.
func (r *recordReader) Read(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if len(r.buf) == 0 {
			if r.err == nil {
				r.err = r.produce()
			}
			if r.err != nil {
				if n > 0 {
					return n, nil
				}
				return 0, r.err
			}
		}
		c := copy(p[n:], r.buf)
		r.buf = r.buf[c:]
		n += c
	}
	return n, nil
}

// produce encodes the next record into buf, or says why not.
func (r *recordReader) produce() error {
	next := r.d.n
	if next == len(r.records) {
		return io.EOF
	}
	if r.before != nil {
		r.before(next)
	}
	if err := r.ctx.Err(); err != nil {
		return fmt.Errorf("%w before record %d of %d: %w", ErrWriteStopped, next, len(r.records), err)
	}
	line, err := r.d.add(r.records[next])
	if err != nil {
		return err
	}
	r.buf = line
	return nil
}

// Digest returns the manifest records would get, without writing them.
func Digest(run, checkpoint string, m events.Member, records []events.Record) (events.MemberManifest, error) {
	d := newDigest()
	for _, r := range records {
		if _, err := d.add(r); err != nil {
			return events.MemberManifest{}, err
		}
	}
	return d.manifest(run, checkpoint, m, records)
}

// TakeExport takes the records of an export (Exporter) one at a time, as
// they come: each is checked and hashed as it arrives (ErrBadRecord), and
// the stop signal (ctx) is checked before each, so that a stopped export
// ends with ErrWriteStopped before its next record and keeps nothing. An
// error the iteration yields fails it. It returns the records and the
// manifest a write of them gets; nil records are an empty export.
func TakeExport(ctx context.Context, run, checkpoint string, m events.Member,
	records iter.Seq2[events.Record, error]) ([]events.Record, events.MemberManifest, error) {
	d := newDigest()
	var out []events.Record
	stopped := func() ([]events.Record, events.MemberManifest, error) {
		return nil, events.MemberManifest{}, fmt.Errorf("%w before record %d: %w", ErrWriteStopped, d.n, context.Cause(ctx))
	}
	if ctx.Err() != nil {
		return stopped()
	}
	if records != nil {
		for r, err := range records {
			if ctx.Err() != nil {
				return stopped()
			}
			if err != nil {
				return nil, events.MemberManifest{}, err
			}
			if _, err := d.add(r); err != nil {
				return nil, events.MemberManifest{}, err
			}
			out = append(out, r)
		}
	}
	man, err := d.manifest(run, checkpoint, m, out)
	if err != nil {
		return nil, events.MemberManifest{}, err
	}
	return slices.Clip(out), man, nil
}

// WriteRecords writes records as JSON lines (one events.Record per line)
// to events.RecordsObject (named by their digest) in store, streaming and
// hashing sha256 as it goes, and returns the manifest that describes the
// object (not yet created: see CreateManifest). ctx is the stop signal: it
// is checked before each record, and once it is done the write stops with
// ErrWriteStopped and its partial chunks are purged; a write that reached
// its end is not undone. No records write no object: the manifest alone
// describes an empty export.
func WriteRecords(ctx context.Context, store natsjs.ObjectStore, run, checkpoint string, m events.Member,
	records []events.Record) (events.MemberManifest, error) {
	return writeRecords(ctx, store, run, checkpoint, m, records, writeHooks{})
}

// writeHooks are what the tests see of a records write: before, when set,
// is called ahead of each record's stop check (to stop a write in the
// middle), noResponders after each write that found no responders.
type writeHooks struct {
	before       func(index int)
	noResponders func(try int)
}

// writeRecords is WriteRecords with the tests' hooks.
func writeRecords(ctx context.Context, store natsjs.ObjectStore, run, checkpoint string, m events.Member,
	records []events.Record, hooks writeHooks) (events.MemberManifest, error) {
	if err := ctx.Err(); err != nil {
		return events.MemberManifest{}, fmt.Errorf("%w before record 0 of %d: %w", ErrWriteStopped, len(records), err)
	}
	if len(records) == 0 {
		// Nothing to store: the manifest (count 0, size 0, the digest of no
		// bytes) says so, and readers fetch no object for it. A member with
		// nothing in flight pays one KV create per checkpoint, not an
		// object write.
		return Digest(run, checkpoint, m, nil)
	}
	// The object is named by its content, so the digest comes first; the
	// write hashes again as it streams and must agree.
	want, err := Digest(run, checkpoint, m, records)
	if err != nil {
		return events.MemberManifest{}, err
	}
	name := want.Object
	var (
		rr   *recordReader
		info *natsjs.ObjectInfo
	)
	// No server took the request: on a cluster, the interest of a store's
	// stream (its reads, its chunks' subjects) reaches the other servers a
	// moment after the stream has a leader, and again after a leader
	// moves. A failed Put purges the chunks it sent (most often none: its
	// first request, the object's info, is the one that finds no one), and
	// the object is named by its content: write it again.
	try := 0
	perr := poll.Until(ctx, poll.Backoff(noRespondersWait, noRespondersMax), func() (bool, error) {
		if try > 0 && ctx.Err() != nil {
			return false, nil // stopped while waiting to write again
		}
		try++
		rr = &recordReader{ctx: ctx, records: records, before: hooks.before, d: newDigest()}
		// The store call itself is not cancelled by the stop signal, so
		// that a stopped write purges what it sent; the reader stops it.
		info, err = store.Put(context.WithoutCancel(ctx), natsjs.ObjectMeta{
			Name:        name,
			Description: fmt.Sprintf("records of %s in checkpoint %s of run %s", m, checkpoint, run),
		}, rr)
		if !errors.Is(err, nats.ErrNoResponders) || try >= noRespondersTries {
			return true, nil
		}
		if hooks.noResponders != nil {
			hooks.noResponders(try)
		}
		return false, nil
	})
	if perr != nil {
		return events.MemberManifest{}, fmt.Errorf("%w: %s found no responders: %w", ErrWriteStopped, name, ctx.Err())
	}
	if err != nil {
		if errors.Is(err, ErrWriteStopped) || errors.Is(err, ErrBadRecord) {
			return events.MemberManifest{}, err
		}
		return events.MemberManifest{}, fmt.Errorf("member: write %s: %w", name, err)
	}
	sum := rr.d.h.Sum(nil)
	if info.Size != uint64(rr.d.size) || info.Digest != "SHA-256="+base64.URLEncoding.EncodeToString(sum) {
		return events.MemberManifest{}, fmt.Errorf("member: write %s: the store holds %d bytes, digest %s; wrote %d bytes, sha256 %x",
			name, info.Size, info.Digest, rr.d.size, sum)
	}
	if got := hex.EncodeToString(sum); got != want.SHA256 {
		return events.MemberManifest{}, fmt.Errorf("member: write %s: streamed sha256 %s, the records digest to %s", name, got, want.SHA256)
	}
	man, err := manifestOf(run, checkpoint, m, records, sum, rr.d.size)
	if err != nil {
		return events.MemberManifest{}, err
	}
	if info.Bucket != jetstream.BucketRecords {
		man.Bucket = info.Bucket
		if err := man.Validate(); err != nil {
			return events.MemberManifest{}, fmt.Errorf("member: manifest: %w", err)
		}
	}
	return man, nil
}

// ObjectStores opens an object store by its bucket name: what ReadRecords
// needs to find the store a manifest names. A natsjs.JetStream is one.
type ObjectStores interface {
	ObjectStore(ctx context.Context, bucket string) (natsjs.ObjectStore, error)
}

// OwnRecords opens member m's own records store in run,
// events.RecordsBucket, asking the run's bridge to make it if it does not
// exist yet (jetstream.OwnStore): a member with credentials of its own
// writes its records there, makes no stream itself, and may write no
// other member's store, nor the shared BucketRecords.
func OwnRecords(ctx context.Context, js natsjs.JetStream, run string, m events.Member) (natsjs.ObjectStore, error) {
	store, err := jetstream.OwnStore(ctx, js, run, m, jetstream.StoreRecords)
	if err != nil {
		return nil, fmt.Errorf("member: %w", err)
	}
	return store, nil
}

// noRespondersWait is the first pause before a records write that found
// no responders is sent again, doubled each time up to noRespondersMax;
// the write fails with the error after noRespondersTries: about 3 s of
// waiting.
const (
	noRespondersWait  = 25 * time.Millisecond
	noRespondersMax   = 2 * time.Second
	noRespondersTries = 8
)

func manifestOf(run, checkpoint string, m events.Member, records []events.Record, sum []byte, size int64) (events.MemberManifest, error) {
	man := events.MemberManifest{
		Schema:       events.ManifestSchema,
		Run:          run,
		CheckpointID: checkpoint,
		Member:       m,
		Object:       events.RecordsObject(run, checkpoint, m, hex.EncodeToString(sum)),
		SHA256:       hex.EncodeToString(sum),
		Count:        len(records),
		Size:         size,
		Episodes:     episodesOf(records),
	}
	if err := man.Validate(); err != nil {
		return events.MemberManifest{}, fmt.Errorf("member: manifest: %w", err)
	}
	return man, nil
}

// HasObjects reports whether any records object of member m in checkpoint
// is in store (whatever its digest): a stopped write must leave none.
func HasObjects(ctx context.Context, store natsjs.ObjectStore, run, checkpoint string, m events.Member) (bool, error) {
	infos, err := store.List(ctx)
	if errors.Is(err, natsjs.ErrNoObjectsFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	prefix := events.RecordsPrefix(run, checkpoint, m)
	for _, o := range infos {
		if strings.HasPrefix(o.Name, prefix) {
			return true, nil
		}
	}
	return false, nil
}

// CreateManifest creates man in kv at events.MemberManifestKey, with
// Create, never Put: a manifest is written once. If the key already holds
// the same manifest (a redelivered commit), that is success; a different
// one returns ErrManifestExists. It is how members of schema-1 runs
// recorded their manifest; members of schema-2 runs do not call it (their
// commit ack records it, PROTOCOL-HISTORY §35), and it stays for making
// schema-1 runs in tests.
func CreateManifest(ctx context.Context, kv natsjs.KeyValue, man events.MemberManifest) error {
	if err := man.Validate(); err != nil {
		return fmt.Errorf("member: manifest: %w", err)
	}
	key := events.MemberManifestKey(man.Run, man.CheckpointID, man.Member)
	b, err := json.Marshal(man)
	if err != nil {
		return fmt.Errorf("member: manifest %s: %w", key, err)
	}
	_, err = kv.Create(ctx, key, b)
	if err == nil {
		return nil
	}
	if !errors.Is(err, natsjs.ErrKeyExists) {
		return fmt.Errorf("member: create manifest %s: %w", key, err)
	}
	have, gerr := GetManifest(ctx, kv, man.Run, man.CheckpointID, man.Member)
	if gerr != nil {
		return fmt.Errorf("member: create manifest %s: exists, and reading it: %w", key, gerr)
	}
	if diff := manifestDiff(have, man); diff != "" {
		return fmt.Errorf("%w: %s: %s", ErrManifestExists, key, diff)
	}
	return nil
}

// GetManifest reads and validates the member manifest key of a schema-1
// checkpoint; ErrNoManifest if there is none.
func GetManifest(ctx context.Context, kv natsjs.KeyValue, run, checkpoint string, m events.Member) (events.MemberManifest, error) {
	key := events.MemberManifestKey(run, checkpoint, m)
	e, err := kv.Get(ctx, key)
	if errors.Is(err, natsjs.ErrKeyNotFound) {
		return events.MemberManifest{}, fmt.Errorf("%w: %s", ErrNoManifest, key)
	}
	if err != nil {
		return events.MemberManifest{}, fmt.Errorf("member: read manifest %s: %w", key, err)
	}
	var man events.MemberManifest
	if err := json.Unmarshal(e.Value(), &man); err != nil {
		return events.MemberManifest{}, fmt.Errorf("%w: manifest %s: %v", ErrCorruptRecords, key, err)
	}
	if err := man.Validate(); err != nil {
		return events.MemberManifest{}, fmt.Errorf("%w: manifest %s: %w", ErrCorruptRecords, key, err)
	}
	if man.Run != run || man.CheckpointID != checkpoint || man.Member != m {
		return events.MemberManifest{}, fmt.Errorf("%w: manifest %s names %s/%s/%s", ErrCorruptRecords, key, man.Run, man.CheckpointID, man.Member)
	}
	return man, nil
}

// manifestDiff names the fields in which two manifests differ, "" if none.
func manifestDiff(have, want events.MemberManifest) string {
	var d []string
	if have.Schema != want.Schema {
		d = append(d, fmt.Sprintf("schema %d, want %d", have.Schema, want.Schema))
	}
	if have.Object != want.Object {
		d = append(d, fmt.Sprintf("object %s, want %s", have.Object, want.Object))
	}
	if have.SHA256 != want.SHA256 {
		d = append(d, fmt.Sprintf("sha256 %s, want %s", have.SHA256, want.SHA256))
	}
	if have.Count != want.Count {
		d = append(d, fmt.Sprintf("count %d, want %d", have.Count, want.Count))
	}
	if have.Size != want.Size {
		d = append(d, fmt.Sprintf("size %d, want %d", have.Size, want.Size))
	}
	if !slices.Equal(have.Episodes, want.Episodes) {
		d = append(d, fmt.Sprintf("episodes %v, want %v", have.Episodes, want.Episodes))
	}
	return strings.Join(d, "; ")
}

// ReadRecords finds the member manifest of m in checkpoint (FindManifest),
// then reads the object it names in the store it names (its Bucket,
// opened through bus.JS; BucketRecords when it names none), and verifies
// size, sha256 and count over the whole object; it returns the manifest
// and the records keep accepts (all when keep is nil). Any difference
// returns ErrCorruptRecords naming each one, and no records. No manifest
// returns ErrNoManifest. A manifest of no records names no object and
// reads as empty.
func ReadRecords(ctx context.Context, bus *jetstream.Bus, run, checkpoint string, m events.Member,
	keep func(events.Record) bool) (events.MemberManifest, []events.Record, error) {
	return readRecords(ctx, bus, run, checkpoint, m, 0, false, keep)
}

// ReadRecordsAt is ReadRecords from m's commit ack of commitSeq when it is
// known (a restore names it; 0: unknown), else from the checkpoint
// manifest (FindManifest).
func ReadRecordsAt(ctx context.Context, bus *jetstream.Bus, run, checkpoint string, m events.Member, commitSeq uint64,
	keep func(events.Record) bool) (events.MemberManifest, []events.Record, error) {
	return readRecords(ctx, bus, run, checkpoint, m, commitSeq, false, keep)
}

// readRecords is ReadRecordsAt; acksKept is a restore's SourceAcks: a
// missing commit ack then means no manifest (findManifest).
func readRecords(ctx context.Context, bus *jetstream.Bus, run, checkpoint string, m events.Member, commitSeq uint64, acksKept bool,
	keep func(events.Record) bool) (events.MemberManifest, []events.Record, error) {
	man, err := findManifest(ctx, bus, run, checkpoint, m, commitSeq, acksKept)
	if err != nil {
		return events.MemberManifest{}, nil, err
	}
	var stores ObjectStores
	if bus.JS != nil {
		stores = bus.JS
	}
	return readObject(ctx, stores, run, checkpoint, m, man, keep)
}

// readObject reads and verifies the records object man names.
func readObject(ctx context.Context, stores ObjectStores, run, checkpoint string, m events.Member, man events.MemberManifest,
	keep func(events.Record) bool) (events.MemberManifest, []events.Record, error) {
	if man.Count == 0 && man.Size == 0 {
		// An empty export has no object; its digest must be that of no bytes.
		if empty, _ := Digest(run, checkpoint, m, nil); man.SHA256 != empty.SHA256 {
			return man, nil, fmt.Errorf("%w: %s: count 0 and size 0 but sha256 %s", ErrCorruptRecords, man.Object, man.SHA256)
		}
		return man, nil, nil
	}
	bucket := man.Bucket
	if bucket == "" {
		bucket = jetstream.BucketRecords
	}
	if stores == nil {
		return man, nil, fmt.Errorf("member: read %s: no JetStream to open store %s with", man.Object, bucket)
	}
	store, err := stores.ObjectStore(ctx, bucket)
	if errors.Is(err, natsjs.ErrBucketNotFound) {
		return man, nil, fmt.Errorf("%w: %s: its store %s is missing", ErrCorruptRecords, man.Object, bucket)
	}
	if err != nil {
		return man, nil, fmt.Errorf("member: read %s: store %s: %w", man.Object, bucket, err)
	}
	obj, err := store.Get(ctx, man.Object)
	if errors.Is(err, natsjs.ErrObjectNotFound) {
		return man, nil, fmt.Errorf("%w: %s: the object is missing", ErrCorruptRecords, man.Object)
	}
	if err != nil {
		return man, nil, fmt.Errorf("member: read %s: %w", man.Object, err)
	}
	defer obj.Close()

	sc := scanRecords(obj, keep)
	kept, count, size, sum, bad, readErr := sc.kept, sc.count, sc.size, sc.sha256, sc.bad, sc.err
	var diffs []string
	if readErr != nil {
		if errors.Is(readErr, natsjs.ErrDigestMismatch) {
			diffs = append(diffs, "the object store's own digest does not match its chunks")
		} else {
			return man, nil, fmt.Errorf("member: read %s: %w", man.Object, readErr)
		}
	}
	if size != man.Size {
		diffs = append(diffs, fmt.Sprintf("size %d, manifest says %d", size, man.Size))
	}
	if sum != man.SHA256 {
		diffs = append(diffs, fmt.Sprintf("sha256 %s, manifest says %s", sum, man.SHA256))
	}
	if count != man.Count {
		diffs = append(diffs, fmt.Sprintf("count %d, manifest says %d", count, man.Count))
	}
	if bad != "" {
		diffs = append(diffs, bad)
	}
	if len(diffs) > 0 {
		return man, nil, fmt.Errorf("%w: %s: %s", ErrCorruptRecords, man.Object, strings.Join(diffs, "; "))
	}
	return man, kept, nil
}

// recordScan is what scanRecords read of a records object.
type recordScan struct {
	// kept are the records keep kept, in order.
	kept []events.Record
	// count is the number of whole lines, size the bytes read, sha256 their
	// digest (hex).
	count  int
	size   int64
	sha256 string
	// bad describes the first line that is not a record ("" when none).
	bad string
	// err is a read error, the end of the object aside.
	err error
}

// scanRecords reads a records object, one JSON record per line, hashing
// every byte it reads. It never stops at a bad line: the counts and the
// digest cover the whole object, so that the caller can say every way it
// differs from its manifest.
func scanRecords(rd io.Reader, keep func(events.Record) bool) recordScan {
	h := sha256.New()
	br := bufio.NewReaderSize(rd, 64<<10)
	var sc recordScan
	for {
		line, err := br.ReadBytes('\n')
		h.Write(line)
		sc.size += int64(len(line))
		if len(line) > 0 {
			if line[len(line)-1] != '\n' {
				if sc.bad == "" {
					sc.bad = fmt.Sprintf("the object does not end with a newline (%d bytes after the last one)", len(line))
				}
			} else {
				sc.count++
				var r events.Record
				switch derr := json.Unmarshal(line, &r); {
				case derr != nil && sc.bad == "":
					sc.bad = fmt.Sprintf("line %d is not a record: %v", sc.count, derr)
				case derr == nil && r.Key == "" && sc.bad == "":
					sc.bad = fmt.Sprintf("line %d has no key", sc.count)
				case derr == nil && r.Key != "" && (keep == nil || keep(r)):
					sc.kept = append(sc.kept, r)
				}
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			sc.err = err
			break
		}
	}
	sc.sha256 = hex.EncodeToString(h.Sum(nil))
	return sc
}
