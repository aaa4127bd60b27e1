package member_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/stillpoint/stillpoint/events"
	"github.com/stillpoint/stillpoint/jetstream"
	"github.com/stillpoint/stillpoint/jetstream/jstest"
	"github.com/stillpoint/stillpoint/participants/member"
)

func records(n, size int) []events.Record {
	var out []events.Record
	for i := range n {
		b, _ := json.Marshal(map[string]any{"i": i, "pad": strings.Repeat("x", size)})
		out = append(out, events.Record{Key: fmt.Sprintf("r%d", i), Data: b})
	}
	return out
}

// PROTOCOL §3 sp_records: records round-trip, digest and count verified,
// across object chunks.
func TestRecordsRoundTrip(t *testing.T) {
	env := jstest.Start(t)
	recs := append(records(40, 10_000), events.Record{Key: "snap-not-an-episode!", Data: json.RawMessage(`{"a": [1, 2]}`)})
	man, err := member.WriteRecords(t.Context(), env.Bus.Records, "run1", "c1", self, recs)
	if err != nil {
		t.Fatal(err)
	}
	if man.Count != len(recs) || len(man.Episodes) != 40 || man.Object != events.RecordsObject("run1", "c1", self, man.SHA256) || !strings.HasPrefix(man.Object, "run1/c1/agent.a.") {
		t.Fatalf("manifest %+v", man)
	}
	if d, err := member.Digest("run1", "c1", self, recs); err != nil || d.SHA256 != man.SHA256 || d.Size != man.Size {
		t.Fatalf("Digest %+v, %v; want %+v", d, err, man)
	}
	if err := member.CreateManifest(t.Context(), env.Bus.Manifests, man); err != nil {
		t.Fatal(err)
	}
	if err := member.CreateManifest(t.Context(), env.Bus.Manifests, man); err != nil {
		t.Fatalf("create of the same manifest again: %v", err)
	}
	other := man
	other.Count++
	if err := member.CreateManifest(t.Context(), env.Bus.Manifests, other); !errors.Is(err, member.ErrManifestExists) || !strings.Contains(err.Error(), "count") {
		t.Fatalf("create of another manifest: %v, want ErrManifestExists naming count", err)
	}
	got, all, err := member.ReadRecords(t.Context(), env.Bus, "run1", "c1", self, nil)
	if err != nil || len(all) != len(recs) || got.SHA256 != man.SHA256 {
		t.Fatalf("ReadRecords: %v, %d records", err, len(all))
	}
	if string(all[40].Data) != `{"a":[1,2]}` {
		t.Fatalf("data %s, want it compacted", all[40].Data)
	}
	_, some, err := member.ReadRecords(t.Context(), env.Bus, "run1", "c1", self,
		func(r events.Record) bool { return r.Key == "r3" })
	if err != nil || len(some) != 1 || some[0].Key != "r3" {
		t.Fatalf("filtered read: %v, %v", err, some)
	}
	if _, _, err := member.ReadRecords(t.Context(), env.Bus, "run1", "c2", self, nil); !errors.Is(err, member.ErrNoManifest) {
		t.Fatalf("read without manifest: %v", err)
	}
}

// PROTOCOL §3: readers verify sha256 and count, and name what differs.
func TestRecordsCorrupt(t *testing.T) {
	env := jstest.Start(t)
	recs := records(3, 10)
	man, err := member.WriteRecords(t.Context(), env.Bus.Records, "run1", "c1", self, recs)
	if err != nil {
		t.Fatal(err)
	}
	if err := member.CreateManifest(t.Context(), env.Bus.Manifests, man); err != nil {
		t.Fatal(err)
	}
	good, err := env.Bus.Records.GetBytes(t.Context(), man.Object)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(good), "\n")
	for _, c := range []struct {
		name, data string
		names      []string
	}{
		{"a byte flipped", strings.Replace(string(good), `"i":1`, `"i":7`, 1), []string{"sha256"}},
		{"a record dropped", lines[0] + lines[1], []string{"size", "sha256", "count"}},
		{"garbage line", string(good[:len(good)-1]) + "x\nnot json\n", []string{"count", "line 3 is not a record"}},
		{"no final newline", string(good[:len(good)-1]), []string{"newline"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := env.Bus.Records.PutBytes(t.Context(), man.Object, []byte(c.data)); err != nil {
				t.Fatal(err)
			}
			_, recs, err := member.ReadRecords(t.Context(), env.Bus, "run1", "c1", self, nil)
			if !errors.Is(err, member.ErrCorruptRecords) || recs != nil {
				t.Fatalf("ReadRecords: %v, %d records; want ErrCorruptRecords and none", err, len(recs))
			}
			for _, n := range c.names {
				if !strings.Contains(err.Error(), n) {
					t.Errorf("error %q does not name %s", err, n)
				}
			}
		})
	}
	if err := env.Bus.Records.Delete(t.Context(), man.Object); err != nil {
		t.Fatal(err)
	}
	if _, _, err := member.ReadRecords(t.Context(), env.Bus, "run1", "c1", self, nil); !errors.Is(err, member.ErrCorruptRecords) {
		t.Fatalf("object gone: %v", err)
	}
}

// PROTOCOL §5: a stopped write stops before its next record and leaves no
// object behind.
func TestRecordsWriteStops(t *testing.T) {
	env := jstest.Start(t)
	ctx, cancel := context.WithCancel(t.Context())
	var seen []int
	_, err := member.WriteRecordsPaced(ctx, env.Bus.Records, "run1", "c1", self, records(10, 50_000), func(i int) {
		seen = append(seen, i)
		if i == 5 {
			cancel()
		}
	})
	if !errors.Is(err, member.ErrWriteStopped) || !strings.Contains(err.Error(), "before record 5") {
		t.Fatalf("WriteRecords: %v, want ErrWriteStopped before record 5", err)
	}
	if !slices.Equal(seen, []int{0, 1, 2, 3, 4, 5}) {
		t.Fatalf("hook saw %v", seen)
	}
	if has, err := member.HasObjects(t.Context(), env.Bus.Records, "run1", "c1", self); has || err != nil {
		t.Fatalf("object after a stopped write: %v %v", has, err)
	}
	info, err := env.JS.Stream(t.Context(), "OBJ_sp_records")
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != 0 {
		t.Fatalf("%d chunks left in the store", n)
	}
}

// A records write that finds no responders (on a cluster, the servers
// learn of a new store's stream, and of a leader that moved, a moment
// after it has a leader) is sent again until the store takes it, and
// fails naming the cause when it never does.
func TestRecordsWriteWithNoRespondersIsSentAgain(t *testing.T) {
	env := jstest.Start(t)
	const stream = "OBJ_" + jetstream.BucketRecords
	s, err := env.JS.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if err := env.JS.DeleteStream(t.Context(), stream); err != nil {
		t.Fatal(err)
	}
	recs := records(3, 100)
	var tries []int
	man, err := member.WriteRecordsNoResponders(t.Context(), env.Bus.Records, "run1", "c1", self, recs, func(try int) {
		tries = append(tries, try)
		if try == 2 {
			if _, err := env.JS.CreateStream(t.Context(), cfg); err != nil {
				t.Error(err)
			}
		}
	})
	if err != nil {
		t.Fatalf("write once the store is back: %v", err)
	}
	if !slices.Equal(tries, []int{1, 2}) {
		t.Fatalf("no responders on tries %v, want 1 and 2", tries)
	}
	if err := member.CreateManifest(t.Context(), env.Bus.Manifests, man); err != nil {
		t.Fatal(err)
	}
	if _, all, err := member.ReadRecords(t.Context(), env.Bus, "run1", "c1", self, nil); err != nil || len(all) != len(recs) {
		t.Fatalf("read back: %v, %d records, want %d", err, len(all), len(recs))
	}

	if err := env.JS.DeleteStream(t.Context(), stream); err != nil {
		t.Fatal(err)
	}
	tries = nil
	_, err = member.WriteRecordsNoResponders(t.Context(), env.Bus.Records, "run1", "c2", self, recs, func(try int) { tries = append(tries, try) })
	if !errors.Is(err, nats.ErrNoResponders) || !strings.Contains(err.Error(), "run1/c2/agent.a.") {
		t.Fatalf("write to a store that never comes back: %v, want no responders naming the object", err)
	}
	if len(tries) < 5 {
		t.Fatalf("gave up after %d tries", len(tries))
	}
}

func TestRecordsBad(t *testing.T) {
	env := jstest.Start(t)
	for _, r := range []events.Record{{Key: ""}, {Key: strings.Repeat("k", 300)}, {Key: "r1", Data: json.RawMessage(`{bad`)}} {
		if _, err := member.WriteRecords(t.Context(), env.Bus.Records, "run1", "c1", self, []events.Record{r}); !errors.Is(err, member.ErrBadRecord) {
			t.Errorf("record %.20q: %v, want ErrBadRecord", r.Key, err)
		}
	}
	man, err := member.WriteRecords(t.Context(), env.Bus.Records, "run1", "c1", self, nil)
	if err != nil || man.Count != 0 || man.Size != 0 {
		t.Fatalf("empty write: %+v, %v", man, err)
	}
}

// An empty export writes no object: the manifest alone says "nothing", and
// a manifest that claims no records with another digest is refused.
func TestRecordsEmptyExportHasNoObject(t *testing.T) {
	env := jstest.Start(t)
	man, err := member.WriteRecords(t.Context(), env.Bus.Records, "run1", "c1", self, nil)
	if err != nil {
		t.Fatal(err)
	}
	if man.Count != 0 || man.Size != 0 || man.SHA256 != "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855" {
		t.Fatalf("manifest %+v", man)
	}
	if _, err := env.Bus.Records.GetInfo(t.Context(), man.Object); !errors.Is(err, natsjs.ErrObjectNotFound) {
		t.Fatalf("an empty export wrote an object: %v", err)
	}
	if err := member.CreateManifest(t.Context(), env.Bus.Manifests, man); err != nil {
		t.Fatal(err)
	}
	if _, recs, err := member.ReadRecords(t.Context(), env.Bus, "run1", "c1", self, nil); err != nil || len(recs) != 0 {
		t.Fatalf("ReadRecords of an empty export: %d records, %v", len(recs), err)
	}
	forged := man
	forged.CheckpointID, forged.SHA256 = "c2", strings.Repeat("ab", 32)
	forged.Object = events.RecordsObject("run1", "c2", self, forged.SHA256)
	if err := member.CreateManifest(t.Context(), env.Bus.Manifests, forged); err != nil {
		t.Fatal(err)
	}
	if _, _, err := member.ReadRecords(t.Context(), env.Bus, "run1", "c2", self, nil); !errors.Is(err, member.ErrCorruptRecords) {
		t.Fatalf("an empty manifest with a wrong digest: %v, want ErrCorruptRecords", err)
	}
}

// PROTOCOL §5: a commit takes its export one record at a time, hashing as
// it goes; a stop before a record ends it there and keeps nothing, and an
// export that fails or yields a bad record fails it.
func TestTakeExport(t *testing.T) {
	recs := records(6, 10)
	all := member.Records(recs, nil)
	got, man, err := member.TakeExport(t.Context(), "run1", "c1", self, all)
	if err != nil || len(got) != 6 {
		t.Fatalf("TakeExport: %d records, %v", len(got), err)
	}
	if want, _ := member.Digest("run1", "c1", self, recs); man.SHA256 != want.SHA256 || man.Count != 6 {
		t.Fatalf("manifest %+v, want %+v", man, want)
	}

	ctx, cancel := context.WithCancel(t.Context())
	var pulled []int
	got, _, err = member.TakeExport(ctx, "run1", "c1", self, func(yield func(events.Record, error) bool) {
		for i, r := range recs {
			pulled = append(pulled, i)
			if i == 3 {
				cancel() // the resume arrives while record 3 is produced
			}
			if !yield(r, nil) {
				return
			}
		}
	})
	if !errors.Is(err, member.ErrWriteStopped) || !strings.Contains(err.Error(), "before record 3") || got != nil {
		t.Fatalf("TakeExport: %d records, %v; want ErrWriteStopped before record 3 and none", len(got), err)
	}
	if !slices.Equal(pulled, []int{0, 1, 2, 3}) {
		t.Fatalf("the export was asked for %v after the stop", pulled)
	}

	if _, _, err := member.TakeExport(t.Context(), "run1", "c1", self, member.Records(nil, member.ErrBadRecord)); !errors.Is(err, member.ErrBadRecord) {
		t.Fatalf("a failed export: %v", err)
	}
	bad := member.Records([]events.Record{recs[0], {Key: ""}}, nil)
	if _, _, err := member.TakeExport(t.Context(), "run1", "c1", self, bad); !errors.Is(err, member.ErrBadRecord) || !strings.Contains(err.Error(), "record 1") {
		t.Fatalf("a bad record: %v", err)
	}
	if got, man, err := member.TakeExport(t.Context(), "run1", "c1", self, nil); err != nil || len(got) != 0 || man.Count != 0 {
		t.Fatalf("no export: %d records, %+v, %v", len(got), man, err)
	}
}
